// Execution semantics of core/: lazy recording, realization through the plan cache, runtime
// scalars, assign ordering, step-local gradients in arenas, dtype rules, scopes in errors,
// recovery after a failed step, seeding, devices and the user-facing gradient check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <thread>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/device.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/gradcheck.hpp>
#include <kiln/cuda/runtime/runtime.hpp>
#include <kiln/train/sgd.hpp>

#include "scoped_target.hpp"

namespace kiln {
namespace {

HostTensor host(const std::vector<double>& v, Shape s, DType dt = DType::f32) {
  return Tensor::from_vector(v, std::move(s), dt).to_host();
}

// One training step of a linear model; returns the loss.
double linear_step(const Tensor& w, optim::SGD& opt, const std::vector<double>& x, double target) {
  Tensor xs = Tensor::from_vector(x, Shape{1, static_cast<int64_t>(x.size())});
  Tensor err = matmul(xs, w) - target;
  Tensor loss = mean(err * err);
  loss.backward();
  opt.step();
  return loss.item();
}

TEST(EnginePlanCache, IdenticalStepsReuseOnePlanWithoutPasses) {
  Engine& e = Engine::current();
  Tensor w = Tensor::parameter("cache.w", host({0.1, -0.2, 0.3}, Shape{3, 1}));
  optim::SGD opt({w}, 0.05);
  linear_step(w, opt, {1, 2, 3}, 1.0);
  uint64_t built = e.stats().plans_built, hits = e.stats().cache_hits;
  for (int i = 0; i < 5; ++i) {
    opt.set_lr(0.05 / (i + 1));  // a runtime scalar: must not make a new plan
    linear_step(w, opt, {1.0 + i, 2, 3}, 1.0);
    EXPECT_EQ(e.stats().last_plan_ms, 0.0);
  }
  EXPECT_EQ(e.stats().plans_built, built);
  EXPECT_EQ(e.stats().cache_hits, hits + 5);
  EXPECT_GT(e.stats().last_recorded_ops, 0u);
}

// Plan-only realization (kiln bench --plan-only) makes the plan a realization of the same step
// then finds in the cache, and runs nothing: the parameter keeps its value.
TEST(EnginePlanCache, APlanMadeWithoutRunningIsTheOneTheStepRuns) {
  Engine& e = Engine::current();
  Tensor w = Tensor::parameter("plan_only.w", host({0.1, -0.2, 0.3}, Shape{3, 1}));
  optim::SGD opt({w}, 0.05);
  auto record = [&] {
    Tensor xs = Tensor::from_vector({1, 2, 3}, Shape{1, 3});
    Tensor err = matmul(xs, w) - 1.0;
    Tensor loss = mean(err * err);
    loss.backward();
    opt.step();
    return loss;
  };
  const std::vector<double> before = w.to_vector();
  e.set_plan_only(true);
  record();  // the optimizer's step realizes
  e.set_plan_only(false);
  const Plan* plan = e.last_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_GT(plan->program->workspace_bytes(), 0u);
  EXPECT_EQ(w.to_vector(), before);  // the step did not run
  const uint64_t built = e.stats().plans_built;
  record().item();
  EXPECT_EQ(e.stats().plans_built, built);  // found in the cache
  EXPECT_EQ(e.last_plan(), plan);
  EXPECT_NE(w.to_vector(), before);
}

TEST(EnginePlanCache, ConstantsAndShapesAreStructure) {
  Engine& e = Engine::current();
  Tensor x = Tensor::from_vector({1, 2}, Shape{2});
  (x * 2.0).to_vector();
  uint64_t built = e.stats().plans_built;
  EXPECT_EQ((x * 2.0).to_vector(), (std::vector<double>{2, 4}));
  EXPECT_EQ(e.stats().plans_built, built);  // same constant: cache hit
  EXPECT_EQ((x * 3.0).to_vector(), (std::vector<double>{3, 6}));
  EXPECT_EQ(e.stats().plans_built, built + 1);  // another constant: another plan
  Tensor y = Tensor::from_vector({1, 2, 3}, Shape{3});
  (y * 3.0).to_vector();
  EXPECT_EQ(e.stats().plans_built, built + 2);  // another shape: another plan
}

TEST(EnginePlanCache, BoundedAndConfirmedByEquality) {
  PlanCache cache(2);
  std::vector<Circuit> cs(3);
  std::vector<ValueId> outs;
  for (int i = 0; i < 3; ++i) {
    ValueId x = cs[static_cast<size_t>(i)].add_external({Shape{2}, DType::f32}, ValueRole::Input);
    Builder b(cs[static_cast<size_t>(i)]);
    outs = {b.scale(x, i + 1.0)};
    cache.build(7, cs[static_cast<size_t>(i)], outs, cpu_target(), {});  // same (forced) hash for all three
  }
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.find(7, cs[0], outs, cpu_target(), {}), nullptr);  // evicted
  EXPECT_NE(cache.find(7, cs[2], outs, cpu_target(), {}), nullptr);
  EXPECT_NE(cache.find(7, cs[1], outs, cpu_target(), {}), nullptr);  // a colliding hash is told apart by equality
}

// The Target and the pipeline's options are part of a plan's key: the same step under another
// Target (a device, a matmul policy, tf32, determinism) or with a pass off is another plan, and
// each is found again under its own.
TEST(EnginePlanCache, TwoTargetsGiveTwoPlans) {
  PlanCache cache;
  Circuit c;
  ValueId x = c.add_external({Shape{2}, DType::f32}, ValueRole::Input);
  Builder b(c);
  const std::vector<ValueId> outs{b.scale(x, 2.0)};
  Target tf32 = cpu_target(), gpu = cuda_target(90, /*fake=*/true), tiles = gpu, exact = gpu;
  tf32.tf32 = true;
  tiles.matmul = parse_matmul_policy("tile=128x256");
  exact.deterministic = true;
  const std::vector<Target> targets{cpu_target(), tf32, gpu, tiles, exact};
  for (const Target& t : targets) {
    EXPECT_EQ(cache.find(1, c, outs, t, {}), nullptr) << t.str();
    cache.build(1, c, outs, t, {});
  }
  EXPECT_EQ(cache.size(), targets.size());
  for (const Target& t : targets) {
    const std::shared_ptr<const Plan> p = cache.find(1, c, outs, t, {});
    ASSERT_NE(p, nullptr) << t.str();
    EXPECT_EQ(p->target, t);
  }
  EXPECT_EQ(cache.find(1, c, outs, gpu, parse_pipeline_options("-cse")), nullptr);
  cache.build(1, c, outs, gpu, parse_pipeline_options("-cse"));
  EXPECT_EQ(cache.size(), targets.size() + 1);
}

// Through the engine: a step recorded under another Target builds a plan, and the first Target's
// plan is found again when the engine goes back to it.
TEST(EnginePlanCache, TheEnginesTargetKeysItsPlans) {
  Engine& e = Engine::current();
  Tensor x = Tensor::from_vector({1, 2}, Shape{2});
  (x * 5.0).to_vector();
  const uint64_t built = e.stats().plans_built;
  {
    testing::ScopedTarget tf32([](Target& t) { t.tf32 = true; });
    (x * 5.0).to_vector();
    EXPECT_EQ(e.stats().plans_built, built + 1);
    EXPECT_TRUE(e.last_plan()->target.tf32);
  }
  (x * 5.0).to_vector();
  EXPECT_EQ(e.stats().plans_built, built + 1);  // the first plan, found again
  EXPECT_FALSE(e.last_plan()->target.tf32);
  {
    testing::ScopedPipeline no_cse("-cse");
    (x * 5.0).to_vector();
    EXPECT_EQ(e.stats().plans_built, built + 2);
  }
}

TEST(EngineAssign, ReadsBeforeAnAssignSeeTheOldValue) {
  Tensor p = Tensor::parameter("assign.p", host({1, 2, 3}, Shape{3}), false);
  Tensor before = p * 2.0;
  p.assign(p + 1.0);
  Tensor after = p * 2.0;
  EXPECT_EQ(before.to_vector(), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(after.to_vector(), (std::vector<double>{4, 6, 8}));
  EXPECT_EQ(p.to_vector(), (std::vector<double>{2, 3, 4}));
  EXPECT_THROW(Tensor::from_vector({1}, Shape{1}).assign(p), Error);  // not persistent
}

// a.assign(b) gives a the value b has in the step, before b's own assign lands: a's new
// contents are b's memory, which the commit must read before it writes b.
TEST(EngineAssign, AnAssignOfAnotherBufferTakesItsValueBeforeThatBufferChanges) {
  Tensor a = Tensor::parameter("assign.a", host({1, 2, 3}, Shape{3}), false);
  Tensor b = Tensor::parameter("assign.b", host({10, 20, 30}, Shape{3}), false);
  a.assign(b);
  b.assign(b + 1.0);
  EXPECT_EQ(a.to_vector(), (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(b.to_vector(), (std::vector<double>{11, 21, 31}));
}

TEST(EngineGradients, BelongToTheStepUnlessAccumulationIsAsked) {
  Engine& e = Engine::current();
  Tensor w = Tensor::parameter("grad.w", host({1, 1}, Shape{2}));
  Tensor unused = Tensor::parameter("grad.unused", host({5}, Shape{1}));
  auto step = [&](std::vector<double> x) {
    Tensor loss = sum(w * Tensor::from_vector(x, Shape{2})) + sum(unused * 0.0);
    loss.backward();
    e.realize();
  };
  step({2, 3});
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{2, 3}));
  step({4, 5});
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{4, 5}));  // assigned, not added
  EXPECT_EQ(unused.grad().to_vector(), (std::vector<double>{0}));
  e.accumulate_gradients = true;
  step({1, 1});
  e.accumulate_gradients = false;
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{5, 6}));
}

TEST(EngineGradients, TiedUseAccumulatesFanOut) {
  Tensor w = Tensor::parameter("tied.w", host({3}, Shape{1}));
  Tensor loss = sum(w * w + w);  // d/dw = 2w + 1 = 7
  loss.backward();
  Engine::current().realize();
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{7}));
  Tensor v = Tensor::parameter("tied.v", host({1, 2}, Shape{2}));
  EXPECT_THROW((v * 1.0).backward(), Error);  // backward needs a one-element loss
  Engine::current().realize();
}

TEST(EngineGradients, FunctionalGradOfInputsAndIntermediates) {
  Tensor x = Tensor::from_vector({1, 2, 3}, Shape{3}, DType::f64);
  Tensor h = x * x;            // intermediate
  Tensor loss = sum(h * 2.0);  // d/dh = 2, d/dx = 4x
  Tensor other = Tensor::from_vector({7}, Shape{1}, DType::f64);
  std::vector<Tensor> g = grad(loss, {x, h, other});
  EXPECT_EQ(g[0].to_vector(), (std::vector<double>{4, 8, 12}));
  EXPECT_EQ(g[1].to_vector(), (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(g[2].to_vector(), (std::vector<double>{0}));  // loss does not depend on it
}

// The gradient of an intermediate alone (what it is computed from not differentiated): the sweep
// once lost its mark and returned zeros.
TEST(EngineGradients, GradOfAnIntermediateAlone) {
  Tensor x = Tensor::from_vector({1, 2, 3}, Shape{3}, DType::f64);
  Tensor h = x * x;
  Tensor loss = sum(h * h);  // d/dh = 2h
  EXPECT_EQ(grad(loss, {h})[0].to_vector(), (std::vector<double>{2, 8, 18}));
}

TEST(EngineArenas, ParametersAreViewsOfPerDtypeArenas) {
  Engine& e = Engine::current();
  Tensor a = Tensor::parameter("arena.a", host({1, 2, 3}, Shape{3}));
  Tensor b = Tensor::parameter("arena.b", host({4, 5}, Shape{2}));
  Tensor c = Tensor::parameter("arena.c", host({6}, Shape{1}, DType::f64));
  const ArenaSlot& sa = e.arenas().slot(a.impl()->slot);
  const ArenaSlot& sb = e.arenas().slot(b.impl()->slot);
  const ArenaSlot& sc = e.arenas().slot(c.impl()->slot);
  EXPECT_EQ(sa.dtype, DType::f32);
  EXPECT_EQ(sc.dtype, DType::f64);
  EXPECT_GT(sb.offset, sa.offset);
  EXPECT_EQ(sb.offset % 16, 0);
  HostTensor arena = e.arenas().arena_view(ArenaKind::Param, DType::f32);
  EXPECT_EQ(arena.get(sb.offset + 1), 5.0);
  EXPECT_EQ(e.arenas().slot(a.grad().impl()->slot).kind, ArenaKind::Grad);
}

TEST(EngineDtypes, NoImplicitPromotion) {
  Tensor a = Tensor::from_vector({1}, Shape{1}, DType::f32);
  Tensor b = Tensor::from_vector({1}, Shape{1}, DType::f64);
  try {
    (void)(a + b);
    FAIL() << "f32 + f64 must not promote";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no implicit promotion"), std::string::npos) << e.what();
  }
  EXPECT_EQ((cast(a, DType::f64) + b).item(), 2.0);
}

TEST(EngineScopes, ErrorsNameTheLayer) {
  Scope outer("block");
  Scope inner("attn");
  EXPECT_EQ(Engine::current().scope(), "block.attn");
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  try {
    (void)matmul(a, a);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("op 'matmul' in layer 'block.attn'"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  }
}

TEST(EngineFailure, AFailedStepIsDiscardedAndTheEngineGoesOn) {
  Tensor table = Tensor::from_vector({1, 2, 3, 4}, Shape{2, 2});
  Tensor bad = gather_rows(table, Tensor::from_ints({0, 5}, Shape{2}));
  try {
    bad.item();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 5 at position 1 is out of range [0, 2)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((bad * 1.0).item(), Error);  // a value of the failed step has none
  EXPECT_EQ(sum(gather_rows(table, Tensor::from_ints({1}, Shape{1}))).item(), 7.0);
}

TEST(EngineSeeding, ManualSeedReproducesRandomTensors) {
  manual_seed(3);
  std::vector<double> a = Tensor::rand(Shape{5}).to_vector();
  std::vector<double> a2 = Tensor::rand(Shape{5}).to_vector();
  manual_seed(3);
  std::vector<double> b = Tensor::rand(Shape{5}).to_vector();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, a2);  // each draw is a fresh stream
  std::vector<double> n = Tensor::randn(Shape{4000}, DType::f64).to_vector();
  double m = 0, v = 0;
  for (double x : n) m += x / n.size();
  for (double x : n) v += (x - m) * (x - m) / n.size();
  EXPECT_NEAR(m, 0.0, 0.06);
  EXPECT_NEAR(v, 1.0, 0.08);
}

// On a machine with a GPU, cuda and auto name it; without one, cuda is a clear error and auto
// is the CPU (the CTest CliHelpAndBadInput hides a GPU with CUDA_VISIBLE_DEVICES to check the
// error there too).
TEST(EngineDevice, CudaIsTheGpuOrAClearError) {
  EXPECT_EQ(parse_device("cpu").device, Device::CPU);
  EXPECT_THROW(parse_device("gpu"), Error);
  if (cuda_available()) {
    EXPECT_EQ(parse_device("cuda").device, Device::CUDA);
    EXPECT_EQ(parse_device("auto").device, Device::CUDA);
    return;
  }
  const char* required = std::getenv("KILN_REQUIRE_GPU");
  EXPECT_FALSE(required && std::string(required) == "1") << "KILN_REQUIRE_GPU=1 but no usable GPU";
  EXPECT_EQ(parse_device("auto").device, Device::CPU);
  try {
    parse_device("cuda");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no usable GPU"), std::string::npos);
  }
}

// sim: the CUDA back end on the fake driver, wherever kiln runs; the engine's Target is then the
// simulated device's (its sm, fake), and the CPU's again after.
TEST(EngineDevice, SimIsTheCudaBackEndOnTheSimulator) {
  const DeviceSelection sim = parse_device("sim");
  ASSERT_EQ(sim.device, Device::CUDA);
  ASSERT_NE(sim.runtime, nullptr);
  EXPECT_TRUE(sim.simulated());
  Engine& e = Engine::current();
  e.set_device(sim.device, sim.runtime);
  EXPECT_TRUE(e.target().gpu());
  EXPECT_TRUE(e.target().fake);
  EXPECT_EQ(e.target().sm, sim.runtime->sm());
  EXPECT_EQ((Tensor::from_vector({1, 2}, Shape{2}) * 2.0).to_vector(), (std::vector<double>{2, 4}));
  e.set_device(Device::CPU);
  EXPECT_FALSE(e.target().gpu());
}

TEST(UserGradcheck, PassesForACorrectFunctionAndChecksParameters) {
  Tensor w = Tensor::parameter("gc.w", host({0.3, -0.1, 0.2, 0.5, -0.4, 0.1}, Shape{3, 2}, DType::f64));
  auto f = [&](const std::vector<Tensor>& in) { return sum(tanh(matmul(in[0], w)) * in[0].shape()[0]); };
  ad::GradCheckResult r = gradcheck(f, {host({0.1, 0.2, -0.3, 0.4, 0.5, -0.6}, Shape{2, 3})}, {}, true);
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_EQ(r.rel_error.size(), 2u);  // the input and the parameter
  EXPECT_EQ(w.to_vector()[0], 0.3);   // parameters are perturbed on copies only
}

// Parameters reported under the names given, each with its worst element; a seeded subset of
// elements per tensor; a check of nothing is an error, not a pass.
TEST(UserGradcheck, NamesParametersChecksSubsetsAndRefusesToCheckNothing) {
  Tensor w = Tensor::parameter("w", host({0.3, -0.1, 0.2, 0.5, -0.4, 0.1}, Shape{3, 2}, DType::f64));
  Tensor unused = Tensor::parameter("unused", host({1.0}, Shape{1}, DType::f64));
  auto f = [&](const std::vector<Tensor>& in) { return sum(tanh(matmul(in[0], w))); };
  const HostTensor x = host({0.1, 0.2, -0.3, 0.4, 0.5, -0.6}, Shape{2, 3});
  ad::GradCheckResult r = gradcheck(f, {x}, {{"layer.w", w}, {"layer.unused", unused}});
  EXPECT_TRUE(r.ok) << r.report;
  ASSERT_EQ(r.entries.size(), 2u) << r.report;  // the input and w; `unused` is not read by f
  EXPECT_EQ(r.entries[0].name, "input 0");
  EXPECT_EQ(r.entries[1].name, "layer.w");
  EXPECT_EQ(r.entries[1].checked, 6);
  EXPECT_GE(r.entries[1].worst_index, 0);
  EXPECT_NE(r.report.find("layer.w"), std::string::npos) << r.report;
  ad::GradCheckOptions some;
  some.elements_per_tensor = 2;
  r = gradcheck(f, {x}, {{"layer.w", w}}, some);
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_EQ(r.entries[1].checked, 2);
  // Only an integer input and no parameters: nothing to differentiate.
  try {
    gradcheck([](const std::vector<Tensor>& in) { return sum(cast(in[0], DType::f64)); },
              {Tensor::from_ints({1, 2}, Shape{2}).to_host()});
    ADD_FAILURE() << "a check of nothing passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing to check"), std::string::npos) << e.what();
  }
  Tensor f32 = Tensor::parameter("f32", host({1.0}, Shape{1}));
  EXPECT_THROW(gradcheck(f, {x}, {{"f32", f32}}), Error);  // not converted to f64
}

// A gradient that is zero (f reads w only as exp(x + w) * exp(-w)) while the differences give
// rounding noise passes, compared absolutely, and is marked so; a gradient of ordinary size
// (d/db) is compared relatively.
TEST(UserGradcheck, AZeroGradientPassesAtRoundingLevel) {
  Tensor w = Tensor::parameter("w", host({0.7}, Shape{1}, DType::f64));
  Tensor b = Tensor::parameter("b", host({0.2}, Shape{1}, DType::f64));
  auto f = [&](const std::vector<Tensor>& in) { return sum(exp(in[0] + w) * exp(-w)) + sum(tanh(in[0] + b)); };
  const HostTensor x = host({-0.9, 0.3, 0.7, -0.1, 0.9, -0.3}, Shape{6});
  ad::GradCheckResult r = gradcheck(f, {x}, {{"w", w}, {"b", b}});
  EXPECT_TRUE(r.ok) << r.report;
  ASSERT_EQ(r.entries.size(), 3u) << r.report;
  auto entry = [&](const std::string& name) {
    for (const ad::GradCheckEntry& e : r.entries)
      if (e.name == name) return e;
    ADD_FAILURE() << "no entry " << name << " in\n" << r.report;
    return ad::GradCheckEntry{};
  };
  EXPECT_TRUE(entry("w").near_zero) << r.report;
  // The two differ by rounding noise, which a plain relative error (noise / noise) fails.
  EXPECT_NE(entry("w").worst_numeric, entry("w").worst_analytic) << r.report;
  EXPECT_FALSE(entry("b").near_zero) << r.report;
  EXPECT_NE(r.report.find("rounding level"), std::string::npos) << r.report;
}

TEST(UserGradcheck, LeavesThePendingStepAlone) {
  Tensor x = Tensor::from_vector({1, 2}, Shape{2});
  Tensor y = x * 2.0;  // pending
  gradcheck([](const std::vector<Tensor>& in) { return sum(exp(in[0])); }, {host({0.5}, Shape{1})});
  EXPECT_EQ(y.to_vector(), (std::vector<double>{2, 4}));
}

TEST(EngineTraining, SgdFitsALinearModel) {
  Tensor w = Tensor::parameter("fit.w", host({0, 0}, Shape{2, 1}));
  optim::SGD opt({w}, 0.1, 0.5);
  double loss = 0;
  for (int i = 0; i < 200; ++i) {
    double a = std::sin(i), b = std::cos(i);
    loss = linear_step(w, opt, {a, b}, 2 * a - 3 * b);
  }
  EXPECT_LT(loss, 1e-6);
  EXPECT_NEAR(w.to_vector()[0], 2.0, 1e-3);
  EXPECT_NEAR(w.to_vector()[1], -3.0, 1e-3);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Regressions from the review of the foundation.

TEST(EngineRegression, TemporariesNeverAliasAnotherTensorsData) {
  Tensor acc = Tensor::scalar(0.0);
  for (int i = 1; i <= 4; ++i) acc = acc + Tensor::scalar(i);  // each temporary dies at once
  EXPECT_EQ(acc.item(), 10.0);
}

TEST(EngineRegression, GradientsOfParametersTheStepDoesNotReadAreZero) {
  Tensor w = Tensor::parameter("reg.w", Tensor::from_vector({1}, {1}).to_host());
  Tensor b = Tensor::parameter("reg.b", Tensor::from_vector({1}, {1}).to_host());
  (sum(w * b)).backward();
  Engine::current().realize();
  EXPECT_EQ(b.grad().item(), 1.0);
  sum(w * 3.0).backward();  // b not read this step
  Engine::current().realize();
  EXPECT_EQ(b.grad().item(), 0.0);
  EXPECT_EQ(w.grad().item(), 3.0);
}

TEST(EngineRegression, ASecondBackwardInOneStepAdds) {
  Tensor w = Tensor::parameter("reg2.w", Tensor::from_vector({1}, {1}).to_host());
  sum(w * 2.0).backward();
  sum(w * 3.0).backward();
  Engine::current().realize();
  EXPECT_EQ(w.grad().item(), 5.0);
}

TEST(EngineRegression, BackwardOfARealizedLossIsAnError) {
  Tensor w = Tensor::parameter("reg3.w", Tensor::from_vector({1}, {1}).to_host());
  Tensor loss = sum(w * 2.0);
  loss.item();
  EXPECT_THROW(loss.backward(), Error);
}

TEST(EngineRegression, ATensorFromAnotherThreadIsRefused) {
  Tensor x = Tensor::from_vector({42}, {1}) * 1.0;  // pending on this thread
  std::string message;
  std::thread t([&] {
    try {
      (x * 1.0).item();
    } catch (const Error& e) {
      message = e.what();
    }
  });
  t.join();
  EXPECT_NE(message.find("another thread"), std::string::npos) << message;
  EXPECT_EQ(x.item(), 42.0);
}

TEST(EngineRegression, AFailedStepChangesNoParameter) {
  Tensor w = Tensor::parameter("reg4.w", Tensor::from_vector({0}, {1}).to_host(), false);
  w.assign(w + 1.0);
  Tensor bad = gather_rows(Tensor::from_vector({1, 2}, {1, 2}), Tensor::from_ints({3}, {1}));
  EXPECT_THROW(bad.to_vector(), Error);
  EXPECT_EQ(w.item(), 0.0);
}

TEST(EngineRegression, CrossEntropyWithMinusInfinityLogitIsFinite) {
  double inf = std::numeric_limits<double>::infinity();
  Tensor logits = Tensor::from_vector({0.5, -inf, 1.0}, {1, 3}, DType::f64);
  double loss = cross_entropy(logits, Tensor::from_ints({2}, {1})).item();
  EXPECT_NEAR(loss, std::log(std::exp(0.5) + std::exp(1.0)) - 1.0, 1e-12);
}

TEST(EngineRegression, UndefinedTensorsAndEmptyBatchesThrowOrWork) {
  EXPECT_THROW(optim::SGD({Tensor()}, 0.1), Error);
  Tensor w = Tensor::parameter("reg5.w", HostTensor::zeros(DType::f32, {3, 2}));
  Tensor x = Tensor::from_host(HostTensor::zeros(DType::f32, {2, 0, 3}));
  sum(matmul(x, w)).backward();
  Engine::current().realize();
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(6, 0.0));
}

}  // namespace
}  // namespace kiln
