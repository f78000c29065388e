// Traced steps (core/traced_step.hpp): a GPT training step (dropout, AdamW with clipping and
// weight decay, a learning rate that moves every step, a reseed mid-run) recorded once and
// replayed gives the losses, gradient norms and weights of recording every step anew, to the
// bit, on the Eigen executor and on the fake GPU; replays neither record nor look up plans;
// misuse is a clear error that leaves the engine usable.
#include <gtest/gtest.h>

#include <memory>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/traced_step.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/sgd.hpp>

#include "device_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

// Tokens [2, 8] of step `step`; `shift` 1 gives the targets.
HostTensor tokens(int64_t step, int64_t shift) {
  HostTensor t = HostTensor::zeros(DType::i32, Shape{2, 8});
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>((step * 5 + (i + shift) * 3) % 13));
  return t;
}

struct TrainedRun {
  std::vector<double> losses, norms, weights;
  int64_t optimizer_steps = 0;
  uint64_t random_counter = 0;
  int recorded = 0;  // times the step's C++ code ran
  EngineStats after_first, at_end;
};

TrainedRun train(bool traced, int steps) {
  Engine& engine = Engine::current();
  manual_seed(5);
  models::GPT model(testing::tiny_gpt_config(1));  // dropout 0.1: random streams every step
  optim::AdamW opt(model.parameters(), {1e-2, 0.9, 0.99, 1e-8, 0.1});
  TrainedRun r;
  std::unique_ptr<TracedStep> trace;
  for (int s = 0; s < steps; ++s) {
    opt.set_lr(1e-2 / (1.0 + s));
    if (s == 2) manual_seed(77);  // the replay draws its streams from the new seed as well
    Tensor x = Tensor::from_host(tokens(s, 0)), y = Tensor::from_host(tokens(s, 1));
    auto record = [&] {
      ++r.recorded;
      Tensor loss = model.loss(x, y);
      loss.backward();
      opt.step(/*max_grad_norm=*/0.5);
      return std::vector<Tensor>{loss};
    };
    Tensor loss;
    if (!traced) {
      loss = record()[0];
    } else if (!trace) {
      trace = std::make_unique<TracedStep>(std::vector<Tensor>{x, y}, record);
      loss = trace->outputs()[0];
    } else {
      loss = trace->run({tokens(s, 0), tokens(s, 1)})[0];
    }
    r.losses.push_back(loss.item());
    r.norms.push_back(opt.last_grad_norm());
    if (s == 0) r.after_first = engine.stats();
  }
  for (const auto& [name, p] : model.named_parameters())
    for (double v : p.to_vector()) r.weights.push_back(v);
  r.optimizer_steps = opt.steps();
  r.random_counter = engine.random_counter();
  r.at_end = engine.stats();
  return r;
}

void expect_same_run(const TrainedRun& traced, const TrainedRun& recorded, int steps) {
  EXPECT_EQ(traced.recorded, 1);
  EXPECT_EQ(recorded.recorded, steps);
  EXPECT_EQ(traced.losses, recorded.losses);
  EXPECT_EQ(traced.norms, recorded.norms);
  EXPECT_EQ(traced.weights, recorded.weights);
  EXPECT_EQ(traced.optimizer_steps, steps);
  EXPECT_EQ(recorded.optimizer_steps, steps);
  EXPECT_EQ(traced.random_counter, recorded.random_counter);
  // Replays record nothing: no plan built or looked up after the first step.
  EXPECT_EQ(traced.at_end.plans_built, traced.after_first.plans_built);
  EXPECT_EQ(traced.at_end.cache_hits, traced.after_first.cache_hits);
  EXPECT_EQ(traced.at_end.replays - traced.after_first.replays, static_cast<uint64_t>(steps - 1));
  // The losses moved: a replay that reused the first batch or scalars would not match anyway,
  // but a run that did not train at all would make the comparison weak.
  EXPECT_NE(traced.losses.front(), traced.losses.back());
}

TEST(TracedStep, ReplayEqualsRecordingEveryStepToTheBit) {
  const int steps = 5;
  TrainedRun recorded = train(false, steps), traced = train(true, steps);
  expect_same_run(traced, recorded, steps);
}

TEST(TracedStep, ReplayEqualsRecordingEveryStepOnTheFakeGpu) {
  testing::OnDevice on(testing::fake_runtime());
  const int steps = 3;
  TrainedRun recorded = train(false, steps), traced = train(true, steps);
  expect_same_run(traced, recorded, steps);
}

HostTensor f64(const std::vector<double>& v) {
  return Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}, DType::f64).to_host();
}

// An SGD step on one parameter: loss = sum((x * w)^2) / 2 over x [3].
struct SgdStep {
  Tensor w = Tensor::parameter("w", f64({1, 2, 3}));
  optim::SGD opt{{w}, 0.1};
  Tensor x = Tensor::from_host(f64({1, 1, 1}));
  std::vector<Tensor> record() {
    Tensor loss = sum(x * w * x * w) * 0.5;
    loss.backward();
    opt.step();
    return {loss};
  }
};

TEST(TracedStep, KeepsItsPlanWhenTheCacheForgetsIt) {
  SgdStep s;
  TracedStep trace({s.x}, [&] { return s.record(); });
  // Steps of other shapes fill the cache until it has evicted the traced step's plan.
  PlanCache& cache = Engine::current().plan_cache();
  const Plan* traced = cache.plans().front();
  for (int64_t n = 1; n <= static_cast<int64_t>(cache.capacity()); ++n)
    (Tensor::from_host(HostTensor::zeros(DType::f64, Shape{n})) * 3.0).to_vector();
  for (const Plan* p : cache.plans()) ASSERT_NE(p, traced);
  s.opt.set_lr(0.5);  // seen by the replay: w -= 0.5 * x^2 w
  trace.run({f64({2, 2, 2})});
  // After the first run w = 0.9 * (1, 2, 3); the replay's gradient is x^2 w = 4 w, so w -= 2 w.
  std::vector<double> w = s.w.to_vector();
  ASSERT_EQ(w.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[static_cast<size_t>(i)], -0.9 * (i + 1), 1e-12);
  EXPECT_NEAR(trace.outputs()[0].item(), 0.5 * 4 * (0.81 + 3.24 + 7.29), 1e-12);
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TracedStep, MisuseIsAClearErrorAndTheEngineStaysUsable) {
  SgdStep s;
  expect_error([&] { TracedStep t({s.x * 2.0}, [&] { return s.record(); }); }, "must be a realized tensor");
  Tensor unused = Tensor::from_host(f64({0}));
  expect_error([&] { TracedStep t({unused}, [&] { return s.record(); }); }, "is not read by the step");
  expect_error([&] { TracedStep t({s.x}, [&] { return std::vector<Tensor>{s.x}; }); }, "realized 0 times");
  expect_error(
      [&] {
        TracedStep t({s.x}, [&] {
          (void)sum(s.x * s.w).item();  // realizes mid-step
          return s.record();
        });
      },
      "realized 2 times");
  expect_error(
      [&] {
        TracedStep t({s.x}, [&] {
          auto out = s.record();
          (void)(s.x * 2.0);  // recorded after the step realized
          return out;
        });
      },
      "recorded after the step realized");
  expect_error(
      [&] {
        TracedStep t({s.x}, [&] {
          s.record();
          return std::vector<Tensor>{s.x};
        });
      },
      "output 0 was not computed by the traced step");
  expect_error(
      [&] {
        TracedStep t({s.x}, [&] {
          TracedStep inner({s.x}, [&] { return s.record(); });
          return inner.outputs();
        });
      },
      "already being traced");
  // A failing step's own error comes out, and the engine is not left tracing.
  expect_error([&] { TracedStep t({s.x}, [&]() -> std::vector<Tensor> { throw Error("the step's own error"); }); },
               "the step's own error");
  Engine::current().realize();  // drops what the failed attempts left pending

  TracedStep trace({s.x}, [&] { return s.record(); });
  expect_error([&] { trace.run({}); }, "0 inputs given, traced with 1");
  expect_error([&] { trace.run({HostTensor::zeros(DType::f32, Shape{3})}); },
               "input 0 was traced as f64[3], received f32[3]");
  {
    testing::OnDevice on(testing::fake_runtime());
    expect_error([&] { trace.run({HostTensor::zeros(DType::f64, Shape{3})}); },
                 "traced on cpu, the engine is now on cuda; trace it again");
  }
  {  // the same device, another Target (its plan would be another plan) or passes
    testing::ScopedTarget tf32([](Target& t) { t.tf32 = true; });
    expect_error([&] { trace.run({HostTensor::zeros(DType::f64, Shape{3})}); }, "traced for the Target 'cpu");
  }
  {
    testing::ScopedPipeline no_cse("-cse");
    expect_error([&] { trace.run({HostTensor::zeros(DType::f64, Shape{3})}); }, "with other passes switched off");
  }
  // Still replays after the refusals, and an untraced step runs normally.
  trace.run({HostTensor::zeros(DType::f64, Shape{3})});
  EXPECT_EQ(trace.outputs()[0].item(), 0.0);
  EXPECT_NO_THROW(sum(s.w).item());
}

}  // namespace
}  // namespace kiln
