// The program of a `fused_matmul` op: a batched matrix product whose operands are read in place
// through strided views (the permutes, slices and splits in front of a matmul become
// addressing), with an elementwise prologue per operand and elementwise epilogues (bias, GELU,
// residual add, GELU backward, ...) applied to the accumulator before it is stored. The matmul
// fusion pass (circuit/passes/fuse_matmul.cpp) builds it; the Eigen reference computes the product
// and then the epilogues; cuda/lower/matmul.cpp lowers it (and a plain matmul, as the program
// `plain` describes) to one tiled kernel.
//
// Logical domain: (batch..., m, n) with out = sum over k of A(batch, m, k) * B(batch, n, k).
// Op inputs: a's base, b's base, then the epilogues' extra inputs. An operand element
// (batch..., row, k) is prologue(base[offset + sum batch_i * batch[i] + row * row_stride +
// k * k_stride]) (b's rows are n). Every output has shape `out_shape`; the element for logical
// (batch..., m, n) sits at sum batch_i * out_batch[i] + m * out_row + n * out_col (a
// permutation of out_shape's elements). Epilogue r computes output r from in0 = the
// accumulated sum and in(1 + j) = extra input j, broadcast (numpy) to the logical domain.
// With `a_row_sums`, one more output (last, shape `row_sums_shape`, batch * m elements in
// (batch..., m) order) holds sum over k of prologue(A(batch, m, k)): a linear layer's bias
// gradient, which is the row sum of the weight-gradient product's A operand (dY^T).
// With `block_sums` (not with a_row_sums), one more output (last) of shape (batch..., ceil(m /
// kBlockSumRows), n) holds at (batch, i, j) the sum over rows m in [kBlockSumRows i, kBlockSumRows
// (i + 1)) of block_sums_body at (batch, m, j), read as the epilogues are: a bias gradient (the
// column sums of an epilogue) summed where the product is made, 128 rows at a time, so that the
// epilogue itself need not be stored (matmul_column_sums).
#pragma once

#include <string>
#include <vector>

#include <kiln/circuit/prims/builder.hpp>

namespace kiln {

struct MatmulOperand {
  int64_t offset = 0;
  std::vector<int64_t> batch;  // one stride per logical batch dim; 0 where the operand broadcasts
  int64_t row_stride = 0, k_stride = 0;
  ScalarExp prologue = se::in(0);  // applied to each element read; in0 itself when none
};

struct FusedMatmul {
  std::vector<int64_t> batch;  // logical batch dims
  int64_t m = 0, n = 0, k = 0;
  MatmulOperand a, b;
  int extras = 0;
  std::vector<ScalarExp> epilogues = {se::in(0)};
  // Per epilogue: stored as bf16 (rounded to nearest even, as a cast would; absorb_casts), else in
  // the op's dtype. Empty: none. bf16 outputs need an f32 op.
  std::vector<bool> epilogue_bf16;
  bool stored_bf16(size_t r) const { return r < epilogue_bf16.size() && epilogue_bf16[r]; }
  Shape out_shape;
  std::vector<int64_t> out_batch;
  int64_t out_row = 0, out_col = 0;
  bool a_row_sums = false;
  Shape row_sums_shape;
  bool block_sums = false;
  ScalarExp block_sums_body = se::in(0);
  static constexpr int64_t kBlockSumRows = 128;
  Shape block_sums_shape() const;  // (batch..., ceil(m / kBlockSumRows), n)

  Shape logical() const;  // (batch..., m, n)
  // The program of matmul(a, b, ta, tb) on inputs of these shapes (shapes already checked).
  static FusedMatmul plain(const Shape& a, const Shape& b, bool ta, bool tb);
  Params to_params(DType dtype) const;
  static FusedMatmul from_params(const Params& p);  // throws kiln::Error on malformed params
  std::string describe() const;
};

}  // namespace kiln
