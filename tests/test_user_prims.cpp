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

#include "device_test_util.hpp"
#include "ptxas_skip.hpp"
#include "expect_error.hpp"
#include "prim_test_util.hpp"

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
    UserPrimSpec s = softcap_spec(std::string("test_missing_") + (piece[0] == 's' ? "shape" : piece[0] == 'C' ? "ref" : "vjp"));
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
  expect_error([] { CustomVjp("test_no_backward", [](const std::vector<Tensor>& x) { return x[0]; }, nullptr); },
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
  s.vjp = [](const VjpArgs& a) { return std::vector<Tensor>{a.out_grads[0] * Tensor::scalar(2.0, a.inputs[0].dtype())}; };
  const UserPrim p = register_prim(s);
  auto f = [&](const std::vector<Tensor>& in) { return sum(p({in[0]}, cap(1.0))); };
  expect_error([&] { gradcheck(f, {varied(Shape{3}, DType::f64)}); },
               {"the VJP rule of Prim 'test_vjp_reads_a_host_tensor'", "not one of its arguments"});
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
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], static_cast<double>(round_to_bf16(static_cast<float>(xs.get(i)))));
  const std::vector<Tensor> g = grad(sum(round_ste({x}) * x), {x});
  const std::vector<double> gv = g[0].to_vector();
  for (int64_t i = 0; i < 5; ++i) EXPECT_NEAR(gv[static_cast<size_t>(i)], y[static_cast<size_t>(i)] + xs.get(i), 1e-6) << i;
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

TEST(CustomVjps, EveryPlanForwardsTheForwardsValue) {
  static const CustomVjp ident("test_identity_vjp", [](const std::vector<Tensor>& x) { return x[0] * 3.0; },
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
