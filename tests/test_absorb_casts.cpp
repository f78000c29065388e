// absorb_casts (circuit/passes/absorb_casts.hpp): casts to bf16 of fused_rows outputs and
// fused_matmul epilogues (a bare product's too) become outputs of the op stored as bf16. A layer norm whose output is
// cast for a matmul (and, in a second case, also read in f32 by a residual add and requested), over rows that fit the
// CPU reference's chunks (37) and rows longer than its block (3000): no cast left, the f32 output kept only where read,
// and the results bit for bit the unabsorbed circuit's on the Eigen executor (the same rounding: to nearest even), and
// in the simulator within the f32 matmul tolerance; the disable switch keeps the casts. Attention's bf16 copies of its
// outputs, in every kernel family, bit for bit the rounding of its f32 outputs.
#include <gtest/gtest.h>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/absorb_casts.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using Case = testing::CircuitCase;

// y = layernorm(x) (rows of n), z = bf16(y) w (w: n x 24); with `f32_reader`, also y + x, and y
// requested.
Case norm_then_matmul(int64_t n, bool f32_reader) {
  Case k;
  Circuit& c = k.circuit;
  const ValueId x = c.add_external({Shape{6, n}, DType::f32}, ValueRole::Input, "x");
  const ValueId g = c.add_external({Shape{n}, DType::f32}, ValueRole::Input, "g");
  const ValueId beta = c.add_external({Shape{n}, DType::f32}, ValueRole::Input, "beta");
  const ValueId w = c.add_external({Shape{n, 24}, DType::f32}, ValueRole::Input, "w");
  Builder b(c, "test");
  const ValueId y = composite::layernorm(b, x, g, beta);
  k.outputs = {b.matmul(b.cast(y, DType::bf16), b.cast(w, DType::bf16))};
  if (f32_reader) k.outputs.insert(k.outputs.end(), {b.add(y, x), y});
  for (const ValueId v : {x, g, beta, w})
    k.bindings.push_back(testing::random_tensor({c.info(v).shape, DType::f32}, 30 + static_cast<uint64_t>(v)));
  return k;
}

size_t casts_of_rows(const Circuit& c) {
  size_t n = 0;
  for (const Op& op : c.ops())
    if (op.is(PrimId::cast) && op.params.dtype == DType::bf16) {
      const int32_t p = c.value(op.inputs[0]).producer;
      n += p >= 0 && c.ops()[static_cast<size_t>(p)].is(PrimId::fused_rows);
    }
  return n;
}

// The case's GPU plan with absorb_casts off, run on the Eigen executor: what the plan with it
// must give bit for bit.
std::vector<HostTensor> unabsorbed_results(const Case& k) {
  std::vector<ValueId> outs = k.outputs;
  Circuit unabsorbed;
  { unabsorbed = optimize(k.circuit, outs, cuda_target(90, /*fake=*/true), parse_pipeline_options("-absorb_casts")); }
  return execute(unabsorbed, k.bindings, outs);
}

TEST(AbsorbCasts, RowOutputsCastForMatmulsAreStoredAsBf16ByTheirOp) {
  for (const int64_t n : {int64_t{37}, int64_t{3000}})
    for (const bool f32_reader : {false, true}) {
      SCOPED_TRACE("rows of " + std::to_string(n) + (f32_reader ? ", the f32 output also read" : ""));
      Case k = norm_then_matmul(n, f32_reader);
      std::vector<ValueId> fused_outs = k.outputs;
      Circuit f = fuse_rows(fuse_pointwise(cse(k.circuit, fused_outs), fused_outs), fused_outs);
      ASSERT_EQ(casts_of_rows(f), 1u) << f.dump("fused");
      std::vector<ValueId> absorbed_outs = fused_outs;
      const Circuit a = absorb_casts(f, absorbed_outs);
      EXPECT_EQ(casts_of_rows(a), 0u) << a.dump("absorbed");
      size_t bf16_outputs = 0, f32_row_outputs = 0;
      for (const Op& op : a.ops())
        if (op.is(PrimId::fused_rows))
          for (ValueId v : op.outputs) {
            bf16_outputs += a.info(v).dtype == DType::bf16;
            f32_row_outputs += a.info(v).dtype == DType::f32 && a.info(v).shape == Shape{6, n};
          }
      EXPECT_EQ(bf16_outputs, 1u) << a.dump("absorbed");
      // y dropped when only the cast read it; else y (requested) and y + x (fused into the op).
      EXPECT_EQ(f32_row_outputs, f32_reader ? 2u : 0u) << a.dump("absorbed");
      const std::vector<HostTensor> want = execute(f, k.bindings, fused_outs),
                                    got = execute(a, k.bindings, absorbed_outs);
      for (size_t o = 0; o < want.size(); ++o)
        EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << "output " << o;
      // The GPU plan (every pass) on the simulator.
      std::vector<ValueId> gpu_outs = k.outputs;
      const Circuit planned = optimize(k.circuit, gpu_outs, cuda_target(90, /*fake=*/true));
      EXPECT_EQ(casts_of_rows(planned), 0u) << planned.dump("planned");
      cuda::DeviceProgram dp(planned, gpu_outs, testing::fake_runtime());
      const std::vector<HostTensor> dev = dp.run(k.bindings);
      const std::vector<HostTensor> cpu = execute(k.circuit, k.bindings, k.outputs);
      for (size_t o = 0; o < cpu.size(); ++o)
        EXPECT_LT(testing::relative_error(dev[o], cpu[o]), 1e-5) << "output " << o;
    }
}

// An MLP's first product with bias and GELU whose output is cast for the second (x W1 + b, gelu,
// cast, times W2), bf16 operands: the GELU epilogue stored as bf16 by the first product's kernel
// (the pre-activation, requested, stays f32). Sizes inside whole 128-wide tiles (the interior
// epilogue: bf16 pairs as one 4-byte store) and off them (the checked one), on the mma.sync
// kernel and on wgmma, K = 128 whole or split 2 ways (the last block's epilogue); on the Eigen
// executor the same bits as the cast.
TEST(AbsorbCasts, MatmulEpiloguesCastForMatmulsAreStoredAsBf16ByTheirKernel) {
  for (const int64_t rows : {int64_t{256}, int64_t{100}})
    for (const char* wgmma : {"off", "on"})
      for (const char* split : {"0", "2"}) {
        SCOPED_TRACE(std::to_string(rows) + " rows, wgmma=" + wgmma + ", split-k=" + split);
        const Target target =
            testing::with_matmul(cuda_target(90, /*fake=*/true), std::string("wgmma=") + wgmma + ",split-k=" + split);
        Case k;
        Circuit& c = k.circuit;
        const ValueId x = c.add_external({Shape{rows, 128}, DType::f32}, ValueRole::Input, "x");
        const ValueId w1 = c.add_external({Shape{128, 256}, DType::f32}, ValueRole::Input, "w1");
        const ValueId b1 = c.add_external({Shape{256}, DType::f32}, ValueRole::Input, "b1");
        const ValueId w2 = c.add_external({Shape{256, 48}, DType::f32}, ValueRole::Input, "w2");
        Builder b(c, "test");
        const ValueId pre = b.add(b.matmul(b.cast(x, DType::bf16), b.cast(w1, DType::bf16)), b1);
        const ValueId h = b.pointwise(se::gelu(se::in(0)), {pre});
        k.outputs = {b.matmul(b.cast(h, DType::bf16), b.cast(w2, DType::bf16)), pre};
        for (const ValueId v : {x, w1, b1, w2})
          k.bindings.push_back(testing::random_tensor({c.info(v).shape, DType::f32}, 50 + static_cast<uint64_t>(v)));
        std::vector<ValueId> gpu_outs = k.outputs;
        const Circuit planned = optimize(k.circuit, gpu_outs, target);
        size_t bf16_epilogues = 0, casts_of_matmuls = 0;
        for (const Op& op : planned.ops()) {
          if (op.is(PrimId::fused_matmul))
            for (ValueId v : op.outputs) bf16_epilogues += planned.info(v).dtype == DType::bf16;
          if (op.is(PrimId::cast) && op.params.dtype == DType::bf16) {
            const int32_t p = planned.value(op.inputs[0]).producer;
            casts_of_matmuls += p >= 0 && planned.ops()[static_cast<size_t>(p)].is(PrimId::fused_matmul);
          }
        }
        EXPECT_EQ(bf16_epilogues, 1u) << planned.dump("planned");
        EXPECT_EQ(casts_of_matmuls, 0u) << planned.dump("planned");
        const std::vector<HostTensor> want = unabsorbed_results(k), got = execute(planned, k.bindings, gpu_outs);
        for (size_t o = 0; o < want.size(); ++o)
          EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << "output " << o;
        cuda::DeviceProgram dp(planned, gpu_outs, testing::fake_runtime(), target);
        EXPECT_NE(dp.dump().find(wgmma == std::string("on") ? "wgmma m64n" : "mma.sync bf16"), std::string::npos)
            << dp.dump();
        EXPECT_EQ(dp.dump().find("K split 2 ways") != std::string::npos, split == std::string("2")) << dp.dump();
        const std::vector<HostTensor> dev = dp.run(k.bindings);
        for (size_t o = 0; o < want.size(); ++o)
          EXPECT_LT(testing::relative_error(dev[o], want[o]), 1e-5) << "output " << o;
      }
}

// A product with no epilogue whose f32 value is only cast to bf16 (bf16(a b), as `kiln bench
// --gemm` stores it, or as cuBLAS returns a bf16 product): one fused_matmul kernel that writes
// the bf16 product and no f32 one, with no cast kernel after it; with the f32 product also
// requested, both. The same bits as the cast on the Eigen executor; in the simulator within the
// f32 matmul tolerance, on mma.sync and on wgmma, inside whole tiles (256 x 128) and off them.
TEST(AbsorbCasts, AProductOnlyCastToBf16IsStoredAsBf16ByItsKernel) {
  for (const int64_t rows : {int64_t{256}, int64_t{100}})
    for (const char* wgmma : {"off", "on"})
      for (const bool f32_requested : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + " rows, wgmma=" + wgmma + (f32_requested ? ", f32 requested" : ""));
        const Target target = testing::with_matmul(cuda_target(90, /*fake=*/true), std::string("wgmma=") + wgmma);
        Case k;
        Circuit& c = k.circuit;
        const ValueId x = c.add_external({Shape{rows, 64}, DType::bf16}, ValueRole::Input, "x");
        const ValueId w = c.add_external({Shape{64, 128}, DType::bf16}, ValueRole::Input, "w");
        Builder b(c, "test");
        const ValueId product = b.matmul(x, w);
        k.outputs = {b.cast(product, DType::bf16)};
        if (f32_requested) k.outputs.push_back(product);
        for (const ValueId v : {x, w})
          k.bindings.push_back(testing::random_tensor({c.info(v).shape, DType::bf16}, 70 + static_cast<uint64_t>(v)));
        std::vector<ValueId> gpu_outs = k.outputs;
        const Circuit planned = optimize(k.circuit, gpu_outs, target);
        size_t bf16_outputs = 0, f32_outputs = 0;
        for (const Op& op : planned.ops())
          if (op.is(PrimId::fused_matmul))
            for (ValueId v : op.outputs) (planned.info(v).dtype == DType::bf16 ? bf16_outputs : f32_outputs) += 1;
        EXPECT_EQ(planned.ops().size(), 1u) << planned.dump("planned");
        EXPECT_EQ(bf16_outputs, 1u) << planned.dump("planned");
        EXPECT_EQ(f32_outputs, f32_requested ? 1u : 0u) << planned.dump("planned");
        const std::vector<HostTensor> want = unabsorbed_results(k), got = execute(planned, k.bindings, gpu_outs);
        for (size_t o = 0; o < want.size(); ++o) {
          ASSERT_EQ(got[o].dtype(), want[o].dtype()) << "output " << o;
          EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << "output " << o;
        }
        cuda::DeviceProgram dp(planned, gpu_outs, testing::fake_runtime(), target);
        EXPECT_NE(dp.dump().find(wgmma == std::string("on") ? "wgmma m64n" : "mma.sync bf16"), std::string::npos)
            << dp.dump();
        const std::vector<HostTensor> dev = dp.run(k.bindings);
        for (size_t o = 0; o < want.size(); ++o)
          EXPECT_LT(testing::relative_error(dev[o], want[o]), 1e-5) << "output " << o;
      }
}

// Attention's bf16 copies (AttentionParams::bf16_copies): forward and backward of each kernel
// family, each copy the f32 output rounded to nearest even, bit for bit, on the Eigen executor
// and in the simulator (whose f32 outputs agree with Eigen's at 1e-5, as without copies):
// bf16 operands on the tensor-core kernels (q, k, v packed as the GPT's (B, T, 3 H d), and
// grouped queries with three gradients), f32 operands on the tiled FFMA kernels (head size 8)
// and on the warp-per-row ones (head size 6).
TEST(AbsorbCasts, AttentionWritesBf16CopiesOfItsOutputs) {
  struct Config {
    const char* name;
    AttentionParams a;
    std::vector<Shape> qkv;  // one packed input, or q, k, v
    const char* kernel;      // in the device program's summary
  };
  const Config configs[] = {
      {"packed, bf16 operands", {true, 0.2, true, 2, 1, 1.0, false, true, true}, {Shape{2, 67, 3 * 2 * 32}}, "mma"},
      {"grouped, bf16 operands",
       {true, 0.3, false, 0, 2, 1.0, false, true, true},
       {Shape{2, 4, 40, 16}, Shape{2, 2, 40, 16}, Shape{2, 2, 40, 16}},
       "mma"},
      {"f32, head size 8",
       {false, 0.4, false, 0, 1, 1.0, false, false, true},
       {Shape{3, 37, 8}, Shape{3, 45, 8}, Shape{3, 45, 8}},
       "a thread per"},
      {"f32, head size 6",
       {true, 0.4, false, 0, 1, 1.0, false, false, true},
       {Shape{3, 37, 6}, Shape{3, 37, 6}, Shape{3, 37, 6}},
       "a warp per query row"},
  };
  for (const Config& cfg : configs) {
    SCOPED_TRACE(cfg.name);
    for (const PrimId prim : {PrimId::attention, PrimId::attention_grad}) {
      SCOPED_TRACE(prim == PrimId::attention ? "forward" : "backward");
      Circuit c;
      std::vector<ValueId> in;
      for (const Shape& sh : cfg.qkv) in.push_back(c.add_external({sh, DType::f32}, ValueRole::Input));
      // The backward's o, lse and do: the forward's shapes (any values).
      if (prim == PrimId::attention_grad) {
        Circuit probe;
        std::vector<ValueId> pin;
        for (const Shape& sh : cfg.qkv) pin.push_back(probe.add_external({sh, DType::f32}, ValueRole::Input));
        AttentionParams plain = cfg.a;
        plain.bf16_copies = false;
        const std::vector<ValueId> fwd = probe.add_op(PrimId::attention, plain.to_params(), pin);
        for (ValueId v : {fwd[0], fwd[1], fwd[0]})
          in.push_back(c.add_external({probe.info(v).shape, DType::f32}, ValueRole::Input));
      }
      const std::vector<ValueId> outs = c.add_op(prim, cfg.a.to_params(), in);
      const size_t main = prim == PrimId::attention ? 1 : outs.size() / 2, f32_outs = outs.size() - main;
      std::vector<HostTensor> bindings;
      for (ValueId v : in)
        bindings.push_back(testing::random_tensor({c.info(v).shape, DType::f32}, 60 + static_cast<uint64_t>(v)));
      const std::vector<HostTensor> cpu = execute(c, bindings, outs);
      cuda::DeviceProgram dp(c, outs, testing::fake_runtime());
      EXPECT_NE(dp.dump().find(cfg.kernel), std::string::npos) << dp.dump();
      const std::vector<HostTensor> dev = dp.run(bindings);
      for (size_t o = 0; o < f32_outs; ++o) EXPECT_LT(testing::relative_error(dev[o], cpu[o]), 1e-5) << "output " << o;
      for (size_t k = 0; k < main; ++k)
        for (const auto* side : {&cpu, &dev}) {
          const HostTensor &f32 = (*side)[k], &copy = (*side)[f32_outs + k];
          ASSERT_EQ(copy.dtype(), DType::bf16);
          ASSERT_EQ(copy.shape(), f32.shape());
          for (int64_t e = 0; e < f32.numel(); ++e)
            ASSERT_EQ(copy.data<Bf16>()[e].bits, f32_to_bf16(f32.data<float>()[e]).bits)
                << (side == &cpu ? "CPU" : "GPU") << " copy " << k << ", element " << e;
        }
    }
  }
}

// The pass over attention: an unpacked attention_grad (grouped queries, d == dv, so that copies
// mapped to the wrong gradient would still fit) whose dq and dv are cast directly and dk through a
// reshape that an f32 add also reads, and an attention whose o is cast through a reshape: every
// cast becomes the op's copy (or the same reshape of it), the results the casts' bits on the
// Eigen executor. With dv read in f32 only, the attention_grad keeps its casts.
TEST(AbsorbCasts, AttentionCastsBecomeTheOpsCopies) {
  for (const bool dv_cast : {true, false}) {
    SCOPED_TRACE(dv_cast ? "every gradient cast" : "dv not cast");
    Case k;
    Circuit& c = k.circuit;
    const Shape q_shape{2, 4, 20, 16}, kv_shape{2, 2, 20, 16};
    std::vector<ValueId> in;
    for (const Shape& sh : {q_shape, kv_shape, kv_shape, q_shape, Shape{2, 4, 20, 1}, q_shape})
      in.push_back(c.add_external({sh, DType::f32}, ValueRole::Input));
    Builder b(c, "test");
    const Params p = AttentionParams{true, 0.3, false, 0, 2, 1.0, false, true}.to_params();
    const std::vector<ValueId> fwd = c.add_op(PrimId::attention, p, {in[0], in[1], in[2]});
    const std::vector<ValueId> g = c.add_op(PrimId::attention_grad, p, in);
    const ValueId dk_rows = b.reshape(g[1], Shape{2, 2, 320});
    k.outputs = {b.cast(b.reshape(fwd[0], Shape{2, 4, 320}), DType::bf16),
                 fwd[1],
                 b.cast(g[0], DType::bf16),
                 b.cast(dk_rows, DType::bf16),
                 b.add(dk_rows, dk_rows),
                 dv_cast ? b.cast(g[2], DType::bf16) : b.add(g[2], g[2])};
    for (size_t i = 0; i < in.size(); ++i)
      k.bindings.push_back(testing::random_tensor({c.info(in[i]).shape, DType::f32}, 90 + i));
    std::vector<ValueId> outs = k.outputs;
    const Circuit a = absorb_casts(c, outs);
    size_t casts = 0, copying = 0;
    for (const Op& op : a.ops()) {
      casts += op.is(PrimId::cast);
      copying += (op.is(PrimId::attention) || op.is(PrimId::attention_grad)) && AttentionParams::of(op).bf16_copies;
    }
    EXPECT_EQ(casts, dv_cast ? 0u : 2u) << a.dump("absorbed");
    EXPECT_EQ(copying, dv_cast ? 2u : 1u) << a.dump("absorbed");
    const std::vector<HostTensor> want = execute(c, k.bindings, k.outputs), got = execute(a, k.bindings, outs);
    for (size_t o = 0; o < want.size(); ++o) {
      ASSERT_EQ(got[o].dtype(), want[o].dtype()) << "output " << o;
      EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << "output " << o;
    }
  }
}

TEST(AbsorbCasts, TheSwitchKeepsTheCasts) {
  Case k = norm_then_matmul(37, false);
  std::vector<ValueId> outs = k.outputs;
  EXPECT_EQ(
      casts_of_rows(optimize(k.circuit, outs, cuda_target(90, /*fake=*/true), parse_pipeline_options("-absorb_casts"))),
      1u);
}

// CPU plans: where the Target's bf16 products are oneDNN's (bf16 storage) the row op writes the
// bf16 copy, as on the GPU, with the cast's bits on the Eigen executor (its matmul run here by the
// widened reference); where they are rounded_f32 no cast to bf16 is left to absorb (the rounding
// is folded into the row op's f32 output instead).
TEST(AbsorbCasts, CpuPlansThatStoreBf16AbsorbTheCastsToo) {
  Case k = norm_then_matmul(37, true);
  Target onednn = cpu_target(), rounded = cpu_target();
  onednn.cpu_bf16 = CpuBf16Products::onednn;
  rounded.cpu_bf16 = CpuBf16Products::rounded_f32;
  std::vector<ValueId> outs = k.outputs;
  const Circuit stored = optimize(k.circuit, outs, onednn);
  EXPECT_EQ(casts_of_rows(stored), 0u) << stored.dump("onednn");
  size_t bf16_row_outputs = 0;
  for (const Op& op : stored.ops())
    if (op.is(PrimId::fused_rows))
      for (ValueId v : op.outputs) bf16_row_outputs += stored.info(v).dtype == DType::bf16;
  EXPECT_EQ(bf16_row_outputs, 1u) << stored.dump("onednn");
  const std::vector<HostTensor> want = Program(k.circuit, k.outputs, rounded).run(k.bindings),
                                got = Program(stored, outs, rounded).run(k.bindings);
  for (size_t o = 0; o < want.size(); ++o) EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << o;
  std::vector<ValueId> rounded_outs = k.outputs;
  const Circuit held = optimize(k.circuit, rounded_outs, rounded);
  for (const Op& op : held.ops()) EXPECT_FALSE(op.is(PrimId::cast)) << held.dump("rounded_f32");
}

// Params round trip, and the checks: bf16 outputs only in f32 ops.
TEST(AbsorbCasts, Bf16OutputsRoundTripThroughParamsAndNeedAnF32Op) {
  RowProgram rp;
  rp.inputs = 1;
  rp.domain = Shape{3, 5};
  rp.output_per_row = {false, false};
  rp.output_bodies = {se::in(0), se::in(0) * se::c(2.0)};
  rp.output_bf16 = {false, true};
  const RowProgram back = RowProgram::from_params(rp.to_params(DType::f32));
  EXPECT_FALSE(back.stored_bf16(0));
  EXPECT_TRUE(back.stored_bf16(1));
  EXPECT_NE(back.describe().find("out1:bf16"), std::string::npos) << back.describe();
  Circuit c;
  const ValueId x = c.add_external({Shape{3, 5}, DType::f64}, ValueRole::Input, "x");
  EXPECT_THROW(c.add_op(PrimId::fused_rows, rp.to_params(DType::f64), {x}), Error);
  Circuit ok;
  const ValueId y = ok.add_external({Shape{3, 5}, DType::f32}, ValueRole::Input, "y");
  const std::vector<ValueId> out = ok.add_op(PrimId::fused_rows, rp.to_params(DType::f32), {y});
  EXPECT_EQ(ok.info(out[0]).dtype, DType::f32);
  EXPECT_EQ(ok.info(out[1]).dtype, DType::bf16);
}

}  // namespace
}  // namespace kiln
