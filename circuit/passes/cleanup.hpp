// Circuit -> Circuit passes that keep semantics. Each takes the values the caller needs
// (`outputs`) and rewrites them to the ids they have in the returned Circuit.
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln {

// Dead-code elimination: keeps the ops that outputs depend on and every side effect (assign).
Circuit dce(const Circuit& c, std::vector<ValueId>& outputs);

// Common-subexpression elimination: ops with the same Prim, params and inputs are computed
// once (side effects never merge); then DCE drops the duplicates.
Circuit cse(const Circuit& c, std::vector<ValueId>& outputs);

// Rows gathered, or scattered and added, by the index 0, 1, ..., R - 1 over a table or result
// of R rows are the table or the source itself (a position embedding over a full context):
// readers read it directly, no op runs. A gathered buffer that an assign overwrites is read
// directly only when every reader of the gather comes before that assign.
Circuit simplify_row_indexing(const Circuit& c, std::vector<ValueId>& outputs);

// Readers of an assign's result read the value it assigned instead (the same data), so that
// they need not follow the assign and fusion sees through it. An assign's target (input 0, a
// buffer version) is never renamed, nor are the requested outputs.
Circuit forward_assigned_values(const Circuit& c);

// Deterministic mode: every scatter_add_rows asks for its sums in source order (params
// {rows, 1}), so the GPU adds without atomics and gives the same bits run after run (and the
// Eigen reference's bits). The Eigen reference always sums in order.
Circuit ordered_scatter_sums(const Circuit& c, std::vector<ValueId>& outputs);

}  // namespace kiln
