// User Prims in a plan (core/user_prim.hpp). Every plan forwards a composite's input 0 (its
// forward value: the composite op only carries its VJP rule to the reverse sweep, which has run).
// A plan for the GPU replaces each other user op with a pointwise op of its pointwise body or a
// fused_rows op of its row body, which the fusion passes then treat as kiln's own, or keeps it
// for its own kernels (lowered by the function given to cuda::register_user_lowering); a user
// Prim with none of these makes the plan an error naming it and where it was registered. CPU
// plans run user Prims' references.
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

// Not switchable: a GPU plan cannot lower a user op any other way. `outputs` are rewritten.
Circuit expand_user_prims(const Circuit& c, std::vector<ValueId>& outputs, const Target& target);

}  // namespace kiln
