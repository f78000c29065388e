// The reverse sweep: walks a Circuit's ops backwards from a scalar (or seeded) output, calls
// each Prim's VJP rule, and appends the backward ops to the same Circuit so that backward is
// fused and lowered like forward. The sweep, not the rules, reduces gradients of broadcast
// shape back to each input's shape and sums the contributions of values with several uses.
#pragma once

#include <vector>

#include <kiln/circuit/prims/builder.hpp>

namespace kiln::ad {

// Appends d(output)/d(wrt[i]) for every i and returns their ids (kNoValue where output does
// not depend on wrt[i]). `seed` is the gradient of `output` (same shape and dtype); by
// default a tensor of ones. Differentiating through a Prim without a VJP rule throws
// "no VJP rule for Prim 'x'".
std::vector<ValueId> backward(Builder& b, ValueId output, const std::vector<ValueId>& wrt, ValueId seed = kNoValue);

// Sums or broadcasts g to `shape` (the inverse of numpy broadcasting). Exposed for tests.
ValueId fit_to_shape(Builder& b, ValueId g, const Shape& shape);

}  // namespace kiln::ad
