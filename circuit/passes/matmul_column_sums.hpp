// matmul_column_sums: a GPU pass that sums a matmul epilogue's columns where the product is made.
// A linear layer's bias gradient is the column sums of dY over the tokens; where dY is a
// fused_matmul epilogue read by nothing else (GPT-2's MLP: the GELU gradient of the c_proj input
// gradient, 8192 x 3072 floats a layer), the matmul kernel wrote it in f32 only for the sums to
// read it back. With this pass it writes sums over 128-row blocks instead
// (FusedMatmul::block_sums), and the column sums add those.
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln {

// A column_sums of one plain sum (body in0) over an f32 fused_matmul epilogue stored in the
// logical layout (batch..., m, n) becomes the column sums of the matmul's block sums of that
// epilogue's body (the first such column_sums of each matmul); the epilogue's output is dropped
// where nothing else reads it, it is not requested and it is not the op's only epilogue. The sums are the same up to
// the order of the additions. Run after fuse_columns, fuse_matmul and absorb_casts (which moves the matmul operands'
// reads to the bf16 copies).
Circuit matmul_column_sums(const Circuit& c, std::vector<ValueId>& outputs);

}  // namespace kiln
