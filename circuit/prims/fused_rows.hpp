// The program of a `fused_rows` op: what the row fusion pass (circuit/passes/fuse_rows.cpp)
// builds, the Eigen reference runs and cuda/lower/fused_rows.cpp lowers to one kernel.
//
// The op computes over a domain (rows..., n). Its inputs broadcast to the domain (numpy rules).
// Reductions r_0, r_1, ... run in order along the last axis: r_j = kind_j over the row of
// body_j, where a body reads in_k (op input k at the element) for k < inputs and
// in_{inputs + i} (reduction i < j of the element's row). Then each output is written: a row
// output has the domain's shape (rows..., n + its padding, the padding's columns 0), a per-row
// output the shape (rows..., 1) and a body that reads only per-row values (reductions and
// inputs that do not vary along the row).
// Intermediates of the rows are never written to memory: the GPU kernel and the CPU reference
// for long rows recompute them in each phase; the CPU reference for rows that fit a block
// computes each once per chunk of rows (circuit/prims/row_chunks.hpp).
#pragma once

#include <vector>

#include <kiln/circuit/prims/builder.hpp>

namespace kiln {

struct RowProgram {
  int inputs = 0;  // of the op; reductions are read as in_{inputs + i}
  Shape domain;    // (rows..., n), rank >= 1
  std::vector<ReduceKind> reduction_kinds;
  std::vector<ScalarExp> reduction_bodies;
  std::vector<bool> output_per_row;  // false: domain shape; true: (rows..., 1)
  std::vector<ScalarExp> output_bodies;
  // Per output: stored as bf16 (its body's value rounded to nearest even, as a cast would: the
  // matmul operands of --precision bf16, written by their producer; absorb_casts), else in the
  // op's dtype. Empty: none. bf16 outputs need an f32 op.
  std::vector<bool> output_bf16;
  bool stored_bf16(size_t o) const { return o < output_bf16.size() && output_bf16[o]; }
  // Per row output: zero columns stored after each row's n (a row pitch of n + pad: the 16-byte
  // rows of a bf16 matmul operand, pad_bf16_rows; absorb_padding). Empty: none. Per-row outputs
  // take none.
  std::vector<int64_t> output_pad;
  int64_t padding(size_t o) const { return o < output_pad.size() ? output_pad[o] : 0; }

  int64_t n() const { return domain[domain.rank() - 1]; }
  int64_t rows() const { return row_shape().numel(); }  // rows of length 0 too
  Shape row_shape() const;                              // (rows..., 1)
  Shape padded_domain(size_t o) const;                  // row output o's shape: (rows..., n + padding(o))

  Params to_params(DType dtype) const;
  static RowProgram from_params(const Params& p);  // throws kiln::Error on malformed params
  std::string describe() const;                    // for dumps: r0 = max{in0}, ... ; out0[row] = {...}
};

// True when input `info` takes different values along a row of `domain` (it has the row's
// length on its last axis).
bool varies_along_row(const Shape& input, const Shape& domain);

}  // namespace kiln
