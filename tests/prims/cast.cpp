// The cases of cast and stop_gradient (circuit/prims/cast.cpp, cuda/lower/cast.cpp).
#include "prim_cases.hpp"

namespace kiln::testing {

void cast_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "cast_int_weights", {"cast", "pointwise"}, {F({3, 4}), I({3, 4}, 5)},
               [](Builder& b, const auto& x) { return b.mul(x[0], b.cast(x[1], DType::f64)); });
  // Through f32 and back: rounding limits what differences can resolve, so a larger step and a
  // tolerance of 1e-4 (f32 resolution over h = 1e-2 on a linear function).
  add_gradient(
      c, "cast_f64_f32_roundtrip", {"cast"}, {F({3, 4})},
      [](Builder& b, const auto& x) { return b.cast(b.cast(x[0], DType::f32), DType::f64); }, 1e-2, 1e-4);
  add_gradient(c, "stop_gradient", {"pointwise"}, {F({3, 4}), Fixed({3, 4})},
               [](Builder& b, const auto& x) { return b.mul(x[0], b.stop_gradient(x[1])); });
  // Lowerings (f32 kernels against the Eigen reference).
  c.lowering.push_back({"cast_f32_to_i32",
                        {f32({37, 45}, -100, 100)},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.cast(x[0], DType::i32); },
                        0});
  c.lowering.push_back({"cast_i32_to_f32",
                        {i32({37, 45}, -1000, 1000)},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.cast(x[0], DType::f32); },
                        0});
  // f32 -> bf16 rounds to nearest even in cvt.rn.bf16.f32 and in the host's conversion; and
  // back, exactly. Values over the whole f32 range's middle, ties included by chance.
  c.lowering.push_back({"cast_f32_to_bf16",
                        {f32({37, 45}, -100, 100)},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.cast(x[0], DType::bf16); },
                        0});
  c.lowering.push_back({"cast_bf16_to_f32",
                        {f32({37, 45}, -100, 100)},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          return b.cast(b.permute(b.cast(x[0], DType::bf16), {1, 0}), DType::f32);
                        },
                        0});
  // i32 <-> bf16 through f32 on both sides (2^24 + 2^16 + 1 rounds twice: to 2^24 + 2^16, then
  // to even, 2^24); values past 2^24 included.
  c.lowering.push_back({"cast_i32_bf16_i32",
                        {i32({37, 45}, -(1 << 26), 1 << 26)},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          return b.cast(b.cast(x[0], DType::bf16), DType::i32);
                        },
                        0});
  c.lowering.push_back({"stop_gradient",
                        {f32({37})},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.add(b.stop_gradient(x[0]), x[0]); },
                        0});
}

}  // namespace kiln::testing
