// chunk_loss_head (circuit/passes/chunk_loss_head.hpp) on recorded GPT and Llama steps: with a
// chunk size below the logits', the head's product runs once per chunk of sequences, the loss and
// gradients equal the unchunked step's (the weight gradient's sum over the tokens added chunk by
// chunk: f32 rounding), in each recompute mode, and the whole batch's logits are never held.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/plan_cache.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/models/llama.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

constexpr int64_t kBatch = 4, kTokens = 8;

struct StepResult {
  double loss = 0;
  std::vector<HostTensor> grads;
  size_t head_products = 0;  // matmuls of the head: one per chunk
  size_t workspace = 0;
};

// Matmuls of the last plan that make logits (13 classes): the head, one per chunk.
size_t head_products_of_last_plan() {
  const Plan& plan = *Engine::current().last_plan();
  size_t n = 0;
  for (const Op& op : plan.program->circuit().ops())
    if (op.is(PrimId::matmul) && plan.program->circuit().info(op.outputs[0]).shape.dims().back() == 13) ++n;
  return n;
}

StepResult run_step(models::CausalLM& model) {
  model.zero_grad();
  manual_seed(11);
  HostTensor tokens = HostTensor::zeros(DType::i32, Shape{kBatch, kTokens});
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.set(i, static_cast<double>((i * 7 + 3) % 13));
  Tensor x = Tensor::from_host(tokens);
  Tensor loss = model.loss(x, x);
  loss.backward();
  Engine::current().realize();
  StepResult r{
      loss.item(), {}, head_products_of_last_plan(), Engine::current().last_plan()->program->workspace_bytes()};
  for (Tensor& p : model.parameters()) r.grads.push_back(p.grad().to_host());
  return r;
}

// One sequence's logits: 8 tokens x 13 classes of f32.
constexpr size_t kSequenceBytes = kTokens * 13 * sizeof(float);

void expect_chunked_equals_whole(models::CausalLM& model, const std::string& what) {
  for (RecomputeMode m : {RecomputeMode::none, RecomputeMode::automatic, RecomputeMode::blocks}) {
    StepResult whole;
    {
      testing::ScopedPipeline off([&](PipelineOptions& p) {
        p.recompute = m;
        p.disabled = {"chunk_loss_head"};
      });
      whole = run_step(model);
    }
    for (size_t sequences : {size_t{1}, size_t{3}}) {  // 4 chunks; 2 chunks, the last one short
      testing::ScopedPipeline chunked([&](PipelineOptions& p) {
        p.recompute = m;
        p.loss_chunk_bytes = sequences * kSequenceBytes;
      });
      const StepResult got = run_step(model);
      const std::string where = what + " " + recompute_mode_name(m) + ", " + std::to_string(sequences) + " a chunk";
      EXPECT_EQ(whole.head_products, 1u) << where;
      EXPECT_EQ(got.head_products, (kBatch + sequences - 1) / sequences) << where;
      EXPECT_NEAR(got.loss, whole.loss, 1e-6 * std::abs(whole.loss)) << where;
      ASSERT_EQ(got.grads.size(), whole.grads.size());
      for (size_t i = 0; i < got.grads.size(); ++i)
        EXPECT_LT(testing::relative_error(got.grads[i], whole.grads[i]), 1e-5) << where << ": gradient " << i;
    }
  }
}

TEST(ChunkLossHead, GptStepsWithDropoutEqualTheWholeBatchsStep) {
  manual_seed(5);
  models::GPT model(testing::tiny_gpt_config(2));  // vocabulary 13, dropout 0.1
  expect_chunked_equals_whole(model, "gpt");
}

TEST(ChunkLossHead, LlamaStepsEqualTheWholeBatchsStep) {
  models::LlamaConfig cfg;
  cfg.vocab_size = 13;
  cfg.block_size = kTokens;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.n_embd = 32;
  manual_seed(5);
  models::Llama model(cfg);
  expect_chunked_equals_whole(model, "llama");
}

// Two micro-batches recorded before one realize (gradient accumulation): each head is chunked,
// and the gradients equal the unchunked step's.
TEST(ChunkLossHead, EachMicroBatchsHeadIsChunked) {
  manual_seed(5);
  models::GPT model(testing::tiny_gpt_config(2));
  auto step = [&](bool chunk) {
    testing::ScopedPipeline p([&](PipelineOptions& o) {
      if (chunk)
        o.loss_chunk_bytes = kSequenceBytes;
      else
        o.disabled = {"chunk_loss_head"};
    });
    model.zero_grad();
    manual_seed(11);
    HostTensor tokens = HostTensor::zeros(DType::i32, Shape{2 * kBatch, kTokens});
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.set(i, static_cast<double>((i * 5 + 1) % 13));
    for (const Tensor& x : split(Tensor::from_host(tokens), 0, {kBatch, kBatch})) (model.loss(x, x) * 0.5).backward();
    Engine::current().realize();
    std::vector<HostTensor> grads;
    for (Tensor& p : model.parameters()) grads.push_back(p.grad().to_host());
    return std::make_pair(grads, head_products_of_last_plan());
  };
  const auto [whole, whole_products] = step(false);
  const auto [got, products] = step(true);
  EXPECT_EQ(whole_products, 2u);
  EXPECT_EQ(products, 2u * kBatch);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LT(testing::relative_error(got[i], whole[i]), 1e-5) << "gradient " << i;
}

// Logits the caller keeps would be rebuilt whole from the chunks beside them: that head is left
// unchunked.
TEST(ChunkLossHead, RequestedLogitsLeaveTheHeadWhole) {
  manual_seed(5);
  models::GPT model(testing::tiny_gpt_config(2));
  testing::ScopedPipeline p([&](PipelineOptions& o) { o.loss_chunk_bytes = kSequenceBytes; });
  HostTensor tokens = HostTensor::zeros(DType::i32, Shape{kBatch, kTokens});
  Tensor x = Tensor::from_host(tokens);
  Tensor logits = model.forward(x);  // kept by the caller, and the loss's
  Tensor loss = cross_entropy(logits, x);
  loss.backward();
  Engine::current().realize();
  // The kept logits come from one whole-batch product, not from a concat of chunks.
  const Circuit& plan = Engine::current().last_plan()->program->circuit();
  size_t whole = 0, concats = 0;
  for (const Op& op : plan.ops()) {
    whole += op.is(PrimId::matmul) && plan.info(op.outputs[0]).shape == Shape{kBatch, kTokens, 13};
    concats += op.is(PrimId::concat) && plan.info(op.outputs[0]).shape == Shape{kBatch, kTokens, 13};
  }
  EXPECT_EQ(whole, 1u);
  EXPECT_EQ(concats, 0u);
  EXPECT_EQ(head_products_of_last_plan(), 1u);
  EXPECT_EQ(logits.shape(), (Shape{kBatch, kTokens, 13}));
}

// GPT-2 small's plan (made, not run): the whole batch's logits, 1570 MiB, are not held at once.
TEST(ChunkLossHead, Gpt2SmallsStepHoldsOneSequencesLogits) {
  models::GPTConfig cfg;
  cfg.vocab_size = 50257;
  cfg.block_size = 1024;
  cfg.n_layer = 1;
  cfg.n_head = 12;
  cfg.n_embd = 768;
  cfg.dropout = 0;
  manual_seed(5);
  models::GPT model(cfg);
  auto workspace = [&](bool chunk) {
    testing::ScopedPipeline p([&](PipelineOptions& o) {
      if (!chunk) o.disabled = {"chunk_loss_head"};
    });
    Engine::current().set_plan_only(true);
    HostTensor tokens = HostTensor::zeros(DType::i32, Shape{8, 1024});
    Tensor x = Tensor::from_host(tokens);
    Tensor loss = model.loss(x, x);
    loss.backward();
    Engine::current().realize();
    Engine::current().set_plan_only(false);
    return Engine::current().last_plan()->program->workspace_bytes();
  };
  const double mib = 1024.0 * 1024.0;
  const double whole = static_cast<double>(workspace(false)) / mib,
               chunked = static_cast<double>(workspace(true)) / mib;
  EXPECT_GT(whole - chunked, 1000.0) << whole << " MiB against " << chunked << " MiB";
}

}  // namespace
}  // namespace kiln
