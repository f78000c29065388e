// Buffer lifetimes of a Circuit run op by op, for executors that give each computed value its
// own buffer except where an op's result aliases one of its inputs (reshape, stop_gradient,
// assign on the GPU): such a value shares the buffer of its root. A buffer dies after the last
// op that reads or writes any value sharing it; requested outputs and assigned contents live to
// the end (contents are committed after the last op); externals are never freed.
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln {

struct Liveness {
  std::vector<ValueId> root;                     // value -> the value whose buffer it uses
  std::vector<std::vector<ValueId>> free_after;  // per op: buffers (roots) dead after it
};

// alias_input[i]: the input whose buffer op i's output 0 uses, or -1 (its own buffer).
Liveness buffer_liveness(const Circuit& c, const std::vector<ValueId>& outputs, const std::vector<int>& alias_input);

}  // namespace kiln
