// The cases of where (circuit/prims/where.cpp, cuda/lower/where.cpp).
#include "prim_cases.hpp"

namespace kiln::testing {

void where_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "where_broadcast", {"where"}, {I({3, 4}, 2), F({3, 4}), F({4})},
               [](Builder& b, const auto& x) { return b.where(x[0], x[1], x[2]); });
  // Lowerings (f32 kernels against the Eigen reference).
  c.lowering.push_back({"where_int_cond",
                        {i32({37, 1}, 0, 2), f32({37, 45}), f32({45})},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.where(x[0], x[1], x[2]); },
                        0});
  c.lowering.push_back({"where_float_cond",
                        {f32({37, 45}, -1, 1), f32({37, 45}), f32({37, 45})},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.where(x[0], x[1], x[2]); },
                        0});
}

}  // namespace kiln::testing
