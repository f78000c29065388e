// Composites: common functions built only from Prims, so they differentiate through the
// Prims' VJP rules, and the fusion passes fuse them (fuse_rows makes a softmax, a layernorm or a
// cross-entropy one row kernel on the GPU). Shape contracts in each comment.
#pragma once

#include <kiln/circuit/prims/builder.hpp>

namespace kiln::composite {

// x: (..., n) -> (..., n); softmax over the last axis (max subtracted, gradient-free).
ValueId softmax(Builder& b, ValueId x);
// x: (..., n) -> (..., n); log of softmax over the last axis.
ValueId log_softmax(Builder& b, ValueId x);
// x: (..., C), weight, bias: (C) -> (..., C); normalized over the last axis.
ValueId layernorm(Builder& b, ValueId x, ValueId weight, ValueId bias, double eps = 1e-5);
// logits: (..., V) float, targets: i32 (...) -> () mean negative log-likelihood.
ValueId cross_entropy(Builder& b, ValueId logits, ValueId targets);
// -> i32 (T, T), 1 where column <= row (a query attends to itself and the past).
ValueId causal_mask(Builder& b, int64_t t);
// scores: (..., T, T) -> same, with future positions set to -inf before a softmax.
ValueId apply_causal_mask(Builder& b, ValueId scores);
// x -> x * mask / (1 - p) with mask ~ Bernoulli(1 - p) from (key, offset).
ValueId dropout(Builder& b, ValueId x, double p, ValueId key, ValueId offset);

}  // namespace kiln::composite
