// The cases of matmul (circuit/prims/matmul.cpp, cuda/lower/matmul.cpp): flags, batches, broadcast batches.
#include "prim_cases.hpp"

namespace kiln::testing {

void matmul_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  for (int flags = 0; flags < 4; ++flags) {
    bool ta = flags & 1, tb = flags & 2;
    add_gradient(c, "matmul_ta" + std::to_string(ta) + "_tb" + std::to_string(tb), {"matmul"},
                 {F(ta ? Shape{7, 5} : Shape{5, 7}), F(tb ? Shape{3, 7} : Shape{7, 3})},
                 [ta, tb](Builder& b, const auto& x) { return b.matmul(x[0], x[1], ta, tb); });
  }
  add_gradient(c, "matmul_batched_shared_b", {"matmul"}, {F({2, 5, 7}), F({7, 3})},
               [](Builder& b, const auto& x) { return b.matmul(x[0], x[1]); });
  add_gradient(c, "matmul_batched_shared_b_tb", {"matmul"}, {F({2, 5, 7}), F({3, 7})},
               [](Builder& b, const auto& x) { return b.matmul(x[0], x[1], false, true); });
  add_gradient(c, "matmul_batched_ta_shared_b", {"matmul"}, {F({2, 7, 5}), F({7, 3})},
               [](Builder& b, const auto& x) { return b.matmul(x[0], x[1], true, false); });
  add_gradient(c, "matmul_batch_broadcast", {"matmul"}, {F({1, 3, 4}), F({2, 4, 5})},
               [](Builder& b, const auto& x) { return b.matmul(x[0], x[1]); });
  add_gradient(c, "matmul_4d_tb", {"matmul"}, {F({2, 2, 3, 4}), F({2, 2, 5, 4})},
               [](Builder& b, const auto& x) { return b.matmul(x[0], x[1], false, true); });
  // Lowerings (f32 kernels against the Eigen reference).
  struct Mm {
    std::string name;
    Shape a, b;
    bool ta, tb;
  };
  for (const Mm& m : std::vector<Mm>{{"plain", {67, 45}, {45, 91}, false, false},
                                     {"ta", {45, 67}, {45, 91}, true, false},
                                     {"tb", {67, 45}, {91, 45}, false, true},
                                     {"ta_tb", {45, 67}, {91, 45}, true, true},
                                     {"batched_shared_b", {3, 2, 33, 17}, {17, 70}, false, false},
                                     {"batch_broadcast", {2, 1, 5, 19}, {3, 7, 19}, false, true},
                                     {"k_larger_than_tile", {9, 130}, {130, 11}, false, false},
                                     // Rows of whole 16-byte chunks: in bf16 the tensor-core kernel's
                                     // (mma.sync on sm_80, wgmma on a real sm_90: the Targets differ).
                                     {"whole_chunks", {96, 64}, {64, 80}, false, false},
                                     {"whole_chunks_ta_tb", {64, 96}, {80, 64}, true, true}}) {
    c.lowering.push_back({"matmul_" + m.name,
                          {f32(m.a), f32(m.b)},
                          [m](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], x[1], m.ta, m.tb); },
                          1e-5});
    // bf16 operands: the kernel and the host both multiply the same bf16 values exactly and
    // accumulate in f32, so only the order of the sums differs (1e-5, as f32).
    c.lowering.push_back({"matmul_bf16_" + m.name,
                          {f32(m.a), f32(m.b)},
                          [m](Builder& b, const std::vector<ValueId>& x) {
                            return b.matmul(b.cast(x[0], DType::bf16), b.cast(x[1], DType::bf16), m.ta, m.tb);
                          },
                          1e-5});
  }
}

}  // namespace kiln::testing
