// absorb_padding (circuit/passes/absorb_padding.hpp): zero columns concatenated after a fused_rows
// output become padding the op writes. A layer norm's bf16 output padded by a concat with zeros
// (requested, so every stored element is compared), over rows that fit the CPU reference's chunks
// (13, 45) and rows longer than its block (3000), padded by 3 columns and by 40 (more than a
// warp's lanes): the concat gone, and the same values as the concat's on the Eigen executor
// (bit for bit, buffers poisoned) and in the simulator (whose fresh memory reads as NaN: a zero
// column left unwritten fails). A cast after the padding keeps it. Then the pipeline: a bf16 matmul over rows of 61,
// which pad_bf16_rows pads to 64, has no concat left and matches the CPU; the switch keeps the concat.
#include <gtest/gtest.h>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/absorb_casts.hpp>
#include <kiln/circuit/passes/absorb_padding.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

using Case = testing::CircuitCase;

// y = layernorm(x) over rows of n (6 rows); outputs: concat(bf16(y), zeros (6, pad)) along the
// rows, and y + x in f32 (a second row output of the same op, not padded).
Case padded_norm(int64_t n, int64_t pad) {
  Case k;
  Circuit& c = k.circuit;
  const ValueId x = c.add_external({Shape{6, n}, DType::f32}, ValueRole::Input, "x");
  const ValueId g = c.add_external({Shape{n}, DType::f32}, ValueRole::Input, "g");
  const ValueId beta = c.add_external({Shape{n}, DType::f32}, ValueRole::Input, "beta");
  Builder b(c, "test");
  const ValueId y = composite::layernorm(b, x, g, beta);
  const ValueId zeros = b.cast(b.fill(Shape{6, pad}, DType::f32, 0.0), DType::bf16);
  k.outputs = {b.concat({b.cast(y, DType::bf16), zeros}, 1), b.add(y, x)};
  for (const ValueId v : {x, g, beta})
    k.bindings.push_back(testing::random_tensor({c.info(v).shape, DType::f32}, 70 + static_cast<uint64_t>(v)));
  return k;
}

TEST(AbsorbPadding, ZeroColumnsAfterARowOutputAreWrittenByItsOp) {
  set_poison_buffers(true);  // as the whole suite runs (tests/test_environment.cpp)
  for (const int64_t n : {int64_t{13}, int64_t{45}, int64_t{3000}})
    for (const int64_t pad : {int64_t{3}, int64_t{40}}) {
      SCOPED_TRACE("rows of " + std::to_string(n) + " padded by " + std::to_string(pad));
      Case k = padded_norm(n, pad);
      std::vector<ValueId> fused_outs = k.outputs;
      const Circuit f =
          absorb_casts(fuse_rows(fuse_pointwise(cse(k.circuit, fused_outs), fused_outs), fused_outs), fused_outs);
      ASSERT_EQ(testing::count_prim(f, PrimId::concat), 1u) << f.dump("fused");
      std::vector<ValueId> padded_outs = fused_outs;
      const Circuit a = absorb_padding(f, padded_outs);
      EXPECT_EQ(testing::count_prim(a, PrimId::concat), 0u) << a.dump("absorbed");
      EXPECT_EQ(testing::count_prim(a, PrimId::fill), 0u) << a.dump("absorbed");
      ASSERT_EQ(testing::count_prim(a, PrimId::fused_rows), 1u) << a.dump("absorbed");
      EXPECT_NE(a.dump("absorbed").find(":bf16+" + std::to_string(pad) + " zero columns"), std::string::npos)
          << a.dump("absorbed");
      const std::vector<HostTensor> want = execute(f, k.bindings, fused_outs),
                                    got = execute(a, k.bindings, padded_outs);
      ASSERT_EQ(got[0].shape(), (Shape{6, n + pad}));
      for (size_t o = 0; o < want.size(); ++o)
        EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << "output " << o;
      cuda::DeviceProgram dp(a, padded_outs, testing::fake_runtime());
      const std::vector<HostTensor> dev = dp.run(k.bindings);
      for (int64_t r = 0; r < 6; ++r)
        for (int64_t i = n; i < n + pad; ++i) ASSERT_EQ(dev[0].get(r * (n + pad) + i), 0.0) << "row " << r << ", " << i;
      // bf16 values computed in f32 on either side: at most a rounding step (2^-8 relative) apart
      // where the f32 values straddle a rounding boundary.
      EXPECT_LT(testing::relative_error(dev[0], want[0]), 1.0 / 256);
      EXPECT_LT(testing::relative_error(dev[1], want[1]), 1e-5);
    }
}

// Padding first, then the cast (f32 zeros concatenated before the cast): absorb_casts gives the
// op's bf16 copy the f32 output's padding (after the op's other output, y + x), the same values
// as the unabsorbed ops.
TEST(AbsorbPadding, ACastOfPaddedRowsIsPaddedToo) {
  set_poison_buffers(true);  // as the whole suite runs (tests/test_environment.cpp)
  Case k;
  Circuit& c = k.circuit;
  const ValueId x = c.add_external({Shape{6, 45}, DType::f32}, ValueRole::Input, "x");
  const ValueId g = c.add_external({Shape{45}, DType::f32}, ValueRole::Input, "g");
  const ValueId beta = c.add_external({Shape{45}, DType::f32}, ValueRole::Input, "beta");
  Builder b(c, "test");
  const ValueId y = composite::layernorm(b, x, g, beta);
  const ValueId padded_y = b.concat({y, b.fill(Shape{6, 3}, DType::f32, 0.0)}, 1);
  k.outputs = {b.cast(padded_y, DType::bf16), b.add(y, x)};
  for (const ValueId v : {x, g, beta})
    k.bindings.push_back(testing::random_tensor({c.info(v).shape, DType::f32}, 80 + static_cast<uint64_t>(v)));
  std::vector<ValueId> fused_outs = k.outputs;
  const Circuit f = fuse_rows(fuse_pointwise(cse(k.circuit, fused_outs), fused_outs), fused_outs);
  std::vector<ValueId> outs = fused_outs;
  const Circuit padded = absorb_padding(f, outs);
  const Circuit a = absorb_casts(padded, outs);
  EXPECT_EQ(testing::count_prim(a, PrimId::concat), 0u) << a.dump("absorbed");
  EXPECT_EQ(testing::count_prim(a, PrimId::cast), 0u) << a.dump("absorbed");
  EXPECT_NE(a.dump("absorbed").find(":bf16+3 zero columns"), std::string::npos) << a.dump("absorbed");
  const std::vector<HostTensor> want = execute(f, k.bindings, fused_outs), got = execute(a, k.bindings, outs);
  for (size_t o = 0; o < want.size(); ++o) EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << "output " << o;
  // The f32 padded rows (before the cast's absorption) in the simulator: zero columns exact.
  std::vector<ValueId> padded_outs = fused_outs;
  const Circuit f32_padded = absorb_padding(f, padded_outs);
  cuda::DeviceProgram dp(f32_padded, padded_outs, testing::fake_runtime());
  const std::vector<HostTensor> dev = dp.run(k.bindings);
  for (size_t o = 0; o < want.size(); ++o) EXPECT_LT(testing::relative_error(dev[o], want[o]), 1.0 / 256) << o;
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t i = 45; i < 48; ++i) EXPECT_EQ(dev[0].get(r * 48 + i), 0.0) << "row " << r << ", " << i;
}

// Zeros of -0 are not the kernels' +0 columns: such a concat stays.
TEST(AbsorbPadding, NegativeZerosAreNotAbsorbed) {
  Case k = padded_norm(13, 3);
  Circuit& c = k.circuit;
  Builder b(c, "test");
  const ValueId y_bf16 = c.ops()[static_cast<size_t>(c.value(k.outputs[0]).producer)].inputs[0];
  k.outputs[0] = b.concat({y_bf16, b.cast(b.fill(Shape{6, 3}, DType::f32, -0.0), DType::bf16)}, 1);
  std::vector<ValueId> outs = k.outputs;
  const Circuit f = absorb_casts(fuse_rows(fuse_pointwise(cse(c, outs), outs), outs), outs);
  EXPECT_EQ(testing::count_prim(absorb_padding(f, outs), PrimId::concat), 1u);
}

// z = bf16(layernorm(x)) bf16(w) with rows of 61 (122 bytes: pad_bf16_rows pads them to 64).
Case norm_then_matmul_of_odd_rows() {
  Case k;
  Circuit& c = k.circuit;
  const ValueId x = c.add_external({Shape{40, 61}, DType::f32}, ValueRole::Input, "x");
  const ValueId g = c.add_external({Shape{61}, DType::f32}, ValueRole::Input, "g");
  const ValueId beta = c.add_external({Shape{61}, DType::f32}, ValueRole::Input, "beta");
  const ValueId w = c.add_external({Shape{61, 24}, DType::f32}, ValueRole::Input, "w");
  Builder b(c, "test");
  const ValueId y = composite::layernorm(b, x, g, beta);
  k.outputs = {b.matmul(b.cast(y, DType::bf16), b.cast(w, DType::bf16))};
  for (const ValueId v : {x, g, beta, w})
    k.bindings.push_back(testing::random_tensor({c.info(v).shape, DType::f32}, 90 + static_cast<uint64_t>(v)));
  return k;
}

TEST(AbsorbPadding, TheGpuPipelinePadsOddBf16RowsInTheirProducer) {
  Case k = norm_then_matmul_of_odd_rows();
  std::vector<ValueId> outs = k.outputs;
  const Circuit planned = optimize(k.circuit, outs, cuda_target(90, /*fake=*/true));
  EXPECT_EQ(testing::count_prim(planned, PrimId::concat), 0u) << planned.dump("planned");
  EXPECT_NE(planned.dump("planned").find(":bf16+3 zero columns"), std::string::npos) << planned.dump("planned");
  cuda::DeviceProgram dp(planned, outs, testing::fake_runtime());
  EXPECT_NE(dp.dump().find("mma.sync bf16"), std::string::npos) << dp.dump();
  const std::vector<HostTensor> dev = dp.run(k.bindings);
  const std::vector<HostTensor> cpu = execute(k.circuit, k.bindings, k.outputs);
  EXPECT_LT(testing::relative_error(dev[0], cpu[0]), 1e-5);
  std::vector<ValueId> kept = k.outputs;
  EXPECT_EQ(testing::count_prim(
                optimize(k.circuit, kept, cuda_target(90, /*fake=*/true), parse_pipeline_options("-absorb_padding")),
                PrimId::concat),
            1u);
}

// Params round trip, and the checks: no padding on a per-row output.
TEST(AbsorbPadding, PaddingRoundTripsThroughParamsAndOnlyRowOutputsTakeIt) {
  RowProgram rp;
  rp.inputs = 1;
  rp.domain = Shape{3, 5};
  rp.reduction_kinds = {ReduceKind::Sum};
  rp.reduction_bodies = {se::in(0)};
  rp.output_per_row = {false, true};
  rp.output_bodies = {se::in(0), se::in(1)};
  rp.output_pad = {4, 0};
  const RowProgram back = RowProgram::from_params(rp.to_params(DType::f32));
  EXPECT_EQ(back.padding(0), 4);
  EXPECT_EQ(back.padding(1), 0);
  Circuit c;
  const ValueId x = c.add_external({Shape{3, 5}, DType::f32}, ValueRole::Input, "x");
  const std::vector<ValueId> out = c.add_op(PrimId::fused_rows, rp.to_params(DType::f32), {x});
  EXPECT_EQ(c.info(out[0]).shape, (Shape{3, 9}));
  EXPECT_EQ(c.info(out[1]).shape, (Shape{3, 1}));
  rp.output_pad = {0, 2};
  EXPECT_THROW(c.add_op(PrimId::fused_rows, rp.to_params(DType::f32), {x}), Error);
}

}  // namespace
}  // namespace kiln
