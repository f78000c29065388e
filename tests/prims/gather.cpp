// The cases of gather_rows, scatter_add_rows, gather_last, one_hot (circuit/prims/gather.cpp, cuda/lower/gather.cpp).
#include "prim_cases.hpp"

namespace kiln::testing {

void gather_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "gather_rows_repeated", {"gather_rows"}, {F({11, 5}), I({2, 9}, 11)},
               [](Builder& b, const auto& x) { return b.gather_rows(x[0], x[1]); });
  add_gradient(c, "scatter_add_rows", {"scatter_add_rows"}, {I({7}, 5), F({7, 3})},
               [](Builder& b, const auto& x) { return b.scatter_add_rows(x[0], x[1], 5); });
  add_gradient(c, "gather_last", {"gather_last", "cast"}, {F({3, 4, 6}), I({3, 4}, 6)},
               [](Builder& b, const auto& x) { return b.gather_last(x[0], x[1]); });
  add_gradient(c, "one_hot_weighting", {"pointwise"}, {F({4, 6}), I({4}, 6)},
               [](Builder& b, const auto& x) { return b.mul(x[0], b.one_hot(x[1], 6, DType::f64)); });
  // Lowerings (f32 kernels against the Eigen reference).
  c.lowering.push_back({"gather_rows",
                        {f32({50, 37}), i32({3, 7}, 0, 50)},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.gather_rows(x[0], x[1]); },
                        0});
  // Few rows, many repeats: atomics add several contributions to one element.
  c.lowering.push_back({"scatter_add_rows",
                        {i32({3, 7}, 0, 5), f32({3, 7, 37})},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.scatter_add_rows(x[0], x[1], 5); },
                        1e-6});
  // The deterministic mode's ordered sums: the reference's order, so the reference's bits. Many
  // collisions, values of mixed magnitudes (order-dependent rounding), more columns than a block.
  c.lowering.push_back(
      {"scatter_add_rows_ordered",
       {i32({9, 31}, 0, 4), f32({9, 31, 300}, -1000, 1000)},
       [](Builder& b, const std::vector<ValueId>& x) {
         const ScatterAddRowsParams p{4, true};
         return b.circuit().add_op(PrimId::scatter_add_rows, p.to_params(), {x[0], x[1]}, b.scope())[0];
       },
       0});
  c.lowering.push_back({"gather_last",
                        {f32({5, 9, 13}), i32({5, 9}, 0, 13)},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.gather_last(x[0], x[1]); },
                        0});
  c.lowering.push_back({"one_hot",
                        {i32({5, 9}, 0, 13)},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.one_hot(x[0], 13, DType::f32); },
                        0});
}

}  // namespace kiln::testing
