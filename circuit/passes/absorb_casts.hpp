// absorb_casts: a pass of plans that store bf16 values (the GPU's, and the CPU's whose bf16
// products are oneDNN's, CpuBf16Products::onednn) that lets a fused_rows, fused_matmul or
// attention op write the bf16 copy of an output that a cast would otherwise make in a kernel of
// its own (under --precision bf16 the matmul operands: the layer norms' outputs and input
// gradients, the loss's gradient rows, the GELU output and its gradient, the attention output and
// the QKV gradient; the cast read the f32 output back from memory and wrote it again as bf16).
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln {

// Each cast to bf16 of an f32 fused_rows output or fused_matmul epilogue becomes an output of
// that op stored as bf16 (the same body, rounded to nearest even as the cast rounds: the same
// bits). The f32 output stays where anything else reads it or it is requested, and is dropped
// otherwise. An attention or attention_grad op whose main outputs (o; the gradients) are each
// read by such a cast (directly or through a reshape) writes bf16 copies of them
// (AttentionParams::bf16_copies), which the casts become; its f32 outputs stay. Run after
// fuse_attention, fuse_matmul and fuse_rows.
Circuit absorb_casts(const Circuit& c, std::vector<ValueId>& outputs);

}  // namespace kiln
