// The cases of reshape, permute, broadcast (circuit/prims/shape_ops.cpp, cuda/lower/shape_ops.cpp).
#include "prim_cases.hpp"

namespace kiln::testing {

void shape_ops_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "reshape", {"reshape"}, {F({6, 5})}, [](Builder& b, const auto& x) {
    return b.reshape(x[0], Shape{3, -1, 5});
  });
  add_gradient(c, "permute", {"permute"}, {F({2, 3, 4})}, [](Builder& b, const auto& x) {
    return b.permute(x[0], {2, 0, 1});
  });
  add_gradient(c, "transpose", {"permute"}, {F({5, 3})},
               [](Builder& b, const auto& x) { return b.transpose(x[0], 0, 1); });
  add_gradient(c, "broadcast", {"broadcast"}, {F({3, 1})}, [](Builder& b, const auto& x) {
    return b.broadcast(x[0], Shape{2, 3, 4});
  });
  // Lowerings (f32 kernels against the Eigen reference).
  c.lowering.push_back({"reshape",
                        {f32({6, 35})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          return b.reshape(x[0], Shape{5, 42});
                        },
                        0});
  c.lowering.push_back({"permute",
                        {f32({3, 5, 7})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          return b.permute(x[0], {2, 0, 1});
                        },
                        0});
  c.lowering.push_back({"broadcast",
                        {f32({5, 1})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          return b.broadcast(x[0], Shape{3, 5, 33});
                        },
                        0});
}

}  // namespace kiln::testing
