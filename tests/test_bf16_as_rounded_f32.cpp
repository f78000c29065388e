// bf16_as_rounded_f32 (circuit/passes/bf16_as_rounded_f32.hpp): on the CPU, bf16 operands are held
// in f32 rounded to bf16, and the results are bit for bit those of the bf16 circuit (whose
// matmuls widen their operands to f32 copies): the products of rounded operands are exact in f32
// either way, and the same f32 GEMM sums them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/bf16_as_rounded_f32.hpp>

#include "prim_test_util.hpp"

namespace kiln {
namespace {

// The host's Target with the bf16 products this pass serves (the default where the CPU has no
// AMX-BF16; cpu_target() picks oneDNN's bf16 products where it has).
Target rounded_f32_target() {
  Target t = cpu_target();
  t.cpu_bf16 = CpuBf16Products::rounded_f32;
  return t;
}

size_t bf16_matmuls(const Circuit& c) {
  size_t n = 0;
  for (const Op& op : c.ops()) n += op.is(PrimId::matmul) && c.info(op.inputs[0]).dtype == DType::bf16 ? 1 : 0;
  return n;
}

void expect_same_bits(const HostTensor& got, const HostTensor& want) {
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(got.get(i), want.get(i)) << "element " << i;
}

// Every rule of the pass in one circuit: casts of f32 (and f64) to bf16, a reshape and a
// transposed product of bf16 values, a bf16 input, an assign to a bf16 buffer (an op the pass
// leaves in bf16) whose new value a concat and a product read, a cast back to f32 and to f64, and
// a requested bf16 output.
TEST(Bf16AsRoundedF32, HoldsBf16InF32WithTheSameBits) {
  testing::Built b;
  const ValueId x = b.input(Shape{6, 10}, DType::f32, 1), w = b.input(Shape{5, 12}, DType::f32, 2),
                h = b.input(Shape{6, 12}, DType::bf16, 3), d = b.input(Shape{6, 10}, DType::f64, 4),
                buffer = b.input(Shape{6, 2}, DType::bf16, 5, ValueRole::Persistent);
  Builder bld(b.c, "test");
  const ValueId xb = bld.reshape(bld.cast(x, DType::bf16), Shape{12, 5});  // (12, 5)
  const ValueId p = bld.matmul(xb, bld.cast(w, DType::bf16), true, true);  // xbᵀ wᵀ: (5, 5)
  const ValueId q = bld.matmul(bld.cast(d, DType::bf16), h, true, false);  // dᵀ h: (10, 12)
  const ValueId joined = bld.concat(
      {bld.cast(x, DType::bf16), bld.assign(buffer, bld.cast(bld.slice(x, 1, 0, 2), DType::bf16))}, 1);  // (6, 12)
  const ValueId r = bld.matmul(joined, h, true, false);                                                  // (12, 12)
  b.outs = {p, q, r, bld.cast(joined, DType::f32), bld.cast(joined, DType::f64), joined};
  // bf16 storage whose products widen both operands into f32 copies (the rounded-f32 Target's
  // matmul reference), against the pass's f32 values rounded to bf16.
  const std::vector<HostTensor> want = Program(b.c, b.outs, rounded_f32_target()).run(b.fresh_binds());

  std::vector<ValueId> outs = b.outs;
  const Circuit rounded = bf16_as_rounded_f32(b.c, outs, rounded_f32_target());
  EXPECT_GT(bf16_matmuls(b.c), 0u);
  EXPECT_EQ(bf16_matmuls(rounded), 0u) << rounded.dump("rounded");
  const std::vector<HostTensor> got = Program(rounded, outs, rounded_f32_target()).run(b.fresh_binds());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    expect_same_bits(got[i], want[i]);
  }
  EXPECT_EQ(got.back().dtype(), DType::bf16);  // a requested bf16 value stays bf16
}

// The GPU keeps bf16 storage (its tensor cores read bf16): the pass changes nothing there.
TEST(Bf16AsRoundedF32, LeavesGpuTargetsAlone) {
  testing::Built b;
  const ValueId x = b.input(Shape{8, 16}, DType::f32, 1), w = b.input(Shape{16, 8}, DType::f32, 2);
  Builder bld(b.c, "test");
  b.outs = {bld.matmul(bld.cast(x, DType::bf16), bld.cast(w, DType::bf16))};
  std::vector<ValueId> outs = b.outs;
  const Circuit same = bf16_as_rounded_f32(b.c, outs, cuda_target(80, /*fake=*/true));
  EXPECT_EQ(same.dump("c"), b.c.dump("c"));
  EXPECT_EQ(bf16_matmuls(bf16_as_rounded_f32(b.c, outs, rounded_f32_target())), 0u);
}

}  // namespace
}  // namespace kiln
