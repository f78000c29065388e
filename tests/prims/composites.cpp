// The cases of the composites (circuit/prims/composites.cpp): gradients through the Prims they are made of.
#include <kiln/circuit/prims/composites.hpp>

#include "prim_cases.hpp"

namespace kiln::testing {

void composites_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "softmax", {"reduce", "pointwise"}, {F({3, 7}, -2, 2)},
               [](Builder& b, const auto& x) { return composite::softmax(b, x[0]); });
  add_gradient(c, "log_softmax", {"reduce", "pointwise"}, {F({3, 7}, -2, 2)},
               [](Builder& b, const auto& x) { return composite::log_softmax(b, x[0]); });
  add_gradient(c, "layernorm", {"reduce", "pointwise"}, {F({2, 3, 6}), F({6}), F({6})},
               [](Builder& b, const auto& x) { return composite::layernorm(b, x[0], x[1], x[2]); });
  add_gradient(c, "cross_entropy", {"gather_last", "reduce_all"}, {F({4, 9}, -2, 2), I({4}, 9)},
               [](Builder& b, const auto& x) { return composite::cross_entropy(b, x[0], x[1]); });
  add_gradient(c, "causal_softmax", {"where"}, {F({2, 5, 5})},
               [](Builder& b, const auto& x) { return composite::softmax(b, composite::apply_causal_mask(b, x[0])); });
  add_gradient(c, "dropout", {"pointwise"}, {F({4, 6}), I({2}, 1000), I({}, 10)},
               [](Builder& b, const auto& x) { return composite::dropout(b, x[0], 0.25, x[1], x[2]); });
}

}  // namespace kiln::testing
