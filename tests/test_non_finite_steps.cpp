// AdamW's skip_non_finite (train/adamw.hpp): a step whose gradients or loss are not finite
// leaves the parameters, both moments and the step count as they were, and the run afterwards
// is the run that never had that step, to the bit: recorded every step or traced and replayed,
// on the Eigen executor and on the fake GPU (the guard's select lowered to PTX).
#include <gtest/gtest.h>

#include <limits>
#include <memory>

#include <kiln/core/traced_step.hpp>
#include <kiln/train/adamw.hpp>

#include "device_test_util.hpp"

namespace kiln {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

HostTensor f32(const std::vector<double>& v) {
  return Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}).to_host();
}

struct Outcome {
  std::vector<double> w, exp_avg, exp_avg_sq;
  std::vector<bool> applied;
  int64_t steps = 0;
};

// AdamW steps on loss = sum(x * w * w) / 2 (gradient x * w) with one x per step.
Outcome run(const std::vector<std::vector<double>>& xs, bool traced, double max_grad_norm) {
  Tensor w = Tensor::parameter("w", f32({0.5, -1.0, 2.0, 0.25}));
  optim::AdamWOptions o{1e-1, 0.9, 0.99, 1e-8, 0.1};
  o.skip_non_finite = true;
  optim::AdamW opt({w}, o);
  Outcome out;
  Tensor x = Tensor::from_host(f32(xs[0]));
  auto record = [&] {
    Tensor loss = sum(x * w * w) * 0.5;
    loss.backward();
    opt.step(max_grad_norm, loss);
    return std::vector<Tensor>{loss};
  };
  std::unique_ptr<TracedStep> trace;
  for (size_t s = 0; s < xs.size(); ++s) {
    if (!traced) {
      x = Tensor::from_host(f32(xs[s]));
      record();
    } else if (!trace) {
      trace = std::make_unique<TracedStep>(std::vector<Tensor>{x}, record);
    } else {
      trace->run({f32(xs[s])});
    }
    out.applied.push_back(opt.last_step_applied());
  }
  out.w = w.to_vector();
  const optim::AdamWMoments moments = opt.whole_moments();
  for (int64_t i = 0; i < moments.exp_avg[0].numel(); ++i) {
    out.exp_avg.push_back(moments.exp_avg[0].get(i));
    out.exp_avg_sq.push_back(moments.exp_avg_sq[0].get(i));
  }
  out.steps = opt.steps();
  return out;
}

void expect_skips_leave_no_trace(bool traced, double max_grad_norm) {
  const std::vector<double> a{1, 2, 3, 4}, b{-2, 0.5, 1, 3}, c{0.5, 0.5, -1, 2};
  const std::vector<double> inf_grad{1, kInf, 3, 4}, nan_grad{kNaN, 2, 3, 4};
  Outcome with_skips = run({a, inf_grad, b, nan_grad, c}, traced, max_grad_norm);
  Outcome without = run({a, b, c}, traced, max_grad_norm);
  EXPECT_EQ(with_skips.applied, (std::vector<bool>{true, false, true, false, true}));
  EXPECT_EQ(with_skips.steps, 3);
  EXPECT_EQ(with_skips.w, without.w);
  EXPECT_EQ(with_skips.exp_avg, without.exp_avg);
  EXPECT_EQ(with_skips.exp_avg_sq, without.exp_avg_sq);
  for (double v : with_skips.w) EXPECT_TRUE(std::isfinite(v));
}

TEST(NonFiniteSteps, ASkippedStepLeavesNoTraceWhenRecordedEachStep) { expect_skips_leave_no_trace(false, 0.0); }
TEST(NonFiniteSteps, ASkippedStepLeavesNoTraceWhenReplayed) { expect_skips_leave_no_trace(true, 0.0); }
TEST(NonFiniteSteps, ASkippedStepLeavesNoTraceWithClipping) { expect_skips_leave_no_trace(true, 1.0); }
TEST(NonFiniteSteps, ASkippedStepLeavesNoTraceOnTheFakeGpu) {
  testing::OnDevice on(testing::fake_runtime());
  expect_skips_leave_no_trace(true, 1.0);
}

// A finite gradient with a non-finite loss is skipped as well (the loss joins the test).
TEST(NonFiniteSteps, ANonFiniteLossAloneSkipsTheStep) {
  Tensor w = Tensor::parameter("w", f32({1.0, 2.0}));
  optim::AdamWOptions o;
  o.skip_non_finite = true;
  optim::AdamW opt({w}, o);
  const std::vector<double> before = w.to_vector();
  Tensor l = sum(w * w) + sum(Tensor::from_host(f32({kInf})));  // gradient 2w: finite
  l.backward();
  opt.step(0.0, l);
  EXPECT_FALSE(opt.last_step_applied());
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_EQ(w.to_vector(), before);
  EXPECT_FLOAT_EQ(opt.last_grad_norm(), std::sqrt(4.0 + 16.0));
}

}  // namespace
}  // namespace kiln
