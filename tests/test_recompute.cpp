// The recompute pass (circuit/passes/recompute.hpp) on recorded training steps: each mode's loss
// and gradients equal `none`'s (GPT with dropout, Llama with grouped queries, the GPU's passes),
// what each mode makes again (no matmul in auto; matmuls in blocks), the memory it saves, and the
// memory budget's search and errors.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/recompute.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/step_stats.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/models/llama.hpp>

#include "device_test_util.hpp"
#include "expect_error.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

// One training step's loss and gradients (the same dropout draws each time: the seed is reset).
struct StepResult {
  double loss = 0;
  std::vector<HostTensor> grads;
};

StepResult run_step(models::CausalLM& model, int64_t t, int64_t batch = 2) {
  model.zero_grad();
  manual_seed(11);
  HostTensor tokens = HostTensor::zeros(DType::i32, Shape{batch, t});
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.set(i, static_cast<double>((i * 7 + 3) % 13));
  Tensor x = Tensor::from_host(tokens);
  Tensor loss = model.loss(x, x);
  loss.backward();
  Engine::current().realize();
  StepResult r{loss.item(), {}};
  for (Tensor& p : model.parameters()) r.grads.push_back(p.grad().to_host());
  return r;
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every mode against none: the same loss and gradients, bit for bit (the copies run the
// originals' kernels on the same inputs; dropout draws from the same Philox counters).
void expect_modes_equal_none(models::CausalLM& model, int64_t t, const std::string& what) {
  StepResult none;
  {
    testing::ScopedPipeline mode(testing::recompute(RecomputeMode::none));
    none = run_step(model, t);
  }
  for (RecomputeMode m : {RecomputeMode::automatic, RecomputeMode::blocks}) {
    testing::ScopedPipeline mode(testing::recompute(m));
    const StepResult got = run_step(model, t);
    const StepStats stats = measure_step(*Engine::current().last_plan());
    EXPECT_GT(stats.ops[static_cast<size_t>(Phase::Recompute)], 0u) << what << " " << recompute_mode_name(m);
    EXPECT_EQ(got.loss, none.loss) << what << " " << recompute_mode_name(m);
    ASSERT_EQ(got.grads.size(), none.grads.size());
    for (size_t i = 0; i < got.grads.size(); ++i)
      EXPECT_TRUE(same_bits(got.grads[i], none.grads[i]))
          << what << " " << recompute_mode_name(m) << ": gradient " << i << " differs, relative error "
          << testing::relative_error(got.grads[i], none.grads[i]);
  }
}

TEST(Recompute, GptStepsWithDropoutEqualNone) {
  models::GPTConfig cfg = testing::tiny_gpt_config(2);  // dropout 0.1, attention's included
  manual_seed(5);
  models::GPT model(cfg);
  expect_modes_equal_none(model, 7, "gpt");
}

// A small Llama: 4 heads over 2 key/value heads (grouped queries), 32 wide, vocabulary 13.
models::LlamaConfig small_llama(int64_t layers, int64_t block) {
  models::LlamaConfig cfg;
  cfg.n_layer = layers;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.n_embd = 32;
  cfg.block_size = block;
  cfg.vocab_size = 13;
  return cfg;
}

TEST(Recompute, LlamaStepsEqualNone) {
  manual_seed(5);
  models::Llama model(small_llama(2, 16));
  expect_modes_equal_none(model, 9, "llama");
}

// Gradient accumulation: two micro-batches' forward and backward in one recording (as kiln train
// --grad-accum 2 records them); each micro-batch's saved values are recomputed before its own
// backward, and the gradients equal none's.
TEST(Recompute, AccumulatedMicroBatchesEqualNone) {
  models::GPTConfig cfg = testing::tiny_gpt_config(2);
  manual_seed(5);
  models::GPT model(cfg);
  auto step = [&](int64_t micro) {
    model.zero_grad();
    manual_seed(11);
    HostTensor tokens = HostTensor::zeros(DType::i32, Shape{2 * micro, 8});
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.set(i, static_cast<double>((i * 5 + 1) % 13));
    const std::vector<Tensor> xs = split(Tensor::from_host(tokens), 0, std::vector<int64_t>(micro, 2));
    for (const Tensor& x : xs) (model.loss(x, x) * (1.0 / static_cast<double>(micro))).backward();
    Engine::current().realize();
    std::vector<HostTensor> grads;
    for (Tensor& p : model.parameters()) grads.push_back(p.grad().to_host());
    return grads;
  };
  std::vector<HostTensor> none;
  {
    testing::ScopedPipeline mode(testing::recompute(RecomputeMode::none));
    none = step(2);
  }
  testing::ScopedPipeline mode(testing::recompute(RecomputeMode::automatic));
  step(1);
  const StepStats one = measure_step(*Engine::current().last_plan());
  const std::vector<HostTensor> got = step(2);
  // Both micro-batches' forwards are forward work (Engine::backward records what follows it so),
  // each keeping what one micro-batch keeps; the second's counted as backward work would not be
  // recomputed (nor counted).
  const StepStats two = measure_step(*Engine::current().last_plan());
  EXPECT_EQ(two.saved_bytes, 2 * one.saved_bytes);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], none[i])) << "gradient " << i;
}

// The GPU's passes (fused matmuls with prologues, column sums) over the recomputed step, run by
// the CPU executor.
TEST(Recompute, GpuPlansEqualNone) {
  testing::ScopedTarget gpu([](Target& t) { t = with_device_of(t, cuda_target(90, /*fake=*/true)); });
  models::GPTConfig cfg = testing::tiny_gpt_config(2);
  manual_seed(5);
  models::GPT model(cfg);
  expect_modes_equal_none(model, 8, "gpt on the GPU's passes");
}

// auto makes nothing again that costs a matmul, attention or a reduction, and keeps less; blocks
// recomputes the blocks' matmuls (their forward FLOPs, not the head's) and keeps less still.
TEST(Recompute, EachModeKeepsLessAndAutoRecomputesNoMatmul) {
  models::GPTConfig cfg = testing::tiny_gpt_config(3);
  cfg.dropout = 0;
  cfg.block_size = 32;  // activations well over the parameters and their update, as in training
  manual_seed(5);
  models::GPT model(cfg);
  const int64_t t = 32, batch = 4;
  StepStats stats[3];
  size_t workspace[3];
  for (RecomputeMode m : {RecomputeMode::none, RecomputeMode::automatic, RecomputeMode::blocks}) {
    testing::ScopedPipeline mode(testing::recompute(m));
    run_step(model, t, batch);
    const Plan& plan = *Engine::current().last_plan();
    stats[static_cast<int>(m)] = measure_step(plan);
    workspace[static_cast<int>(m)] = plan.program->workspace_bytes();
    if (m != RecomputeMode::automatic) continue;
    for (const Op& op : plan.program->circuit().ops()) {
      if (op.phase != Phase::Recompute) continue;
      EXPECT_TRUE(!op.is(PrimId::matmul) && !op.is(PrimId::attention) && !op.is(PrimId::reduce)) << op.prim->name;
    }
  }
  EXPECT_EQ(stats[0].ops[static_cast<size_t>(Phase::Recompute)], 0u);
  EXPECT_EQ(stats[1].recomputed_matmul_flops, 0.0);
  // Each block's qkv product (6 N C^2 FLOPs over N tokens), the attention's projection (2) and the
  // MLP's first product (8); not the MLP's last, whose output only the residual sum reads.
  const double c = static_cast<double>(cfg.n_embd), tokens = static_cast<double>(t * batch);
  EXPECT_EQ(stats[2].recomputed_matmul_flops, 3 * 16 * tokens * c * c);
  EXPECT_LT(stats[1].saved_bytes, stats[0].saved_bytes);
  EXPECT_LT(stats[2].saved_bytes, stats[1].saved_bytes);
  EXPECT_LT(workspace[1], workspace[0]);
  EXPECT_LT(workspace[2], workspace[1]);
}

// Llama's RMSNorm backward reads its input, the residual stream: blocks mode keeps it as each
// block's input rather than recomputing one block from the previous block's copies (which would
// recompute every block at the start of the backward and hold them all: no memory saved).
TEST(Recompute, LlamaBlocksRecomputeEachBlockFromItsInput) {
  manual_seed(5);
  models::Llama model(small_llama(4, 32));
  size_t workspace[3];
  for (RecomputeMode m : {RecomputeMode::none, RecomputeMode::automatic, RecomputeMode::blocks}) {
    testing::ScopedPipeline mode(testing::recompute(m));
    run_step(model, 32, 4);
    workspace[static_cast<int>(m)] = Engine::current().last_plan()->program->workspace_bytes();
  }
  std::printf("Llama L4 C32 T32 B4 workspace: none %zu, auto %zu, blocks %zu bytes\n", workspace[0], workspace[1],
              workspace[2]);
  EXPECT_LT(workspace[1], workspace[0]);
  EXPECT_LT(workspace[2], workspace[1] * 3 / 4);  // measured 0.66x; every block recomputed at once: 1.65x
}

// A budget between blocks' workspace and auto's is met by checkpointing some blocks; one below
// blocks' is an error stating what blocks needs; the budget's plan gives none's values.
TEST(Recompute, AMemoryBudgetRecomputesBlocksUntilTheStepFits) {
  models::GPTConfig cfg = testing::tiny_gpt_config(4);
  cfg.block_size = 32;
  manual_seed(5);
  models::GPT model(cfg);
  auto workspace_of = [&](RecomputeMode m, size_t budget) {
    testing::ScopedPipeline mode(testing::recompute(m, budget));
    run_step(model, 32, 4);
    return Engine::current().last_plan()->program->workspace_bytes();
  };
  const size_t automatic = workspace_of(RecomputeMode::automatic, 0);
  const size_t blocks = workspace_of(RecomputeMode::blocks, 0);
  ASSERT_LT(blocks, automatic);
  const size_t budget = blocks + (automatic - blocks) / 3;
  EXPECT_LE(workspace_of(RecomputeMode::automatic, budget), budget);
  EXPECT_GT(measure_step(*Engine::current().last_plan()).recomputed_matmul_flops, 0.0);
  EXPECT_EQ(workspace_of(RecomputeMode::automatic, automatic), automatic);  // fits: nothing more recomputed
  {
    testing::ScopedPipeline mode(testing::recompute(RecomputeMode::automatic, blocks - 1));
    expect_error([&] { run_step(model, 32, 4); },
                 {"--memory-budget", "below what this step needs", "with --recompute blocks"});
  }
}

TEST(Recompute, ModesAndBlocksByName) {
  EXPECT_EQ(parse_recompute_mode("auto"), RecomputeMode::automatic);
  EXPECT_EQ(parse_recompute_mode("none"), RecomputeMode::none);
  EXPECT_EQ(parse_recompute_mode("blocks"), RecomputeMode::blocks);
  expect_error([] { parse_recompute_mode("all"); }, {"expected none, auto or blocks, received 'all'"});
  EXPECT_EQ(block_of_scope("transformer.h.3.mlp.c_fc"), "transformer.h.3");
  EXPECT_EQ(block_of_scope("model.layers.12"), "model.layers.12");
  EXPECT_EQ(block_of_scope("lm_head"), "");
  EXPECT_EQ(block_of_scope("h2.mlp"), "");  // a number inside a name is not a block's index
}

}  // namespace
}  // namespace kiln
