// The Llama model and model-generic training: Hugging Face parameter names, an f64 gradient
// check of every parameter, weights files (architecture and config attributes, tied names as
// hard links, any Module by its names), checkpoints and resume, training and sampling through
// the same Trainer and sample_text as the GPT, and the errors a mismatched file gives.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <set>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/gradcheck.hpp>
#include <kiln/layers/rms_norm.hpp>
#include <kiln/models/llama.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/sample.hpp>
#include <kiln/train/trainer.hpp>
#include <kiln/train/weights.hpp>

#include "device_test_util.hpp"
#include "scoped_target.hpp"
#include "training_test_util.hpp"

namespace kiln {
namespace {

std::string tmp_path(const std::string& name) { return testing::temp_file_path("llama", name); }
std::string generated_text(size_t words) { return testing::lexicon_text(words); }
std::vector<double> values(const nn::Module& m) { return testing::parameter_values(m); }

models::LlamaConfig tiny_llama(int64_t vocab, bool tied = false) {
  models::LlamaConfig c;
  c.vocab_size = vocab;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.ffn_hidden = 24;
  c.rope_theta = 500;
  c.tie_embeddings = tied;
  return c;
}

TEST(Llama, ParametersHaveHuggingFaceNames) {
  manual_seed(1);
  models::Llama m(tiny_llama(11));
  std::vector<std::string> names;
  for (const auto& [n, p] : m.named_parameters()) names.push_back(n);
  std::vector<std::string> expected = {"model.embed_tokens.weight"};
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
      expected.push_back("model.layers." + std::to_string(l) + "." + p);
  expected.push_back("model.norm.weight");
  expected.push_back("lm_head.weight");
  EXPECT_EQ(names, expected);
  EXPECT_EQ(m.parameter("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{8, 16}));  // 2 kv heads of 4
  EXPECT_EQ(m.parameter("model.layers.0.mlp.up_proj.weight").shape(), (Shape{24, 16}));
  EXPECT_EQ(static_cast<double>(m.num_parameters()), tiny_llama(11).parameter_count());
  models::Llama tied(tiny_llama(11, true));
  EXPECT_EQ(tied.named_parameters().back().first, "model.norm.weight");  // lm_head listed once, as the embedding
  EXPECT_EQ(static_cast<double>(tied.num_parameters()), tiny_llama(11, true).parameter_count());
}

TEST(Llama, EveryParameterPassesTheF64GradientCheck) {
  manual_seed(3);
  models::LlamaConfig c = tiny_llama(7);
  c.block_size = 4, c.n_embd = 8, c.ffn_hidden = 12, c.n_head = 2, c.n_kv_head = 1;
  models::Llama model(c);
  model.to(DType::f64);
  // At N(0, 0.02) initialization the attention is nearly uniform and the q/k gradients are
  // small (~1e-4): the default check (relative step 1e-4, Richardson) resolves them; a single
  // central difference at step 1e-6 did not (measured 2.7-6.4e-6 against 1e-6: rounding).
  // Norms move away from 1 so that their gradients count.
  for (auto& [n, p] : model.named_parameters())
    if (n.find("norm") != std::string::npos) p.assign(p + Tensor::randn(p.shape(), DType::f64) * 0.3);
  Engine::current().realize();
  HostTensor x = Tensor::from_ints({1, 5, 2, 0, 6, 6, 3, 1}, {2, 4}).to_host();
  HostTensor y = Tensor::from_ints({5, 2, 0, 4, 6, 3, 1, 2}, {2, 4}).to_host();
  auto f = [&](const std::vector<Tensor>& in) { return model.loss(in[0], in[1]); };
  ad::GradCheckResult r = gradcheck(f, {x, y}, model.named_parameters());
  EXPECT_TRUE(r.ok) << r.report;
  std::set<std::string> checked, expected;  // in the order the forward reads them
  for (const auto& e : r.entries) checked.insert(e.name);
  for (const auto& [n, p] : model.named_parameters()) expected.insert(n);
  EXPECT_EQ(checked, expected);
}

TEST(Llama, WeightsRoundTripWithArchitectureConfigAndTiedLink) {
  Tokenizer tok = Tokenizer::char_level(generated_text(50));
  for (bool tied : {false, true}) {
    manual_seed(11);
    models::Llama a(tiny_llama(tok.vocab_size(), tied));
    const std::string path = tmp_path("rt.h5");
    save_weights(path, a, &tok);
    const ModelSpec spec = read_model_spec(path);
    EXPECT_EQ(spec.architecture, "llama");
    EXPECT_EQ(spec.attributes.get_int("n_kv_head"), 2);
    EXPECT_EQ(spec.attributes.get("rope_theta"), 500.0);
    EXPECT_EQ(spec.attributes.get_int("tie_embeddings"), tied ? 1 : 0);
    manual_seed(12);
    std::unique_ptr<models::CausalLM> b = load_model(path);
    EXPECT_EQ(b->architecture(), "llama");
    EXPECT_EQ(values(a), values(*b));  // bit for bit
    Tensor idx = Tensor::from_ints({1, 2, 3, 4}, {1, 4});
    EXPECT_EQ(a.forward(idx).to_vector(), b->forward(idx).to_vector());
    h5::File f = h5::File::open_read(path);
    EXPECT_TRUE(f.exists("lm_head/weight"));  // a dataset, or a hard link to the embedding when tied
    EXPECT_EQ(f.read("lm_head/weight").shape(), (Shape{tok.vocab_size(), 16}));
    EXPECT_TRUE(load_tokenizer(path).has_value());
    EXPECT_THROW(read_weights_config(path), Error);  // not a GPT
    std::filesystem::remove(path);
  }
}

TEST(Llama, AModuleThatIsNoModelIsSavedAndLoadedByItsNames) {
  struct Net : nn::Module {
    std::shared_ptr<nn::ModuleList<nn::RMSNorm>> norms;
    Net() {
      norms = register_module("norms", std::make_shared<nn::ModuleList<nn::RMSNorm>>());
      for (int i = 0; i < 2; ++i) norms->push_back(std::make_shared<nn::RMSNorm>(3));
    }
  } a, b;
  (*a.norms)[1]->weight.assign(Tensor::from_vector({1, 2, 3}, {3}));
  const std::string path = tmp_path("module.h5");
  save_module_weights(path, a);
  load_weights(path, b);
  EXPECT_EQ(values(a), values(b));
  try {
    load_model(path);
    ADD_FAILURE() << "a module's weights loaded as a model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights of a module, not of a model"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(Llama, BadConfigAttributesAreClearErrors) {
  manual_seed(1);
  models::Llama m(tiny_llama(11));
  const std::string path = tmp_path("bad.h5");
  // Rewrites one root attribute of a freshly saved file, then expects load_model to refuse it.
  auto expect_refused = [&](const char* name, auto value, const std::string& text) {
    save_weights(path, m);
    hid_t raw = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Adelete(raw, name);
    H5Fclose(raw);
    h5::File::open_write(path).write_attribute(name, value);
    try {
      load_model(path);
      ADD_FAILURE() << "accepted; expected: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_refused("architecture", std::string("mamba"), "unknown model architecture 'mamba' (known: gpt, llama)");
  expect_refused("n_kv_head", int64_t{0}, "'n_kv_head' is 0");
  expect_refused("n_kv_head", int64_t{3}, "not divisible by the key/value heads");
  expect_refused("rope_theta", 0.5, "'rope_theta' is 0.5");
  expect_refused("tie_embeddings", int64_t{2}, "'tie_embeddings' is 2");
  std::filesystem::remove(path);
}

struct TinyRun {
  std::vector<double> losses, weights;
};

TinyRun train_llama(int64_t steps, const std::string& checkpoint, const std::string& resume, int64_t stop_at,
                    double lr) {
  const std::string text = generated_text(400);
  Tokenizer tok = Tokenizer::char_level(text);
  TextDataset data(tok.encode(text), 21);
  manual_seed(resume.empty() ? 21 : 999);
  std::unique_ptr<models::CausalLM> model =
      resume.empty() ? std::make_unique<models::Llama>(tiny_llama(tok.vocab_size())) : read_checkpoint_model(resume);
  TrainOptions o;
  o.batch = 4, o.steps = steps, o.lr = lr, o.warmup = 2, o.eval_interval = 0, o.eval_batches = 2;
  o.log_interval = 1000, o.checkpoint_interval = 0, o.checkpoint = checkpoint, o.stop_at = stop_at;
  Trainer t(*model, data, tok, 21, o);
  if (!resume.empty()) t.resume(resume);
  TinyRun r;
  r.losses = t.run().losses;
  r.weights = values(*model);
  return r;
}

// The Llama's bf16 operands (SwiGLU, rotary, RMSNorm around them) held in f32 rounded to bf16
// on the CPU (bf16_as_rounded_f32) give bit for bit the losses and weights of bf16 storage.
TEST(Llama, Bf16HeldAsRoundedF32GivesTheBitsOfBf16Storage) {
  testing::expect_rounded_f32_trains_as_bf16_storage([] { return train_llama(10, "", "", 0, 1e-2); });
}

// Mixed precision trains the Llama too (the policy casts every matmul's operands, RMSNorm,
// rotary and the gated MLP's products stay f32): 100 steps in bf16 track the f32 run (measured:
// first 5 steps 1.5e-4, last 20 steps' mean 4e-4; bounds 1e-3 and the GPT's 5%), and two bf16
// steps on the fake GPU (the simulator) give the CPU's losses to 1e-5.
TEST(Llama, Bf16PrecisionTracksF32AndRunsOnTheFakeGpu) {
  TinyRun f32 = train_llama(100, "", "", 0, 1e-2);
  TinyRun bf16;
  {
    ScopedPrecision policy(Precision::bf16);
    bf16 = train_llama(100, "", "", 0, 1e-2);
  }
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  EXPECT_NE(bf16.losses, f32.losses);
  double early = 0, tail_a = 0, tail_b = 0;
  for (size_t i = 0; i < 5; ++i) early = std::max(early, std::fabs(bf16.losses[i] - f32.losses[i]) / f32.losses[i]);
  for (size_t i = 80; i < 100; ++i) tail_a += f32.losses[i], tail_b += bf16.losses[i];
  std::printf("Llama 100 steps bf16 vs f32: first 5 steps %.3g, last 20 steps %.3g\n", early,
              std::fabs(tail_b - tail_a) / tail_a);
  EXPECT_LT(early, 1e-3);
  EXPECT_LT(std::fabs(tail_b - tail_a) / tail_a, 0.05);
  EXPECT_LT(bf16.losses.back(), 0.6 * bf16.losses.front());

  ScopedPrecision policy(Precision::bf16);
  TinyRun cpu = train_llama(2, "", "", 0, 1e-2), dev;
  {
    testing::OnDevice on(testing::fake_runtime());
    dev = train_llama(2, "", "", 0, 1e-2);
  }
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(dev.losses[i], cpu.losses[i], 1e-5 * cpu.losses[i]) << "step " << i;
}

TEST(Llama, TrainsAndResumesBitExactlyThroughTheTrainer) {
  TinyRun full = train_llama(60, "", "", 0, 1e-2);
  const double head = (full.losses[0] + full.losses[1]) / 2, tail = (full.losses[58] + full.losses[59]) / 2;
  EXPECT_LT(tail, 0.6 * head) << head << " -> " << tail;
  const std::string ckpt = tmp_path("ckpt.h5");
  train_llama(60, ckpt, "", 30, 1e-2);
  TinyRun rest = train_llama(60, "", ckpt, 0, 1e-2);
  ASSERT_EQ(rest.losses.size(), 30u);
  for (size_t i = 0; i < 30; ++i) EXPECT_EQ(rest.losses[i], full.losses[30 + i]) << "step " << 30 + i;
  EXPECT_EQ(rest.weights, full.weights);
  // A Llama checkpoint does not load into a GPT.
  models::GPTConfig g;
  g.vocab_size = 11;
  models::GPT gpt(g);
  optim::AdamW opt(gpt.parameters(), {});
  try {
    load_checkpoint(ckpt, gpt, opt);
    ADD_FAILURE() << "a llama checkpoint loaded into a gpt";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds a llama model; this model is a gpt"), std::string::npos) << e.what();
  }
  std::filesystem::remove(ckpt);
}

TEST(Llama, SamplesReproducibly) {
  Tokenizer tok = Tokenizer::char_level(generated_text(100));
  manual_seed(2);
  models::Llama model(tiny_llama(tok.vocab_size()));
  model.eval();
  SampleOptions o;
  o.tokens = 12;
  const std::string a = sample_text(model, tok, "the ", o);
  EXPECT_EQ(a, sample_text(model, tok, "the ", o));
  EXPECT_EQ(utf8_decode(a).size(), 12u);
}

// Decoding token by token with the cache gives the logits of the full forward at every position,
// for both architectures, and every step after the first runs the same compiled plan.
void expect_decode_steps_match_forward(const models::CausalLM& model) {
  const int64_t t = model.block_size(), v = model.vocab_size();
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < t; ++i) ids.push_back(static_cast<int32_t>((i * 5 + 3) % v));
  const std::vector<double> full = model.forward(Tensor::from_ints(ids, {1, t})).to_vector();  // (1, T, V)
  std::unique_ptr<nn::KVCache> cache = model.new_kv_cache(1);
  ASSERT_TRUE(cache);
  size_t plans_after_first = 0;
  for (int64_t p = 0; p < t; ++p) {
    const std::vector<double> step = model.decode_step(Tensor::from_ints({ids[p]}, {1, 1}), p, *cache).to_vector();
    ASSERT_EQ(step.size(), static_cast<size_t>(v));
    for (int64_t j = 0; j < v; ++j) EXPECT_NEAR(step[j], full[p * v + j], 1e-5) << "position " << p << ", logit " << j;
    if (p == 0) plans_after_first = Engine::current().plan_cache().size();
  }
  EXPECT_EQ(Engine::current().plan_cache().size(), plans_after_first) << "a decode step built a plan of its own";
  EXPECT_THROW(model.decode_step(Tensor::from_ints({1}, {1, 1}), t, *cache), Error);  // past the cache
}

TEST(KVCache, DecodeStepsGiveTheForwardLogits) {
  manual_seed(4);
  models::Llama llama(tiny_llama(13));
  expect_decode_steps_match_forward(llama);
  models::GPTConfig g;
  g.vocab_size = 13, g.block_size = 8, g.n_layer = 2, g.n_head = 2, g.n_embd = 16;
  models::GPT gpt(g);
  expect_decode_steps_match_forward(gpt);
}

// Cached and windowed sampling give the same text while it fits the block; past the block the
// cache restarts from the last half block and sampling goes on to the requested length.
TEST(KVCache, CachedSamplingMatchesWindowedSampling) {
  Tokenizer tok = Tokenizer::char_level(generated_text(100));
  manual_seed(6);
  models::Llama model(tiny_llama(tok.vocab_size()));  // block 8
  model.eval();
  SampleOptions o;
  o.tokens = 6;  // "th" + 6 = 8 tokens: within the block
  o.temperature = 0.7;
  const std::string cached = sample_text(model, tok, "th", o);
  o.kv_cache = false;
  EXPECT_EQ(cached, sample_text(model, tok, "th", o));
  o.kv_cache = true;
  o.tokens = 30;
  EXPECT_EQ(utf8_decode(sample_text(model, tok, "the cat", o)).size(), 30u);
}

// The replayed decode step (traced once per sample_text call) gives the windowed path's tokens
// at temperature 0 (greedy), for both architectures; every decode step after the first is a
// replay (no recording, no plan lookup).
TEST(KVCache, ReplayedGreedyDecodingMatchesTheWindowedPath) {
  Tokenizer tok = Tokenizer::char_level(generated_text(100));
  manual_seed(8);
  models::Llama llama(tiny_llama(tok.vocab_size()));  // block 8
  models::GPTConfig g;
  g.vocab_size = tok.vocab_size(), g.block_size = 8, g.n_layer = 2, g.n_head = 2, g.n_embd = 16;
  models::GPT gpt(g);
  for (models::CausalLM* model : std::vector<models::CausalLM*>{&llama, &gpt}) {
    model->eval();
    SampleOptions o;
    o.tokens = 6;  // "th" + 6 = 8 tokens: within the block
    o.temperature = 0;
    const uint64_t replays = Engine::current().stats().replays;
    const std::string cached = sample_text(*model, tok, "th", o);
    // 7 decode steps (2 prompt tokens and 5 drawn ones fed back): one traced, 6 replayed.
    EXPECT_EQ(Engine::current().stats().replays - replays, 6u) << model->architecture();
    o.kv_cache = false;
    EXPECT_EQ(cached, sample_text(*model, tok, "th", o)) << model->architecture();
  }
}

// top_k = 1, or a nucleus too small for more than one token, is greedy decoding at any
// temperature; top_k at least the vocabulary and top_p = 1 change nothing.
TEST(Sampling, TopKAndTopPKeepTheMostLikelyTokens) {
  Tokenizer tok = Tokenizer::char_level(generated_text(100));
  manual_seed(9);
  models::Llama model(tiny_llama(tok.vocab_size()));
  model.eval();
  SampleOptions greedy;
  greedy.tokens = 20, greedy.temperature = 0;
  const std::string expected = sample_text(model, tok, "the", greedy);
  SampleOptions o;
  o.tokens = 20, o.temperature = 1.5, o.top_k = 1;
  EXPECT_EQ(sample_text(model, tok, "the", o), expected);
  o.top_k = 0, o.top_p = 1e-9;
  EXPECT_EQ(sample_text(model, tok, "the", o), expected);
  o.top_p = 1.0;
  const std::string plain = sample_text(model, tok, "the", o);
  o.top_k = tok.vocab_size();
  EXPECT_EQ(sample_text(model, tok, "the", o), plain);
  EXPECT_NE(plain, expected) << "at temperature 1.5 sampling should leave the greedy path";
  o.top_p = 1.5;
  EXPECT_THROW(sample_text(model, tok, "the", o), Error);
}

}  // namespace
}  // namespace kiln
