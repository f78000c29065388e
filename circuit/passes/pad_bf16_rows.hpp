// pad_bf16_rows: a layout pass for the GPU's bf16 mma matmul kernel, which copies its operands
// to shared memory in 16-byte chunks (cuda/lower/matmul_mma_loop.cpp) and so needs every row of a
// stored bf16 operand to start on a 16-byte boundary (a row length that is a multiple of 8).
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

// Each cast to bf16 of a value (..., n) with n not a multiple of 8 (GPT-2's logits' gradient:
// n = 50257), whose readers are all matmuls, is written padded: the cast, then concat with
// zeros (a fill cast to bf16) to (..., round_up(n, 8)), then a slice back to (..., n) that
// fuse_matmul folds into the matmuls' views (rows 16-byte aligned, the padding never read).
// An input or persistent buffer stored in bf16 with such rows, which only matmuls read and use
// 64 times an element or more (x W's W over 64 rows of x or more), is copied the same way (the
// concat is then a kernel of its own: one pass over the operand).
// Changes nothing where the Target's matmul policy has no bf16 mma kernel; the pipeline skips it
// where fuse_matmul is off (nothing would fold the slices: the padding would only add kernels). A
// requested output is left as it is, and so is a value that anything but a matmul (or a
// reshape keeping the last dim that only matmuls read) reads. Run before fuse_matmul.
Circuit pad_bf16_rows(const Circuit& c, std::vector<ValueId>& outputs, const Target& target);

}  // namespace kiln
