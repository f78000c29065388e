// The cases of reduce and reduce_all (circuit/prims/reduce.cpp, cuda/lower/reduce.cpp).
#include "prim_cases.hpp"

namespace kiln::testing {

void reduce_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  for (int axis : {0, 1, 2})
    add_gradient(c, "reduce_sum_axis" + std::to_string(axis), {"reduce"}, {F({3, 37, 5})},
                 [axis](Builder& b, const auto& x) { return b.reduce(ReduceKind::Sum, x[0], axis); });
  add_gradient(c, "reduce_mean_last", {"reduce"}, {F({4, 33})},
               [](Builder& b, const auto& x) { return b.reduce(ReduceKind::Mean, x[0], -1); });
  add_gradient(c, "reduce_max_middle", {"reduce"}, {F({3, 7, 5})},
               [](Builder& b, const auto& x) { return b.reduce(ReduceKind::Max, x[0], 1); });
  add_gradient(c, "reduce_all_sum", {"reduce_all"}, {F({5, 7})},
               [](Builder& b, const auto& x) { return b.reduce_all(ReduceKind::Sum, x[0]); });
  add_gradient(c, "reduce_all_mean", {"reduce_all"}, {F({5, 7})},
               [](Builder& b, const auto& x) { return b.reduce_all(ReduceKind::Mean, x[0]); });
  // Lowerings (f32 kernels against the Eigen reference).
  for (auto kind : {ReduceKind::Sum, ReduceKind::Max, ReduceKind::Mean}) {
    const std::string k = kind == ReduceKind::Sum ? "sum" : kind == ReduceKind::Max ? "max" : "mean";
    c.lowering.push_back({"reduce_rows_" + k,
                          {f32({7, 1000})},
                          [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce(kind, x[0], 1); },
                          1e-5});
    c.lowering.push_back({"reduce_short_rows_" + k,
                          {f32({45, 33})},
                          [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce(kind, x[0], 1); },
                          1e-5});
    c.lowering.push_back({"reduce_axis0_" + k,
                          {f32({300, 37})},
                          [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce(kind, x[0], 0); },
                          1e-5});
    c.lowering.push_back({"reduce_middle_" + k,
                          {f32({5, 77, 3})},
                          [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce(kind, x[0], 1); },
                          1e-5});
  }
  for (auto kind : {ReduceKind::Sum, ReduceKind::Mean}) {
    const std::string k = kind == ReduceKind::Sum ? "sum" : "mean";
    c.lowering.push_back({"reduce_all_many_blocks_" + k,
                          {f32({5000}, 0, 1)},
                          [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce_all(kind, x[0]); },
                          1e-5});
    c.lowering.push_back({"reduce_all_small_" + k,
                          {f32({3, 3})},
                          [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce_all(kind, x[0]); },
                          1e-5});
  }
}

}  // namespace kiln::testing
