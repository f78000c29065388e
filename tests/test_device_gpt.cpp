// Whole GPT training steps on the CUDA back end: through the fake driver (every kernel in the
// SIMT simulator) in CI, and on a real GPU in the GPU tier (skipped without one). The device
// runs must match the PyTorch reference with its README's f32 tolerances (logits and loss 1e-5,
// each gradient 1e-4, norm-relative), and training steps with dropout must match the CPU's
// losses and gradients (the dropout masks are the same Philox bits on both).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <thread>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/trainer.hpp>
#include <kiln/train/weights.hpp>

#include "device_test_util.hpp"
#include "gpt_reference_util.hpp"
#include "ptxas_skip.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

void reference_forward_backward(cuda::Runtime& rt) {
  KILN_REQUIRE_REFERENCE();
  testing::OnDevice on(rt);
  testing::check_reference_forward_backward(DType::f32, 1e-5, 1e-4, rt.device_name());
}

// Two AdamW steps of a small GPT with dropout on the CPU and on `rt`, from the same init: the
// losses of both steps agree to 1e-5 and every gradient of the first step to 1e-4 (the README's
// f32 gradient tolerance, norm-relative). Parameters after the updates are not compared: Adam
// divides each gradient by its own magnitude, so for a gradient that is zero in exact
// arithmetic (the attention key bias) it turns f32 rounding noise into full-size steps.
void training_steps_match_cpu(cuda::Runtime& rt, const models::GPTConfig& c = testing::tiny_gpt_config(2),
                              int64_t batch = 2, Precision precision = Precision::f32) {
  ScopedPrecision policy(precision);
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{batch, c.block_size});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 5 + 3) % 13));
  struct Run {
    std::vector<double> losses;
    std::vector<std::pair<std::string, HostTensor>> first_grads;
  };
  auto train = [&](bool device) {
    manual_seed(77);
    models::GPT model(c);
    std::unique_ptr<testing::OnDevice> on = device ? std::make_unique<testing::OnDevice>(rt) : nullptr;
    optim::AdamW opt(model.parameters(), {1e-2, 0.9, 0.999, 1e-8, 0.01});
    Tensor x = Tensor::from_host(ids), y = Tensor::from_host(ids);
    Run r;
    for (int s = 0; s < 2; ++s) {
      Tensor loss = model.loss(x, y);
      loss.backward();
      opt.step(1.0);
      r.losses.push_back(loss.item());
      size_t bf16_casts = 0;  // the precision asked for is what was recorded (the CPU's passes hold
                              // bf16 values as rounded f32: no cast is left in its plan)
      for (const Op& op : Engine::current().last_plan()->recorded.ops())
        bf16_casts += op.is(PrimId::cast) && op.params.dtype == DType::bf16;
      EXPECT_EQ(bf16_casts > 0, precision == Precision::bf16);
      if (s == 0)
        for (const auto& [name, p] : model.named_parameters()) r.first_grads.emplace_back(name, p.grad().to_host());
    }
    return r;
  };
  Run cpu = train(false), dev = train(true);
  for (size_t s = 0; s < cpu.losses.size(); ++s)
    EXPECT_NEAR(dev.losses[s], cpu.losses[s], 1e-5 * std::abs(cpu.losses[s])) << "step " << s;
  ASSERT_EQ(dev.first_grads.size(), cpu.first_grads.size());
  for (size_t i = 0; i < cpu.first_grads.size(); ++i)
    EXPECT_LT(testing::relative_error(dev.first_grads[i].second, cpu.first_grads[i].second), 1e-4)
        << cpu.first_grads[i].first;
}

// Deterministic mode: a run stopped after 3 of 6 steps (checkpoint written: parameters and
// Adam moments come home from the device) and resumed in a fresh model gives the uninterrupted
// run's losses and weights to the bit. The trainer replays a traced step with dropout, so the
// random streams, AdamW's step count and the resident tensors all have to resume exactly.
void resumed_run_is_bit_exact(cuda::Runtime& rt) {
  testing::OnDevice on(rt);
  Engine::current().set_deterministic(true);
  std::string text;
  for (int i = 0; i < 300; ++i) text += "abcab cabba "[(i * 7) % 12];
  Tokenizer tok = Tokenizer::char_level(text);
  TextDataset data(tok.encode(text), 4);
  const std::string ckpt =
      (std::filesystem::temp_directory_path() / ("kiln_device_resume_" + std::to_string(::getpid()) + ".h5")).string();
  struct Run {
    std::vector<double> losses, weights;
  };
  auto run = [&](int64_t stop_at, const std::string& checkpoint, bool resume) {
    manual_seed(resume ? 999 : 8);  // the checkpoint restores the random counter, not the seed call
    models::GPTConfig c = testing::tiny_gpt_config(1);
    c.vocab_size = tok.vocab_size();
    models::GPT model(c);
    TrainOptions o;
    o.batch = 2;
    o.steps = 6;
    o.lr = 1e-2;
    o.warmup = 2;
    o.eval_interval = 0;
    o.eval_batches = 1;
    o.log_interval = 1000;
    o.checkpoint = checkpoint;
    o.checkpoint_interval = 0;
    o.stop_at = stop_at;
    Trainer t(model, data, tok, 4, o);
    if (resume) t.resume(ckpt);
    Run r;
    r.losses = t.run().losses;
    for (const auto& [name, p] : model.named_parameters())
      for (double v : p.to_vector()) r.weights.push_back(v);
    return r;
  };
  Run full = run(0, "", false);
  run(3, ckpt, false);
  Run rest = run(0, "", true);
  Engine::current().set_deterministic(false);
  std::filesystem::remove(ckpt);
  ASSERT_EQ(rest.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest.losses[i], full.losses[3 + i]) << "step " << 3 + i;
  EXPECT_EQ(rest.weights, full.weights);
}

TEST(FakeGpuGpt, DeterministicResumedRunIsBitExact) { resumed_run_is_bit_exact(testing::fake_runtime()); }

TEST(GpuGpt, DeterministicResumedRunIsBitExact) {
  KILN_GPU_OR_SKIP(rt);
  resumed_run_is_bit_exact(*rt);
}

// The engine is per thread and the driver's current context too: steps realized on a thread
// that did not create the runtime run (the runtime makes its context current there) and give
// the bits of the same steps on the creating thread.
TEST(FakeGpuGpt, StepsOnAnotherThreadGiveTheSameBits) {
  cuda::Runtime& rt = testing::fake_runtime();  // created on this thread
  const models::GPTConfig c = testing::tiny_gpt_config(1);
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{2, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 5 + 3) % 13));
  auto train = [&] {
    manual_seed(5);
    testing::OnDevice on(rt);
    models::GPT model(c);
    optim::AdamW opt(model.parameters(), {});
    Tensor x = Tensor::from_host(ids), y = Tensor::from_host(ids);
    std::vector<double> losses;
    for (int s = 0; s < 2; ++s) {
      Tensor loss = model.loss(x, y);
      loss.backward();
      opt.step(1.0);
      losses.push_back(loss.item());
    }
    return losses;
  };
  std::vector<double> other;
  std::string error;
  std::thread worker([&] {
    try {
      other = train();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  worker.join();
  ASSERT_EQ(error, "");
  EXPECT_EQ(other, train());
}

TEST(FakeGpuGpt, ReferenceForwardBackwardInTheSimulator) { reference_forward_backward(testing::fake_runtime()); }

TEST(FakeGpuGpt, TrainingStepsWithDropoutMatchTheCpu) { training_steps_match_cpu(testing::fake_runtime()); }

// 5 x 32 = 160 rows: the layer norms' parameter gradients split their rows across blocks, and
// the clipped AdamW sums its groups across blocks; the simulator interleaves the blocks and
// checks every global read's ordering.
TEST(FakeGpuGpt, StepsAtSizesThatSplitRowsAcrossBlocksMatchTheCpu) {
  models::GPTConfig c = testing::tiny_gpt_config(1);
  c.block_size = 32;
  training_steps_match_cpu(testing::fake_runtime(), c, 5);
}

// Mixed precision with bf16-mma=off: the same two steps with bf16 matmul operands (casts
// folded into the matmuls as roundings, the matmul kernels widening bf16 tiles to f32) agree
// with the CPU's bf16 steps as closely as f32 steps do: both round the same f32 values to bf16
// and multiply them exactly.
void widened_bf16_training_steps_match_cpu(cuda::Runtime& rt) {
  testing::ScopedTarget widened(testing::matmul("bf16-mma=off"));
  training_steps_match_cpu(rt, testing::tiny_gpt_config(2), 2, Precision::bf16);
}

TEST(FakeGpuGpt, Bf16TrainingStepsOnWidenedTilesMatchTheCpu) {
  widened_bf16_training_steps_match_cpu(testing::fake_runtime());
}

// The same with the bf16 mma.sync kernel (ldmatrix, cp.async; the default but on a real sm_90
// device) on every matmul whose operands qualify: the activations' casts are then kernels, so that
// the matmuls read stored bf16. With `wgmma` (the default on a real H100 or H200): sm_90a's wgmma.
void bf16_mma_training_steps_match_cpu(cuda::Runtime& rt, bool wgmma) {
  testing::ScopedTarget on(testing::matmul(wgmma ? "bf16-mma=on,wgmma=on" : "bf16-mma=on,wgmma=off"));
  const std::string kernel = wgmma ? "wgmma m64n" : "mma.sync bf16";
  training_steps_match_cpu(rt, testing::tiny_gpt_config(2), 2, Precision::bf16);
  size_t bf16_mma_kernels = 0;
  for (const Plan* p : Engine::current().plan_cache().plans())
    // This function's plans: its matmul policy, lowered for `rt`.
    if (p->device && p->target.matmul == Engine::current().target().matmul && &p->device->runtime() == &rt)
      for (size_t at = p->device->dump().find(kernel); at != std::string::npos;
           at = p->device->dump().find(kernel, at + 1))
        ++bf16_mma_kernels;
  // Each layer's four products (qkv, projection, MLP up and down) forward, their input gradients
  // (dY W^T: k-contiguous operands) and their weight gradients (X^T dY: [k][row] stages): 2 x 12;
  // and the LM head's three, whose logits' gradient (rows of 13) pad_bf16_rows pads to 16.
  EXPECT_GE(bf16_mma_kernels, 27u);
  std::printf("matmuls on the bf16 mma kernel: %zu\n", bf16_mma_kernels);
}

TEST(FakeGpuGpt, Bf16MmaTrainingStepsMatchTheCpu) { bf16_mma_training_steps_match_cpu(testing::fake_runtime(), false); }

TEST(GpuGpt, Bf16MmaTrainingStepsMatchTheCpu) {
  KILN_GPU_OR_SKIP(rt);
  bf16_mma_training_steps_match_cpu(*rt, false);
}

// The same on sm_90a's wgmma: the simulator here, an H100 or H200 in the GPU tier.
TEST(FakeGpuGpt, Bf16WgmmaTrainingStepsMatchTheCpu) {
  bf16_mma_training_steps_match_cpu(testing::fake_runtime(), true);
}

TEST(GpuGpt, Bf16WgmmaTrainingStepsMatchTheCpu) {
  KILN_GPU_OR_SKIP(rt);
  if (rt->sm() != 90) GTEST_SKIP() << "wgmma needs sm_90a; this GPU is sm_" << rt->sm();
  bf16_mma_training_steps_match_cpu(*rt, true);
}

TEST(GpuGpt, Bf16TrainingStepsOnWidenedTilesMatchTheCpu) {
  KILN_GPU_OR_SKIP(rt);
  widened_bf16_training_steps_match_cpu(*rt);
}

TEST(GpuGpt, ReferenceForwardBackward) {
  KILN_GPU_OR_SKIP(rt);
  reference_forward_backward(*rt);
}

TEST(GpuGpt, TrainingStepsWithDropoutMatchTheCpu) {
  KILN_GPU_OR_SKIP(rt);
  training_steps_match_cpu(*rt);
}

// Regressions: a cached plan must run on the runtime the engine uses now (a plan lowered for
// the fake device once kept running there when the GPU tier switched to a real GPU), and a
// failed switch must leave the engine where it was.
TEST(FakeGpuEngine, ACachedPlanRunsOnTheCurrentRuntimeAndAFailedSwitchChangesNothing) {
  cuda::Runtime other(cuda::fake_driver(), cuda::RuntimeOptions{"off", "", true});
  Tensor x = Tensor::from_vector({1.0, 2.0, 3.0}, Shape{3});
  auto step = [&] { return sum(x * x + 1.0).item(); };
  {
    testing::OnDevice on(testing::fake_runtime());
    EXPECT_EQ(step(), 17.0);
  }
  const int64_t before = other.stats().launches;
  testing::OnDevice on(other);
  EXPECT_EQ(step(), 17.0);
  EXPECT_GT(other.stats().launches, before);
  if (!cuda::Runtime::system()) {
    EXPECT_THROW(Engine::current().set_device(Device::CUDA), Error);
    EXPECT_EQ(Engine::current().device(), Device::CUDA);
    EXPECT_EQ(step(), 17.0);
  }
}

void every_kernel_of_a_training_step_passes_ptxas(Precision precision) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  ScopedPrecision policy(precision);
  const models::GPTConfig c = testing::tiny_gpt_config(1);
  manual_seed(3);
  models::GPT model(c);
  testing::OnDevice on(testing::fake_runtime());
  optim::AdamW opt(model.parameters(), {});
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{2, 8});
  Tensor x = Tensor::from_host(ids);
  Tensor loss = model.loss(x, x);
  loss.backward();
  opt.step(1.0);
  Engine::current().realize();  // the step: one plan
  std::vector<const kir::Kernel*> kernels;
  const Plan* step = Engine::current().last_plan();
  ASSERT_TRUE(step && step->device);
  for (const auto& k : step->device->kernels()) kernels.push_back(k.launch->kernel.get());
  ASSERT_GT(kernels.size(), 20u);
  testing::expect_ptxas_accepts(kernels);
}

TEST(FakeGpuGpt, EveryKernelOfATrainingStepPassesPtxas) {
  every_kernel_of_a_training_step_passes_ptxas(Precision::f32);
}

TEST(FakeGpuGpt, EveryKernelOfABf16TrainingStepPassesPtxas) {
  every_kernel_of_a_training_step_passes_ptxas(Precision::bf16);
}

}  // namespace
}  // namespace kiln
