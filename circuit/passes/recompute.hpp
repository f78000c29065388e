// Recomputation: which forward values a training step keeps for its backward and which it
// computes again there. A forward value that a backward op reads ("saved") lives from the forward
// to that read; recomputing it from values kept anyway (or from a block's input) shortens that
// life to the backward's part that reads it, at the cost of doing the work twice.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln {

enum class RecomputeMode : uint8_t {
  none,       // keep every saved value
  automatic,  // "auto": recompute saved values that cost no matmul, attention or reduction
  blocks,     // also recompute each transformer block's work from the block's input
};

// "none", "auto", "blocks"; parse throws kiln::Error naming the choices.
const char* recompute_mode_name(RecomputeMode m);
RecomputeMode parse_recompute_mode(std::string_view text);

// The transformer block an op's scope lies in: the scope up to and including its first numeric
// component ("transformer.h.3.mlp.c_fc" -> "transformer.h.3", "model.layers.0.mlp" ->
// "model.layers.0"), or "" outside any block (embeddings, the final norm, the head).
std::string block_of_scope(const std::string& scope);

// Rewrites a recorded step (ops tagged Phase::Forward, then Backward and Update ops) so that the
// backward reads recomputed copies of saved values:
// - automatic: a saved value whose producer is cheap (pointwise, where, broadcast, reshape,
//   permute, slice, split, concat, cast, stop_gradient, fill, iota, random: no matmul, attention
//   or reduction) and whose inputs are each external, saved and kept, or themselves recomputable
//   that way, is recomputed (not a lone cast of a kept value, which would save only its
//   narrower copy): nothing is kept that was not kept before. GELU's output from its
//   pre-activation, a layer norm's output from its centred input and saved statistics, dropout
//   masks from their Philox counters (the same counters give the same bits).
// - blocks: in the first `checkpointed_blocks` blocks (block_of_scope, in order of appearance;
//   all of them when negative) every saved value is recomputed from values made outside its
//   block (its input) and externals, matmuls and attention included (not collectives or user
//   Prims); a block's outputs are kept (the next block's input). Outside blocks, and in the
//   blocks past the count, as automatic.
// The copies are ops of Phase::Recompute, placed just before the first backward op that reads
// what they make (a value several copies need goes before the first of them); every backward
// read of a recomputed value reads the copy. A value whose copy would read a buffer version
// after an assign has overwritten it stays saved. Requested outputs are never recomputed (they
// live to the end anyway). Run after CSE (which would merge the copies back into the originals).
Circuit recompute(const Circuit& c, std::vector<ValueId>& outputs, RecomputeMode mode, int checkpointed_blocks = -1);

// The number of distinct blocks (block_of_scope) among c's forward ops.
int count_blocks(const Circuit& c);

}  // namespace kiln
