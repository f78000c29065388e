// Fusion passes: Circuit -> Circuit rewrites that merge ops into fewer, larger ones, so that the
// Eigen executor makes fewer passes over memory and the GPU back end launches fewer kernels.
// Legality (DESIGN.md): a producer is absorbed only into its single consumer, only when its
// result is not protected (a requested output, an external, or a value something else reads,
// such as a saved activation), and only when both compute over the same index domain.
#pragma once

#include <string>
#include <vector>

#include "circuit/circuit.hpp"

namespace kiln {

// Chains and trees of pointwise ops become one pointwise op whose body composes theirs: a
// pointwise producer whose result only one pointwise consumer reads, with the consumer's
// output shape, is substituted into the consumer's body (its inputs join the consumer's,
// broadcast as before). Iterates to a fixpoint in one topological sweep; deterministic.
// `outputs` are rewritten to their ids in the result.
Circuit fuse_pointwise(const Circuit& c, std::vector<ValueId>& outputs);

// The passes KILN_DISABLE_PASSES (comma-separated names, e.g. "fuse_pointwise,cse") switches
// off, for debugging; read once per call.
bool pass_enabled(const std::string& name);

}  // namespace kiln
