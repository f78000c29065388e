// User Prims and custom VJPs (core/user_prim.hpp): a softcap Prim with all four pieces checked in
// f64 by finite differences (and a planted wrong VJP caught), the registry's checks (names, missing
// pieces, dtypes), fusion of its pointwise body with kiln's own in GPU plans and its run in the
// SIMT simulator against the CPU reference, a GPU plan meeting a CPU-only Prim, and custom VJPs
// (a straight-through rounding; a softplus whose custom backward the gradient check verifies).
#include <gtest/gtest.h>

#include <cmath>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/gradcheck.hpp>
#include <kiln/core/prim_catalogue.hpp>
#include <kiln/core/user_prim.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/lower/util.hpp>

#include "device_test_util.hpp"
#include "expect_error.hpp"
#include "prim_test_util.hpp"
#include "ptxas_skip.hpp"

namespace kiln {
namespace {

// softcap(x) = cap * tanh(x / cap), cap = params.reals[0]; the shape and dtype of x.
UserPrimSpec softcap_spec(const std::string& name) {
  UserPrimSpec s;
  s.name = name;
  s.shape = [](const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
    if (in.size() != 1) ctx.fail("takes one input, received " + std::to_string(in.size()));
    if (p.reals.size() != 1 || !(p.reals[0] > 0)) ctx.fail("needs one positive cap in params.reals");
    return std::vector<ValueInfo>{in[0]};
  };
  s.reference = [](const PrimCall& call) {
    const double cap = call.params.reals[0];
    const HostTensor& x = *call.inputs[0];
    for (int64_t i = 0; i < x.numel(); ++i) call.outputs[0].set(i, cap * std::tanh(x.get(i) / cap));
  };
  s.vjp = [](const VjpArgs& a) {
    const double cap = a.params.reals[0];
    Tensor t = a.outputs[0] / cap;  // tanh(x / cap)
    return std::vector<Tensor>{a.out_grads[0] * (1.0 - t * t)};
  };
  s.pointwise_body = [](const Params& p) {
    const double cap = p.reals[0];
    return se::c(cap) * se::tanh(se::in(0) / se::c(cap));
  };
  s.describe = [](const Params& p) { return "cap=" + std::to_string(p.reals[0]); };
  return s;
}

const UserPrim& softcap() {
  static const UserPrim p = register_prim(softcap_spec("test_softcap"));
  return p;
}

Params cap(double c) {
  Params p;
  p.reals = {c};
  return p;
}

HostTensor varied(Shape shape, DType dtype, double scale = 3.0) {
  HostTensor t = HostTensor::zeros(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, scale * std::sin(0.7 * static_cast<double>(i) + 0.3));
  return t;
}

TEST(UserPrims, SoftcapRunsItsReferenceAndPassesTheGradientCheck) {
  const UserPrim& sc = softcap();
  Tensor x = Tensor::from_host(varied(Shape{3, 5}, DType::f32));
  const std::vector<double> got = sc({x}, cap(2.0)).to_vector(), xs = x.to_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], 2.0 * std::tanh(xs[i] / 2.0), 1e-6) << i;

  auto f = [&](const std::vector<Tensor>& in) { return sum(sc({in[0] * in[1]}, cap(2.0)) * in[1]); };
  ad::GradCheckResult r = gradcheck(f, {varied(Shape{3, 5}, DType::f64), varied(Shape{1, 5}, DType::f64, 1.0)});
  EXPECT_TRUE(r.ok) << r.report;
}

// The check this rests on: a VJP missing the tanh' factor fails the same gradient check.
TEST(UserPrims, APlantedWrongVjpFailsTheGradientCheck) {
  UserPrimSpec s = softcap_spec("test_softcap_wrong_vjp");
  s.vjp = [](const VjpArgs& a) { return std::vector<Tensor>{a.out_grads[0]}; };
  const UserPrim wrong = register_prim(s);
  auto f = [&](const std::vector<Tensor>& in) { return sum(square(wrong({in[0]}, cap(2.0)))); };
  ad::GradCheckResult r = gradcheck(f, {varied(Shape{4, 3}, DType::f64)});
  EXPECT_FALSE(r.ok) << r.report;
}

TEST(UserPrims, TrainingStepsUseTheRuleThroughBackward) {
  Engine& e = Engine::current();
  HostTensor init = varied(Shape{4}, DType::f32, 0.5);
  Tensor w = Tensor::parameter("test_softcap_w", init);
  Tensor x = Tensor::from_host(varied(Shape{2, 4}, DType::f32));
  Tensor loss = sum(softcap()({x * w}, cap(1.5)));
  loss.backward();
  e.realize();
  const std::vector<double> g = w.grad().to_vector(), xs = x.to_vector();
  for (int64_t j = 0; j < 4; ++j) {
    double want = 0;
    for (int64_t r = 0; r < 2; ++r) {
      const double xv = xs[static_cast<size_t>(r * 4 + j)], t = std::tanh(xv * init.get(j) / 1.5);
      want += xv * (1 - t * t);
    }
    EXPECT_NEAR(g[static_cast<size_t>(j)], want, 1e-5) << j;
  }
}

TEST(UserPrims, RegistrationRefusesClashesMalformedNamesAndMissingPieces) {
  softcap();
  // A clash names both registrations (this file, twice).
  expect_error([] { register_prim(softcap_spec("test_softcap")); },
               {"'test_softcap' is registered twice", "test_user_prims.cpp:", "and at test_user_prims.cpp:"});
  expect_error([] { register_prim(softcap_spec("matmul")); }, {"'matmul'", "kiln's own Prim", "matmul.cpp"});
  expect_error([] { register_prim(softcap_spec("Soft Cap")); }, {"'Soft Cap'", "lower case"});
  for (const char* piece : {"shape rule", "CPU reference", "VJP rule"}) {
    UserPrimSpec s = softcap_spec(std::string("test_missing_") + (piece[0] == 's'   ? "shape"
                                                                  : piece[0] == 'C' ? "ref"
                                                                                    : "vjp"));
    if (piece[0] == 's') s.shape = nullptr;
    if (piece[0] == 'C') s.reference = nullptr;
    if (piece[0] == 'V') s.vjp = nullptr;
    expect_error([&] { register_prim(s); }, {"has no", piece, "test_user_prims.cpp:"});
  }
  UserPrimSpec f32_only = softcap_spec("test_f32_only");
  f32_only.dtypes = {DType::f32};
  expect_error([&] { register_prim(f32_only); }, {"no f64 in its dtypes"});
  UserPrimSpec ints = softcap_spec("test_int_dtypes");
  ints.dtypes = {DType::f64, DType::i32};
  expect_error([&] { register_prim(ints); }, {"lists i32"});
  expect_error(
      [] {
        CustomVjp(
            "test_no_backward", [](const std::vector<Tensor>& x) { return x[0]; }, nullptr);
      },
      {"'test_no_backward'", "has no backward"});
  // None of the failed registrations took its name.
  EXPECT_NO_THROW(register_prim(softcap_spec("test_missing_vjp")));
}

TEST(UserPrims, TheDtypeRuleAndTheShapeRuleNameThePrimWhenRecording) {
  UserPrimSpec s = softcap_spec("test_f64_only");
  s.dtypes = {DType::f64};
  const UserPrim p = register_prim(s);
  Tensor x = Tensor::from_host(varied(Shape{2}, DType::f32));
  expect_error([&] { p({x}, cap(1.0)); }, {"test_f64_only", "runs on f64", "input 0 is f32[2]"});
  expect_error([&] { softcap()({x}, Params{}); }, {"test_softcap", "one positive cap"});
  Engine::current().take_recording();
}

TEST(UserPrims, TheVjpMayUseOnlyItsArguments) {
  UserPrimSpec s = softcap_spec("test_vjp_reads_a_host_tensor");
  s.vjp = [](const VjpArgs& a) {
    return std::vector<Tensor>{a.out_grads[0] * Tensor::scalar(2.0, a.inputs[0].dtype())};
  };
  const UserPrim p = register_prim(s);
  auto f = [&](const std::vector<Tensor>& in) { return sum(p({in[0]}, cap(1.0))); };
  expect_error([&] { gradcheck(f, {varied(Shape{3}, DType::f64)}); },
               {"the VJP rule of Prim 'test_vjp_reads_a_host_tensor'", "not one of its arguments"});
  // A gradient returned that the rule did not compute (a host tensor) is refused, not dropped.
  UserPrimSpec h2 = softcap_spec("test_vjp_returns_a_host_tensor_alone");
  h2.vjp = [](const VjpArgs& a) {
    return std::vector<Tensor>{Tensor::from_host(HostTensor::zeros(a.inputs[0].dtype(), a.inputs[0].shape()))};
  };
  const UserPrim returns_host = register_prim(h2);
  auto f2 = [&](const std::vector<Tensor>& in) { return sum(returns_host({in[0]}, cap(1.0))); };
  expect_error([&] { gradcheck(f2, {varied(Shape{3}, DType::f64)}); },
               {"the VJP rule of Prim 'test_vjp_returns_a_host_tensor_alone' returns", "not one of its arguments"});
  EXPECT_THROW(register_prim(softcap_spec("user")), Error);
  UserPrimSpec r = softcap_spec("test_vjp_reads_a_value");
  r.vjp = [](const VjpArgs& a) {
    (void)a.inputs[0].item();
    return std::vector<Tensor>{a.out_grads[0]};
  };
  const UserPrim q = register_prim(r);
  auto g = [&](const std::vector<Tensor>& in) { return sum(q({in[0]}, cap(1.0))); };
  expect_error([&] { gradcheck(g, {varied(Shape{3}, DType::f64)}); },
               {"the VJP rule of Prim 'test_vjp_reads_a_value' asked for a value"});
}

// In a GPU plan the Prim's body and kiln's pointwise ops around it become one op; a CPU plan runs
// the reference between them.
TEST(UserPrims, TheGpuPlanFusesThePointwiseBodyWithKilnsOwn) {
  Circuit c;
  ValueId x = c.add_external({Shape{8, 16}, DType::f32}, ValueRole::Input, "x");
  Builder b(c);
  ValueId y = c.add_op(softcap().def(), cap(3.0), {b.scale(x, 2.0)})[0];
  ValueId z = b.pointwise(se::exp(se::in(0)) + se::c(1.0), {y});
  std::vector<ValueId> gpu_outs{z};
  Circuit gpu = optimize(c, gpu_outs, cuda_target(90, true));
  EXPECT_EQ(gpu.ops().size(), 1u) << gpu.dump();
  EXPECT_EQ(testing::count_prim(gpu, PrimId::pointwise), 1u) << gpu.dump();
  // Its kernel, forward and backward alike, is kiln's pointwise kernel: ptxas accepts it.
  const cuda::LoweredOp lowered = cuda::lower(gpu, 0, cuda_target(90, true));
  ASSERT_EQ(lowered.launches.size(), 1u);
  KILN_REQUIRE_PTXAS_OR_SKIP();
  testing::expect_ptxas_accepts({lowered.launches[0].kernel.get()});
}

TEST(UserPrims, ACpuPlanRunsTheReferenceBetweenKilnsOps) {
  Circuit c;
  ValueId x = c.add_external({Shape{8, 16}, DType::f32}, ValueRole::Input, "x");
  Builder b(c);
  ValueId y = c.add_op(softcap().def(), cap(3.0), {b.scale(x, 2.0)})[0];
  std::vector<ValueId> outs{b.pointwise(se::exp(se::in(0)), {y})};
  Circuit cpu = optimize(c, outs, cpu_target());
  EXPECT_EQ(testing::count_prim(cpu, PrimId::user), 1u) << cpu.dump();
}

TEST(UserPrims, TheFusedKernelInTheSimulatorMatchesTheCpuReference) {
  HostTensor xs = varied(Shape{6, 40}, DType::f32);
  auto step = [&] {
    Tensor x = Tensor::from_host(xs);
    return (softcap()({x * 2.0}, cap(3.0)) + 1.0).to_vector();
  };
  const std::vector<double> cpu = step();
  std::vector<double> sim;
  {
    testing::OnDevice on(testing::fake_runtime());
    sim = step();
  }
  ASSERT_EQ(cpu.size(), sim.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(sim[i], cpu[i], 2e-6 * (1 + std::fabs(cpu[i]))) << i;
}

TEST(UserPrims, AGpuPlanMeetingAPrimWithoutLoweringNamesIt) {
  UserPrimSpec s = softcap_spec("test_cpu_only_softcap");
  s.pointwise_body = nullptr;
  const UserPrim p = register_prim(s);
  Circuit c;
  ValueId x = c.add_external({Shape{4}, DType::f32}, ValueRole::Input, "x");
  std::vector<ValueId> outs{c.add_op(p.def(), cap(1.0), {x}, "model.head")[0]};
  expect_error([&] { optimize(c, outs, cuda_target(90, true)); },
               {"test_cpu_only_softcap", "model.head", "has no GPU lowering", "test_user_prims.cpp:"});
  std::vector<ValueId> cpu_outs{outs};
  EXPECT_NO_THROW(optimize(c, cpu_outs, cpu_target()));
}

// y = x * x + 1 with a kernel of its own, written with kernel IR: a grid-stride loop over the
// elements (f32), as a user writes one. `plus` is what the kernel adds (1 is right; a planted
// wrong kernel adds 2).
UserPrimSpec square_plus_one_spec(const std::string& name, float plus) {
  UserPrimSpec s;
  s.name = name;
  s.shape = [](const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params&) {
    if (in.size() != 1) ctx.fail("takes one input");
    return std::vector<ValueInfo>{in[0]};
  };
  s.reference = [](const PrimCall& call) {
    for (int64_t i = 0; i < call.inputs[0]->numel(); ++i)
      call.outputs[0].set(i, call.inputs[0]->get(i) * call.inputs[0]->get(i) + 1.0);
  };
  s.vjp = [](const VjpArgs& a) { return std::vector<Tensor>{a.out_grads[0] * a.inputs[0] * 2.0}; };
  s.gpu_kernel = [name, plus](const Circuit& c, const Op& op, const Target&) {
    const int64_t n = c.info(op.outputs[0]).shape.numel();
    kir::KernelBuilder b(name);
    const kir::Reg x = b.param("x", kir::Type::u64), y = b.param("y", kir::Type::u64);
    cuda::grid_stride_loop(b, kir::Type::u32, n, [&](kir::Reg i) {
      const kir::Reg v = cuda::load_as_f32(b, DType::f32, x, i);
      cuda::store_from_f32(b, DType::f32, y, i, b.fma(kir::Type::f32, v, v, kir::imm_f32(plus)));
    });
    cuda::LoweredOp r;
    r.launches.push_back({std::make_shared<const kir::Kernel>(b.finish()),
                          cuda::elementwise_grid(n),
                          {cuda::kElementwiseThreads, 1, 1},
                          {{cuda::ArgRef::Kind::Input, 0}, {cuda::ArgRef::Kind::Output, 0}}});
    return r;
  };
  return s;
}

// The step on the fake GPU: x * 3, the Prim's kernel, exp; compared with the CPU reference's.
std::pair<std::vector<double>, std::vector<double>> cpu_and_sim(const UserPrim& p) {
  HostTensor xs = varied(Shape{5, 70}, DType::f32, 0.5);
  auto step = [&] { return exp(p({Tensor::from_host(xs) * 3.0}) * -1.0).to_vector(); };
  std::vector<double> cpu = step(), sim;
  testing::OnDevice on(testing::fake_runtime());
  sim = step();
  return {cpu, sim};
}

TEST(UserPrims, AKernelOfItsOwnRunsInTheSimulatorAndPassesPtxas) {
  const UserPrim p = register_prim(square_plus_one_spec("test_square_plus_one", 1.0f));
  const auto [cpu, sim] = cpu_and_sim(p);
  ASSERT_EQ(cpu.size(), sim.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(sim[i], cpu[i], 1e-6 * (1 + std::fabs(cpu[i]))) << i;

  Circuit c;
  ValueId x = c.add_external({Shape{8, 16}, DType::f32}, ValueRole::Input, "x");
  Builder b(c);
  std::vector<ValueId> outs{b.scale(c.add_op(p.def(), {}, {b.scale(x, 3.0)})[0], 2.0)};
  Circuit gpu = optimize(c, outs, cuda_target(90, true));
  ASSERT_EQ(testing::count_prim(gpu, PrimId::user), 1u) << gpu.dump();  // not fused: a kernel of its own
  for (size_t i = 0; i < gpu.ops().size(); ++i) {
    if (!gpu.ops()[i].is(PrimId::user)) continue;
    const cuda::LoweredOp lowered = cuda::lower(gpu, static_cast<int>(i), cuda_target(90, true));
    ASSERT_EQ(lowered.launches.size(), 1u);
    EXPECT_NE(lowered.summary.find("test_square_plus_one"), std::string::npos) << lowered.summary;
    KILN_REQUIRE_PTXAS_OR_SKIP();
    testing::expect_ptxas_accepts({lowered.launches[0].kernel.get()});
  }
}

// The check above rests on this: a kernel that adds 2 instead of 1 differs from the reference.
TEST(UserPrims, APlantedWrongKernelDiffersFromTheReference) {
  const UserPrim p = register_prim(square_plus_one_spec("test_square_plus_two", 2.0f));
  const auto [cpu, sim] = cpu_and_sim(p);
  size_t differ = 0;
  for (size_t i = 0; i < cpu.size(); ++i) differ += std::fabs(sim[i] - cpu[i]) > 1e-6 * (1 + std::fabs(cpu[i]));
  EXPECT_EQ(differ, cpu.size());
}

TEST(UserPrims, AKernelLoweringWithWrongArgumentsIsAnErrorNamingThePrim) {
  UserPrimSpec s = square_plus_one_spec("test_kernel_bad_args", 1.0f);
  s.gpu_kernel = [inner = s.gpu_kernel](const Circuit& c, const Op& op, const Target& t) {
    cuda::LoweredOp r = inner(c, op, t);
    r.launches[0].args[0].index = 3;  // the op has one input
    return r;
  };
  const UserPrim p = register_prim(s);
  UserPrimSpec both = square_plus_one_spec("test_two_lowerings", 1.0f);
  both.pointwise_body = [](const Params&) { return se::in(0) * se::in(0) + se::c(1.0); };
  expect_error([&] { register_prim(both); }, {"'test_two_lowerings'", "more than one GPU lowering"});
  Circuit c;
  ValueId x = c.add_external({Shape{4}, DType::f32}, ValueRole::Input, "x");
  std::vector<ValueId> outs{c.add_op(p.def(), {}, {x})[0]};
  Circuit gpu = optimize(c, outs, cuda_target(90, true));
  expect_error([&] { cuda::lower(gpu, 0, cuda_target(90, true)); }, {"test_kernel_bad_args", "names buffer 3 of 1"});
}

// rms_scale(x) = x / sqrt(mean(x^2 over the last axis) + eps), eps = params.reals[0], with a row
// body as its GPU lowering and a VJP of Tensor functions: dx = r (g - x r^2 mean(g x)), r the
// row's scale.
UserPrimSpec rms_scale_spec(const std::string& name) {
  UserPrimSpec s;
  s.name = name;
  s.shape = [](const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
    if (in.size() != 1 || in[0].shape.rank() < 1 || p.reals.size() != 1) ctx.fail("takes one input and eps");
    return std::vector<ValueInfo>{in[0]};
  };
  s.reference = [](const PrimCall& call) {
    const HostTensor& x = *call.inputs[0];
    const int64_t n = x.shape()[x.shape().rank() - 1];
    for (int64_t row = 0; row < x.numel() / n; ++row) {
      double ms = 0;
      for (int64_t j = 0; j < n; ++j) ms += x.get(row * n + j) * x.get(row * n + j);
      const double r = 1.0 / std::sqrt(ms / static_cast<double>(n) + call.params.reals[0]);
      for (int64_t j = 0; j < n; ++j) call.outputs[0].set(row * n + j, x.get(row * n + j) * r);
    }
  };
  s.vjp = [](const VjpArgs& a) {
    const Tensor& x = a.inputs[0];
    const Tensor& g = a.out_grads[0];
    const Tensor r = rsqrt(mean(x * x, -1, true) + a.params.reals[0]);
    return std::vector<Tensor>{r * (g - x * r * r * mean(g * x, -1, true))};
  };
  s.row_body = [](const std::vector<ValueInfo>& in, const Params& p) {
    RowProgram rp;
    rp.inputs = 1;
    rp.domain = in[0].shape;
    const double n = static_cast<double>(in[0].shape[in[0].shape.rank() - 1]);
    rp.reduction_kinds = {ReduceKind::Sum};
    rp.reduction_bodies = {se::in(0) * se::in(0)};  // in1: the row's sum of squares
    rp.output_per_row = {false};
    rp.output_bodies = {se::in(0) * se::rsqrt(se::in(1) / se::c(n) + se::c(p.reals[0]))};
    return rp;
  };
  return s;
}

TEST(UserPrims, ARowBodyBecomesAFusedRowsOpAndMatchesTheReferenceInTheSimulator) {
  const UserPrim p = register_prim(rms_scale_spec("test_rms_scale"));
  Params eps;
  eps.reals = {1e-5};
  auto f = [&](const std::vector<Tensor>& in) { return sum(p({in[0]}, eps) * in[1]); };
  ad::GradCheckResult r = gradcheck(f, {varied(Shape{3, 7}, DType::f64), varied(Shape{3, 7}, DType::f64, 1.3)});
  EXPECT_TRUE(r.ok) << r.report;

  HostTensor xs = varied(Shape{9, 50}, DType::f32, 2.0);
  auto step = [&] { return (p({Tensor::from_host(xs) * 3.0}, eps) + 1.0).to_vector(); };
  const std::vector<double> cpu = step();
  std::vector<double> sim;
  {
    testing::OnDevice on(testing::fake_runtime());
    sim = step();
  }
  ASSERT_EQ(cpu.size(), sim.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(sim[i], cpu[i], 1e-5 * (1 + std::fabs(cpu[i]))) << i;

  Circuit c;
  ValueId x = c.add_external({Shape{9, 50}, DType::f32}, ValueRole::Input, "x");
  std::vector<ValueId> outs{c.add_op(p.def(), eps, {x})[0]};
  Circuit gpu = optimize(c, outs, cuda_target(90, true));
  ASSERT_EQ(gpu.ops().size(), 1u) << gpu.dump();
  EXPECT_TRUE(gpu.ops()[0].is(PrimId::fused_rows)) << gpu.dump();
  const cuda::LoweredOp lowered = cuda::lower(gpu, 0, cuda_target(90, true));
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (const cuda::Launch& l : lowered.launches) testing::expect_ptxas_accepts({l.kernel.get()});
}

TEST(UserPrims, TheCatalogueListsUserPrims) {
  softcap();
  const std::string text = prim_catalogue();
  EXPECT_NE(text.find("test_softcap"), std::string::npos) << text;
  EXPECT_NE(text.find("pointwise body (fused like kiln's own)"), std::string::npos) << text;
  EXPECT_NE(text.find("matmul"), std::string::npos) << text;
}

// round_ste: values rounded to bf16, gradients passed straight through.
TEST(CustomVjps, AStraightThroughRoundingRoundsForwardAndPassesGradientsBack) {
  static const CustomVjp round_ste(
      "test_round_ste", [](const std::vector<Tensor>& x) { return map(se::round_bf16(se::in(0)), x); },
      [](const CustomVjpArgs& a) { return std::vector<Tensor>{a.out_grad}; });
  HostTensor xs = varied(Shape{5}, DType::f32, 1.7);
  Tensor x = Tensor::from_host(xs);
  const std::vector<double> y = round_ste({x}).to_vector();
  for (int64_t i = 0; i < 5; ++i)
    EXPECT_EQ(y[static_cast<size_t>(i)], static_cast<double>(round_to_bf16(static_cast<float>(xs.get(i)))));
  const std::vector<Tensor> g = grad(sum(round_ste({x}) * x), {x});
  const std::vector<double> gv = g[0].to_vector();
  for (int64_t i = 0; i < 5; ++i)
    EXPECT_NEAR(gv[static_cast<size_t>(i)], y[static_cast<size_t>(i)] + xs.get(i), 1e-6) << i;
}

// A composite's backward checked by finite differences: softplus with the backward sigmoid(x).
// A wrong backward (sigmoid(-x)) fails the same check.
TEST(CustomVjps, ACustomBackwardPassesTheGradientCheckAndAWrongOneFails) {
  auto forward = [](const std::vector<Tensor>& x) { return log(1.0 + exp(x[0])); };
  static const CustomVjp softplus("test_softplus", forward, [](const CustomVjpArgs& a) {
    return std::vector<Tensor>{a.out_grad * sigmoid(a.inputs[0])};
  });
  static const CustomVjp wrong("test_softplus_wrong", forward, [](const CustomVjpArgs& a) {
    return std::vector<Tensor>{a.out_grad * sigmoid(-a.inputs[0])};
  });
  auto f = [](const CustomVjp& sp) {
    return [&sp](const std::vector<Tensor>& in) { return sum(sp({in[0]}) * in[0]); };
  };
  ad::GradCheckResult ok = gradcheck(f(softplus), {varied(Shape{6}, DType::f64, 2.0)});
  EXPECT_TRUE(ok.ok) << ok.report;
  ad::GradCheckResult bad = gradcheck(f(wrong), {varied(Shape{6}, DType::f64, 2.0)});
  EXPECT_FALSE(bad.ok) << bad.report;
}

// A backward may use the program's own Prims: the gradient comes back softcapped.
TEST(CustomVjps, ABackwardMayUseUserPrims) {
  static const CustomVjp capped_grad(
      "test_capped_gradient", [](const std::vector<Tensor>& x) { return x[0] * 1.0; },
      [](const CustomVjpArgs& a) { return std::vector<Tensor>{softcap()({a.out_grad}, cap(0.5))}; });
  HostTensor ws = varied(Shape{6}, DType::f32, 2.0);
  Tensor x = Tensor::from_host(varied(Shape{6}, DType::f32)), w = Tensor::from_host(ws);
  const std::vector<double> g = grad(sum(capped_grad({x}) * w), {x})[0].to_vector();
  for (int64_t i = 0; i < 6; ++i) EXPECT_NEAR(g[static_cast<size_t>(i)], 0.5 * std::tanh(ws.get(i) / 0.5), 1e-6) << i;
}

TEST(CustomVjps, EveryPlanForwardsTheForwardsValue) {
  static const CustomVjp ident(
      "test_identity_vjp", [](const std::vector<Tensor>& x) { return x[0] * 3.0; },
      [](const CustomVjpArgs& a) { return std::vector<Tensor>{a.out_grad * 3.0}; });
  Circuit c;
  ValueId x = c.add_external({Shape{4}, DType::f32}, ValueRole::Input, "x");
  Builder b(c);
  ValueId f = b.scale(x, 3.0);
  ValueId y = c.add_op(PrimRegistry::instance().find("test_identity_vjp"), {}, {f, x})[0];
  ValueId z = b.pointwise(se::exp(se::in(0)), {y});
  for (const Target& t : {cpu_target(), cuda_target(90, true)}) {
    std::vector<ValueId> outs{z};
    Circuit p = optimize(c, outs, t);
    EXPECT_EQ(testing::count_prim(p, PrimId::user), 0u) << p.dump();
    EXPECT_EQ(p.ops().size(), 1u) << p.dump();  // scale and exp fused across the forwarded value
  }
}

}  // namespace
}  // namespace kiln
