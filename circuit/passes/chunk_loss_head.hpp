// chunk_loss_head: a CPU pass that runs a language model's head, its loss and the head's backward
// products chunk by chunk of sequences, so that the whole batch's logits never exist at once.
//
// GPT-2 small's logits are 8 x 1024 x 50257 floats (1570 MiB), and so are their gradient and the
// loss's [B, T, V] temporaries: one of them is live at the step's peak whatever else is
// recomputed. The pass runs on the unfused step (after CSE, before recompute and fusion):
//   logits = matmul(h [B, T, C], W [V, C], tb)
//   S: the ops the logits reach (max, exp, sums, log, gather_last, the gradient's pointwise ops),
//      with the [B, T, V] producers only S reads (the one-hot select of the targets), every one
//      computed sequence by sequence (pointwise, a reduce over another axis than the batch's,
//      broadcast and reshape keeping the leading B, cast, stop_gradient, gather_last);
//   dh = matmul(d, W) and dW = matmul(reshape(d) [B*T, V], reshape(h) [B*T, C], ta), d in S.
// Each chunk of sequences runs the product, S and both products over slices of h and of S's
// inputs with a leading B; dh and the values of S read outside it (the per-token losses the mean
// reads) are concatenated along B, dW summed over the chunks. Fusion then fuses each chunk's loss
// ops into one row op. The FLOPs are unchanged; dW's sum over the tokens is added in another order
// (chunk by chunk), so the step changes in its last bits.
#pragma once

#include <cstddef>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

// An f32 head whose logits exceed `max_chunk_bytes` is split into chunks of whole sequences of
// at most that size (one sequence at least); bf16 heads, smaller ones, GPU targets and steps not
// of this form are left as they are.
Circuit chunk_loss_head(const Circuit& c, std::vector<ValueId>& outputs, const Target& target,
                        size_t max_chunk_bytes = size_t{256} << 20);

}  // namespace kiln
