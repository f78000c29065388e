// T3/T4 for the lowering of every Prim, over the lowering cases of each family's case list
// (tests/prims/<family>.cpp): each case builds a one-op circuit on random f32 inputs
// (sizes that are not multiples of 32, 128 or the matmul tile), runs it on the Eigen executor
// and, lowered, in the SIMT simulator behind the fake driver, and compares. Every kernel the
// cases generate then passes ptxas for sm_80 and sm_90.
//
// Tolerances (norm-relative, f32): pointwise 1e-5 (exact IEEE ops, ex2/lg2 within 2 ulp); sums
// 1e-5 (rows of <= 1000 terms summed in another order); matmul 1e-5 (K <= 91, FFMA); moves,
// gathers, casts, masks and Philox bits exactly.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <set>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/multi_tensor.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/cuda/lower/util.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

#include "device_test_util.hpp"
#include "lowering_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"
#include "ptxas_skip.hpp"

namespace kiln {
namespace {

using testing::BuildFn;
using testing::check_case;
using testing::f32;
using testing::i32;
using testing::InputSpec;
using testing::lowered_kernels;
using testing::LoweringCase;

std::vector<LoweringCase> cases() { return testing::all_prim_cases().lowering; }

// Every case on every Target of testing::case_targets().
using TargetCase = std::tuple<LoweringCase, testing::NamedTarget>;
class LoweringTest : public ::testing::TestWithParam<TargetCase> {};

TEST_P(LoweringTest, MatchesEigen) { testing::check_case_on(std::get<0>(GetParam()), std::get<1>(GetParam()).target); }

INSTANTIATE_TEST_SUITE_P(EveryPrim, LoweringTest,
                         ::testing::Combine(::testing::ValuesIn(cases()), ::testing::ValuesIn(testing::case_targets())),
                         [](const ::testing::TestParamInfo<TargetCase>& i) {
                           return std::get<0>(i.param).name + "_on_" + std::get<1>(i.param).name;
                         });

// T5: the same kernels on a real GPU (its own Target).
class GpuLoweringTest : public ::testing::TestWithParam<LoweringCase> {};

TEST_P(GpuLoweringTest, GpuMatchesEigen) {
  KILN_GPU_OR_SKIP(rt);
  check_case(GetParam(), *rt);
}

INSTANTIATE_TEST_SUITE_P(EveryPrim, GpuLoweringTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<LoweringCase>& i) { return i.param.name; });

TEST(Lowering, EveryRegisteredPrimHasALoweringAndACase) {
  std::set<std::string> covered;
  for (const LoweringCase& lc : cases()) {
    testing::Harness h(lc.inputs, lc.build, 7);
    for (const Op& op : h.circuit.ops()) covered.insert(op.prim->name);
  }
  covered.insert("assign");  // exercised by the engine and GPT step tests (persistent buffers)
  for (const PrimDef* p : PrimRegistry::instance().all()) {
    if (p->id == PrimId::user) continue;  // registered by tests of user Prims (test_user_prims.cpp)
    EXPECT_FALSE(cuda::lowering_summary(p->id).empty()) << p->name << " has no lowering";
    EXPECT_TRUE(covered.count(p->name)) << p->name << " has no lowering case";
  }
}

// Every kernel of every case, lowered for each CUDA Target of the list, passes ptxas (sm_80 and
// sm_90; wgmma's kernels sm_90a only). Kernels are named by their structure, so those a Target
// shares with sm_80's lowering (most of sm_90's) are not checked twice.
class LoweringPtxasTest : public ::testing::TestWithParam<testing::NamedTarget> {};

TEST_P(LoweringPtxasTest, EveryCaseKernelPassesPtxas) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  std::vector<std::unique_ptr<cuda::DeviceProgram>> programs, sm80_programs;
  std::vector<const kir::Kernel*> kernels = lowered_kernels(cases(), programs, GetParam().target);
  if (GetParam().name != "sm80") {
    std::set<std::string> sm80;
    for (const kir::Kernel* k : lowered_kernels(cases(), sm80_programs, cuda_target(80, /*fake=*/true)))
      sm80.insert(k->name);
    std::erase_if(kernels, [&](const kir::Kernel* k) { return sm80.count(k->name) > 0; });
  }
  if (GetParam().target.wgmma()) {  // the bf16 cases' products on wgmma among them
    EXPECT_TRUE(std::any_of(kernels.begin(), kernels.end(), [](const kir::Kernel* k) { return kir::needs_sm90a(*k); }));
  }
  std::printf("%zu kernels of their own for %s\n", kernels.size(), GetParam().name.c_str());
  testing::expect_ptxas_accepts(kernels);
}

std::vector<testing::NamedTarget> cuda_case_targets() {
  std::vector<testing::NamedTarget> out;
  for (const testing::NamedTarget& t : testing::case_targets())
    if (t.target.gpu()) out.push_back(t);
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, LoweringPtxasTest, ::testing::ValuesIn(cuda_case_targets()),
                         [](const ::testing::TestParamInfo<testing::NamedTarget>& i) { return i.param.name; });

// The attention kernels at the shapes models give them (heads inside: (B, T, H, d)): GPT-2
// small's head size 64 and the default GPT's 32 take the tiled forward, 128 the warp-per-row
// one; each plain, with dropout on the probabilities, and with dropout, a (B, 1, 1, T) padding
// mask and bf16 operands (at 64 and 32 the tensor-core kernels). Registers are printed for
// docs/BENCHMARKS.md.
TEST(Lowering, AttentionKernelsAtModelShapesPassPtxasWithoutSpills) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (const Shape& shape : {Shape{8, 1024, 12, 64}, Shape{16, 64, 4, 32}, Shape{1, 512, 8, 128}})
    for (auto [keep, mask] : {std::pair{1.0, false}, std::pair{0.9, false}, std::pair{0.9, true}}) {
      Circuit c;
      std::vector<ValueId> x;
      for (int i = 0; i < 4; ++i) x.push_back(c.add_external({shape, DType::f32}, ValueRole::Input));
      std::vector<ValueId> qkv = {x[0], x[1], x[2]};
      if (mask) qkv.push_back(c.add_external({Shape{shape[0], 1, 1, shape[1]}, DType::f32}, ValueRole::Input));
      if (keep < 1.0) {
        qkv.push_back(c.add_external({Shape{2}, DType::i32}, ValueRole::Input));
        qkv.push_back(c.add_external({Shape{}, DType::i32}, ValueRole::Input));
      }
      const Params p = AttentionParams{true, 0.125, true, 0, 1, keep, mask, mask}.to_params();
      std::vector<ValueId> f = c.add_op(PrimId::attention, p, qkv);
      std::vector<ValueId> grad_in = qkv;
      grad_in.insert(grad_in.end(), {f[0], f[1], x[3]});
      c.add_op(PrimId::attention_grad, p, grad_in);
      for (int op = 0; op < 2; ++op)
        for (const cuda::Launch& l : cuda::lower(c, op, cuda::device_target(testing::fake_runtime())).launches)
          for (int sm : {80, 90}) {
            const cuda::PtxasResult r = cuda::run_ptxas(kir::print_ptx(*l.kernel, sm), sm);
            EXPECT_TRUE(r.ok) << r.log;
            EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << l.kernel->name << " sm_" << sm << ": " << r.log;
            std::printf("%s keep %.1f%s %s sm_%d: %d registers\n", shape.str().c_str(), keep, mask ? " mask bf16" : "",
                        l.kernel->name.c_str(), sm, r.registers);
          }
    }
}

// Attention with bf16 operands, with or without a mask and no dropout, at head sizes 16-64
// (multiples of 16) runs on the tensor-core kernels (attention_mma.cpp): GPT-2 small's
// (8, 1024, 12, 64) and the default GPT's (16, 64, 4, 32), heads inside. They pass ptxas for sm_80 and sm_90 without
// spills (registers printed for docs/BENCHMARKS.md); --attention-path simt keeps the FFMA kernels.
std::vector<std::string> bf16_attention_kernels(const Shape& shape, bool check_ptxas, bool mask = false,
                                                AttentionPath path = AttentionPath::mma) {
  Target target = cuda::device_target(testing::fake_runtime());
  target.attention = path;
  Circuit c;
  std::vector<ValueId> x;
  for (int i = 0; i < 4; ++i) x.push_back(c.add_external({shape, DType::f32}, ValueRole::Input));
  std::vector<ValueId> qkv = {x[0], x[1], x[2]};
  if (mask) qkv.push_back(c.add_external({Shape{shape[0], 1, 1, shape[1]}, DType::f32}, ValueRole::Input));
  const Params p = AttentionParams{true, 0.125, true, 0, 1, 1.0, mask, true}.to_params();
  std::vector<ValueId> f = c.add_op(PrimId::attention, p, qkv);
  std::vector<ValueId> grad_in = qkv;
  grad_in.insert(grad_in.end(), {f[0], f[1], x[3]});
  c.add_op(PrimId::attention_grad, p, grad_in);
  std::vector<std::string> names;
  for (int op = 0; op < 2; ++op)
    for (const cuda::Launch& l : cuda::lower(c, op, target).launches) {
      names.push_back(l.kernel->name);
      if (!check_ptxas) continue;
      for (int sm : {80, 90}) {
        const cuda::PtxasResult r = cuda::run_ptxas(kir::print_ptx(*l.kernel, sm), sm);
        EXPECT_TRUE(r.ok) << r.log;
        EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << l.kernel->name << " sm_" << sm << ": " << r.log;
        std::printf("%s bf16%s %s sm_%d: %d registers, %lld bytes of shared memory\n", shape.str().c_str(),
                    mask ? " mask" : "", l.kernel->name.c_str(), sm, r.registers,
                    static_cast<long long>(l.kernel->shared_bytes()));
      }
    }
  return names;
}

TEST(Lowering, Bf16AttentionRunsOnTensorCores) {
  for (const Shape& shape : {Shape{8, 1024, 12, 64}, Shape{16, 64, 4, 32}}) {
    const std::vector<std::string> names = bf16_attention_kernels(shape, false);
    ASSERT_EQ(names.size(), 3u);
    for (const std::string& n : bf16_attention_kernels(shape, false, true))
      EXPECT_NE(n.find("_mma"), std::string::npos) << n;
    EXPECT_EQ(names[0].rfind("kiln_attention_mma", 0), 0u) << names[0];
    EXPECT_EQ(names[1].rfind("kiln_attention_grad_q_mma", 0), 0u) << names[1];
    EXPECT_EQ(names[2].rfind("kiln_attention_grad_kv_mma", 0), 0u) << names[2];
    for (const std::string& n : bf16_attention_kernels(shape, false, false, AttentionPath::simt))
      EXPECT_EQ(n.find("_mma"), std::string::npos) << n;
  }
}

TEST(Lowering, Bf16AttentionKernelsPassPtxasWithoutSpills) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (const Shape& shape : {Shape{8, 1024, 12, 64}, Shape{16, 64, 4, 32}})
    for (bool mask : {false, true}) bf16_attention_kernels(shape, true, mask);
}

// The f32 -> bf16 cast moves 8 elements a thread where both buffers are 16-byte aligned (the
// rest one a thread), and one a thread throughout where either is not: launched here on buffers
// offset by 4 and 2 bytes, and on aligned ones, for counts with and without a remainder of 8.
TEST(Lowering, Bf16CastIsExactOnAlignedAndUnalignedBuffers) {
  cuda::Runtime& rt = testing::fake_runtime();
  for (int64_t n : {1000, 1003}) {
    Circuit c;
    ValueId x = c.add_external({Shape{n}, DType::f32}, ValueRole::Input);
    Params p;
    p.dtype = DType::bf16;
    c.add_op(PrimId::cast, p, {x});
    const cuda::LoweredOp lo = cuda::lower(c, 0, cuda::device_target(testing::fake_runtime()));
    ASSERT_EQ(lo.launches.size(), 1u);
    const cuda::Launch& l = lo.launches[0];
    EXPECT_EQ(l.kernel->name.rfind("kiln_cast_bf16x8", 0), 0u) << l.kernel->name;
    std::vector<float> in(static_cast<size_t>(n));
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = std::ldexp(1.0f + static_cast<float>(i % 97) / 97.0f, static_cast<int>(i % 9) - 4);
    cuda::LoadedKernel k = rt.load(*l.kernel);
    for (size_t shift : {0, 1}) {  // elements: 4 bytes into the f32 buffer, 2 into the bf16 one
      cuda::CUdeviceptr din = rt.alloc((in.size() + 1) * 4), dout = rt.alloc((in.size() + 1) * 2);
      rt.upload(din + 4 * shift, in.data(), in.size() * 4);
      rt.launch(k, {l.grid.x, l.grid.y, l.grid.z}, {l.block.x, l.block.y, l.block.z},
                {din + 4 * shift, dout + 2 * shift});
      rt.synchronize();
      std::vector<uint16_t> out(in.size());
      rt.download(out.data(), dout + 2 * shift, out.size() * 2);
      rt.free(din);
      rt.free(dout);
      for (size_t i = 0; i < in.size(); ++i)
        ASSERT_EQ(out[i], f32_to_bf16(in[i]).bits) << "n " << n << " shift " << shift << " element " << i;
    }
  }
}

// column_sums over rows of a multiple of 4 takes the quad kernel (16-byte loads of four
// columns) where the inputs are 16-byte aligned and four 4-byte loads where one is not (a view
// may start anywhere): launched here with the row input aligned and 4 bytes on, over 600 rows
// split into chunks, the two give the same bits, within f32's error of an f64 sum.
TEST(Lowering, ColumnSumsOnQuadsGiveTheSameBitsOnUnalignedInputs) {
  cuda::Runtime& rt = testing::fake_runtime();
  Circuit c;
  const ValueId x = c.add_external({Shape{2, 300, 12}, DType::f32}, ValueRole::Input, "x");
  const ValueId w = c.add_external({Shape{2, 300, 1}, DType::f32}, ValueRole::Input, "w");
  const ColumnSumsParams p{Shape{2, 300, 12}, {se::in(0) * se::in(1), se::in(0)}, DType::f32};
  c.add_op(PrimId::column_sums, p.to_params(), {x, w});
  const cuda::LoweredOp lo = cuda::lower(c, 0, cuda::device_target(testing::fake_runtime()));
  ASSERT_EQ(lo.launches.size(), 1u);
  const cuda::Launch& l = lo.launches[0];
  EXPECT_EQ(l.kernel->name.rfind("kiln_column_sums_quads", 0), 0u) << l.kernel->name;
  EXPECT_NE(lo.summary.find("last block adds its chunks"), std::string::npos) << lo.summary;
  ASSERT_EQ(lo.scratch_bytes.size(), 2u);
  std::vector<float> xs(600 * 12), ws(600);
  for (size_t i = 0; i < xs.size(); ++i)
    xs[i] = std::ldexp(1.0f + static_cast<float>(i % 89) / 89.0f, static_cast<int>(i % 7) - 3);
  for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.5f + static_cast<float>(i % 13) / 13.0f;
  cuda::LoadedKernel k = rt.load(*l.kernel);
  std::vector<std::vector<float>> results;
  for (size_t shift : {0, 1}) {
    cuda::CUdeviceptr dx = rt.alloc((xs.size() + 1) * 4), dw = rt.alloc(ws.size() * 4), d0 = rt.alloc(12 * 4),
                      d1 = rt.alloc(12 * 4), part = rt.alloc(lo.scratch_bytes[0]),
                      counters = rt.alloc(lo.scratch_bytes[1]);
    rt.upload(dx + 4 * shift, xs.data(), xs.size() * 4);
    rt.upload(dw, ws.data(), ws.size() * 4);
    rt.memset_zero(counters, lo.scratch_bytes[1]);
    rt.launch(k, {l.grid.x, l.grid.y, l.grid.z}, {l.block.x, l.block.y, l.block.z},
              {dx + 4 * shift, dw, d0, d1, part, counters});
    rt.synchronize();
    std::vector<float> out(24);
    rt.download(out.data(), d0, 48);
    rt.download(out.data() + 12, d1, 48);
    for (cuda::CUdeviceptr d : {dx, dw, d0, d1, part, counters}) rt.free(d);
    results.push_back(out);
  }
  for (size_t j = 0; j < 24; ++j) EXPECT_EQ(results[0][j], results[1][j]) << "sum " << j / 12 << ", column " << j % 12;
  for (size_t col = 0; col < 12; ++col) {
    double weighted = 0, plain = 0, magnitude = 0;
    for (size_t r = 0; r < 600; ++r) {
      weighted += static_cast<double>(xs[r * 12 + col]) * ws[r];
      plain += xs[r * 12 + col];
      magnitude += std::abs(static_cast<double>(xs[r * 12 + col]));
    }
    // f32 accumulation: at most rows 2^-24 sum |x| (as reduce), with |w| < 1.5.
    EXPECT_NEAR(results[0][col], weighted, 600 * std::ldexp(1.5 * magnitude, -24)) << "column " << col;
    EXPECT_NEAR(results[0][12 + col], plain, 600 * std::ldexp(magnitude, -24)) << "column " << col;
  }
}

TEST(Lowering, BadIndexOnTheDeviceIsAnErrorNamingTheOp) {
  std::vector<InputSpec> specs = {f32({5, 3}), i32({4}, 0, 5)};
  testing::Harness h(specs, [](Builder& b, const std::vector<ValueId>& x) { return b.gather_rows(x[0], x[1]); });
  h.bindings[1].set(2, 9);
  cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime());
  try {
    dp.run(h.bindings);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gather_rows"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("9"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(input [4])"), std::string::npos) << e.what();  // the indices' shape
  }
}

// Every op of the cases whose kernels check indices (a status argument) names the input that
// holds them (PrimDef::index_input: an i32 input without a gradient), which device index errors
// name: a gather-like Prim added without it fails here.
TEST(Lowering, PrimsWhoseKernelsCheckIndicesNameTheirIndexInput) {
  std::set<std::string> checking;
  for (const LoweringCase& lc : cases()) {
    testing::Harness h(lc.inputs, lc.build);
    for (size_t i = 0; i < h.circuit.ops().size(); ++i) {
      const Op& op = h.circuit.ops()[i];
      bool status = false;
      for (const cuda::Launch& l :
           cuda::lower(h.circuit, static_cast<int>(i), cuda::device_target(testing::fake_runtime())).launches)
        for (const cuda::ArgRef& a : l.args) status = status || a.kind == cuda::ArgRef::Kind::Status;
      if (!status) continue;
      checking.insert(op.prim->name);
      const int k = op.prim->index_input;
      ASSERT_GE(k, 0) << op.prim->name << " checks indices but names no index input";
      EXPECT_EQ(h.circuit.info(op.inputs[static_cast<size_t>(k)]).dtype, DType::i32) << op.prim->name;
      const auto& nd = op.prim->nondiff_inputs;
      EXPECT_NE(std::find(nd.begin(), nd.end(), k), nd.end()) << op.prim->name;
    }
  }
  EXPECT_EQ(checking, (std::set<std::string>{"gather_rows", "gather_last", "scatter_add_rows", "one_hot"}));
}

TEST(Lowering, F64IsAClearError) {
  std::vector<InputSpec> specs = {{Shape{3}, DType::f64}};
  testing::Harness h(specs, [](Builder& b, const std::vector<ValueId>& x) { return b.add(x[0], x[0]); });
  try {
    cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pointwise"), std::string::npos) << e.what();
  }
}

// GELU (tanh form) and its gradient in the kernels, element by element against f64 over x in
// [-20, 20] and special values. The f64 values are taken in the sigmoid form (x s, s =
// sigmoid(2 u)), which has no cancellation: the tanh form's 1 + tanh(u) keeps no correct digit
// of GELU(-5) = -2.3e-7 in f32 (the kernels' tanh form failed this test, first at x = -9.94: a
// gradient of 0 for -1.02e-35). Bound: 1e-5
// relative, plus 1e-7 of s for the gradient (a sum of terms of size s that crosses 0 near x =
// -0.75), plus 1e-35 (e = 2^z overflows f32 from z = 128 on, where s becomes 0: results of
// magnitude under about 1e-35 may be 0).
TEST(Lowering, GeluAndItsGradientMatchF64ElementByElement) {
  std::vector<float> xs;
  for (int i = -20000; i <= 20000; ++i) xs.push_back(static_cast<float>(i) * 1e-3f);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, -1e-7f, 1e30f, -1e30f}) xs.push_back(x);
  Circuit c;
  const ValueId x = c.add_external({Shape{static_cast<int64_t>(xs.size())}, DType::f32}, ValueRole::Input, "x");
  Builder b(c, "test");
  const std::vector<ValueId> outs = {b.pointwise(se::gelu(se::in(0)), {x}), b.pointwise(se::gelu_grad(se::in(0)), {x})};
  HostTensor in = HostTensor::zeros(DType::f32, c.info(x).shape);
  for (size_t i = 0; i < xs.size(); ++i) in.set(static_cast<int64_t>(i), xs[i]);
  cuda::DeviceProgram dp(c, outs, testing::fake_runtime());
  const std::vector<HostTensor> got = dp.run({in});
  const double k = std::sqrt(2.0 / std::numbers::pi);
  double worst[2] = {0, 0};
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], e = std::exp(-2.0 * k * (v + 0.044715 * v * v * v));
    const double s = 1.0 / (1.0 + e), one_minus_s = std::isinf(e) ? 1.0 : e / (1.0 + e);
    const double want[2] = {v * s, s + v * s * one_minus_s * 2.0 * k * (1.0 + 3.0 * 0.044715 * v * v)};
    const double scale[2] = {0.0, 1e-7 * s};
    for (int o = 0; o < 2; ++o) {
      const double g = got[static_cast<size_t>(o)].get(static_cast<int64_t>(i));
      const double err = std::abs(g - want[o]), bound = 1e-5 * std::abs(want[o]) + scale[o] + 1e-35;
      worst[o] = std::max(worst[o], err / bound);
      ASSERT_LE(err, bound) << (o == 0 ? "gelu" : "gelu_grad") << "(" << v << ") = " << g << ", f64 " << want[o];
    }
  }
  std::printf("gelu, gelu_grad: worst error %.3f and %.3f of the bound\n", worst[0], worst[1]);
  // x = +-inf: GELU gives inf and NaN (0.5 x (1 + tanh u) at -inf is -inf * 0), as the reference.
  HostTensor inf = HostTensor::zeros(DType::f32, c.info(x).shape);
  inf.set(0, std::numeric_limits<double>::infinity());
  inf.set(1, -std::numeric_limits<double>::infinity());
  const std::vector<HostTensor> at_inf = dp.run({inf});
  EXPECT_EQ(at_inf[0].get(0), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(at_inf[0].get(1)));
}

TEST(Lowering, KernelsAreNamedByTheirStructureAndPrintIdentically) {
  auto build = [](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], x[1]); };
  testing::Harness h1({f32({9, 10}), f32({10, 11})}, build), h2({f32({9, 10}), f32({10, 11})}, build),
      h3({f32({9, 10}), f32({10, 12})}, build);
  auto name = [](const testing::Harness& h) {
    return cuda::lower(h.circuit, 0, cuda::device_target(testing::fake_runtime())).launches[0].kernel->name;
  };
  EXPECT_EQ(name(h1), name(h2));
  EXPECT_NE(name(h1), name(h3));
  auto k1 = cuda::lower(h1.circuit, 0, cuda::device_target(testing::fake_runtime())).launches[0].kernel,
       k2 = cuda::lower(h2.circuit, 0, cuda::device_target(testing::fake_runtime())).launches[0].kernel;
  EXPECT_EQ(kir::print_ptx(*k1, 90), kir::print_ptx(*k2, 90));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The online-softmax cases (tests/prims/fused_rows.cpp) take the one-pass path: a change that
// stopped recognizing the pair would leave them passing on two passes.
TEST(Lowering, SoftmaxStatisticsTakeOnePass) {
  int found = 0;
  for (const LoweringCase& lc : cases()) {
    if (lc.name.find("fused_rows_online_softmax") == std::string::npos) continue;
    ++found;
    testing::Harness h(lc.inputs, lc.build, 7);
    cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime());
    EXPECT_NE(dp.dump().find("in one pass"), std::string::npos) << lc.name << "\n" << dp.dump();
  }
  EXPECT_EQ(found, 3);
}

// A row kernel evaluates the parts of its bodies that are the same along a row once a row, before
// the pass that reads them (hoist_uniform, fused_rows.cpp): a layer norm's rsqrt(var + eps),
// which the third reduction's pass and the output pass both read (one sqrt.rn each: 2 in the
// kernel, where each pass's 4 unrolled columns and its tail took one, 10), and var / (v + eps)
// of a per-row input v (one division; with the two 1 / sqrt and the two means' / n, 5 in all).
// Rows of 300: the unrolled columns and the tail. Against Eigen.
TEST(Lowering, RowKernelsEvaluateRowUniformPartsOncePerRow) {
  testing::Harness h({f32({6, 300}), f32({6, 1}, 0.5, 2)}, [](Builder& b, const std::vector<ValueId>& x) {
    ValueId mean = b.reduce(ReduceKind::Mean, x[0], 1);
    ValueId d = b.sub(x[0], mean);
    ValueId var = b.reduce(ReduceKind::Mean, b.mul(d, d), 1);
    ValueId y = b.mul(d, b.pointwise(se::rsqrt(se::in(0) + se::c(1e-5)), {var}));
    ValueId scale = b.pointwise(se::in(0) / (se::in(1) + se::c(1e-5)), {var, x[1]});
    ValueId z = b.reduce(ReduceKind::Sum, b.mul(y, scale), 1);
    return b.concat({b.reshape(y, Shape{1800}), b.reshape(z, Shape{6})}, 0);
  });
  std::vector<ValueId> outs{h.output};
  const Circuit optimized = optimize(h.circuit, outs, cuda_target(90, /*fake=*/true));
  cuda::DeviceProgram dp(optimized, outs, testing::fake_runtime(), cuda_target(90, /*fake=*/true));
  size_t row_kernels = 0;
  for (const auto& kl : dp.kernels()) {
    const kir::Kernel& k = *kl.launch->kernel;
    if (!k.name.starts_with("kiln_fused_rows")) continue;
    ++row_kernels;
    const std::string ptx = kir::print_ptx(k, 90);
    EXPECT_EQ(testing::occurrences(ptx, "sqrt.rn.f32"), 2u) << ptx;
    EXPECT_EQ(testing::occurrences(ptx, "div.rn.f32"), 5u) << ptx;
  }
  EXPECT_EQ(row_kernels, 1u) << optimized.dump("optimized");
  const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), 1e-5);
}

// The tensor-core attention kernels (attention_mma.cpp): the staged tiles' stores (8 bytes a
// lane), the ldmatrix rows (16 bytes a lane, rows padded to 144 bytes at head size 64) and the
// lse/D rows, forward and both backward launches, causal over two tiles, at head sizes 64, 128
// (rows of 272 bytes, tiles of 32) and 80 (rows of 176 bytes).
void expect_no_attention_bank_conflicts(int64_t d) {
  const Params p = AttentionParams{true, 0.125, false, 0, 1, 1.0, false, true}.to_params();
  const Shape qkv{2, 2, 100, d};
  testing::Harness h({f32(qkv), f32(qkv), f32(qkv), f32(qkv)}, [&](Builder& bl, const std::vector<ValueId>& x) {
    std::vector<ValueId> f = bl.circuit().add_op(PrimId::attention, p, {x[0], x[1], x[2]});
    std::vector<ValueId> g = bl.circuit().add_op(PrimId::attention_grad, p, {x[0], x[1], x[2], f[0], f[1], x[3]});
    return bl.concat(g, -1);
  });
  cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime());
  cuda::fake_driver_count_bank_conflicts(true);
  dp.run(h.bindings);
  const auto stats = cuda::fake_driver_kernel_stats();
  cuda::fake_driver_count_bank_conflicts(false);
  int kernels = 0;
  for (const auto& [name, s] : stats) {
    if (name.find("_mma") == std::string::npos) continue;
    ++kernels;
    EXPECT_GT(s.shared_requests, 0) << name;
    EXPECT_EQ(s.bank_conflicts, 0) << name << " d " << d << ": " << s.shared_wavefronts << " wavefronts for "
                                   << s.shared_requests << " requests";
  }
  EXPECT_EQ(kernels, 3);
}

TEST(Lowering, Bf16AttentionSharedMemoryHasNoBankConflicts) {
  for (int64_t d : {64, 128, 80, 32, 16, 48}) expect_no_attention_bank_conflicts(d);
}

}  // namespace
}  // namespace kiln
