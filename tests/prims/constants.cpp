// The cases of fill and iota (circuit/prims/constants.cpp, cuda/lower/constants.cpp).
#include "prim_cases.hpp"

namespace kiln::testing {

void constants_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "fill", {"pointwise"}, {F({3, 4})},
               [](Builder& b, const auto& x) { return b.mul(x[0], b.fill(Shape{4}, DType::f64, 2.5)); });
  add_gradient(c, "iota", {"pointwise"}, {F({3, 4})}, [](Builder& b, const auto& x) {
    return b.mul(x[0], b.iota(Shape{3, 4}, DType::f64, ix::coord(1)));
  });
  // Lowerings (f32 kernels against the Eigen reference).
  c.lowering.push_back({"fill",
                        {},
                        [](Builder& b, const std::vector<ValueId>&) {
                          return b.fill(Shape{3, 77}, DType::f32, -1.25);
                        },
                        0});
  c.lowering.push_back(
      {"fill_i32", {}, [](Builder& b, const std::vector<ValueId>&) { return b.fill(Shape{77}, DType::i32, 7); }, 0});
  c.lowering.push_back({"iota_causal_mask",
                        {},
                        [](Builder& b, const std::vector<ValueId>&) {
                          return b.iota(Shape{37, 37}, DType::f32, ix::ge(ix::coord(0), ix::coord(1)));
                        },
                        0});
  c.lowering.push_back(
      {"iota_floor_div_mod_negative",
       {},
       [](Builder& b, const std::vector<ValueId>&) {
         IndexExp shifted = ix::sub(ix::coord(0), ix::c(20));
         return b.iota(Shape{41, 3}, DType::i32,
                       ix::add(ix::mul(ix::floordiv(shifted, ix::c(3)), ix::c(10)), ix::mod(shifted, ix::c(-4))));
       },
       0});
}

}  // namespace kiln::testing
