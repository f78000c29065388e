// T6 pieces of the GPT issue on small generated text: tokenizers, the dataset, weights files
// (exact round trip, every bad-file case a clear error and no partly loaded model), bit-exact
// resume from a checkpoint, falling loss, reproducible sampling, and an end-to-end f64
// gradient check of a tiny GPT.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/gradcheck.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/metrics_log.hpp>
#include <kiln/train/sample.hpp>
#include <kiln/train/schedule.hpp>
#include <kiln/train/trainer.hpp>
#include <kiln/train/weights.hpp>

#include "scoped_target.hpp"
#include "training_test_util.hpp"

namespace kiln {
namespace {

std::string tmp_path(const std::string& name) { return testing::temp_file_path("test", name); }
std::string generated_text(size_t words) { return testing::lexicon_text(words); }
std::vector<double> values(const nn::Module& m) { return testing::parameter_values(m); }

models::GPTConfig tiny_config(int64_t vocab) {
  models::GPTConfig c;
  c.vocab_size = vocab;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

TEST(Tokenizer, CharRoundTripAndUnknownCharacters) {
  Tokenizer t = Tokenizer::char_level("héllo wörld ✓");
  EXPECT_EQ(t.decode(t.encode("höw ✓")), "höw ✓");
  EXPECT_TRUE(std::is_sorted(t.vocab().begin(), t.vocab().end()));
  try {
    t.encode("hi Zürich");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'Z' (U+005A)"), std::string::npos) << m;
    EXPECT_NE(m.find("'i'"), std::string::npos) << m;
    EXPECT_NE(m.find("'ü'"), std::string::npos) << m;
  }
  Tokenizer b = Tokenizer::byte_level();
  EXPECT_EQ(b.vocab_size(), 256);
  EXPECT_EQ(b.decode(b.encode("héllo")), "héllo");
  EXPECT_THROW(utf8_decode(std::string("\xff", 1)), Error);
}

TEST(Dataset, SplitsAndReproducibleBatches) {
  std::vector<int32_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  TextDataset d(ids, 5);
  EXPECT_EQ(d.val_tokens(), 100u);
  Batch a = d.train_batch(3, 4, 8), b = d.train_batch(3, 4, 8), c = d.train_batch(4, 4, 8);
  EXPECT_EQ(a.x.to_vector(), b.x.to_vector());
  EXPECT_NE(a.x.to_vector(), c.x.to_vector());
  std::vector<double> x = a.x.to_vector(), y = a.y.to_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(y[i], x[i] + 1);  // targets are the next tokens
    EXPECT_LT(x[i], 900);       // training batches stay in the training split
  }
  for (double v : d.val_batch(0, 4, 8).x.to_vector()) EXPECT_GE(v, 900);
  EXPECT_THROW(TextDataset(std::vector<int32_t>(20, 0), 1).val_batch(0, 1, 8), Error);
}

TEST(Schedule, WarmupThenCosine) {
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(0, 10, 110, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(9, 10, 110, 1.0, 0.1), 1.0);
  EXPECT_NEAR(warmup_cosine_lr(60, 10, 110, 1.0, 0.1), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(110, 10, 110, 1.0, 0.1), 0.1);
}

TEST(Weights, RoundTripExactlyWithTokenizerAndHardLink) {
  Tokenizer tok = Tokenizer::char_level(generated_text(50));
  manual_seed(11);
  models::GPT a(tiny_config(tok.vocab_size()));
  std::string path = tmp_path("rt.h5");
  save_weights(path, a, &tok);
  manual_seed(12);
  models::GPT b(read_weights_config(path));
  EXPECT_NE(values(a), values(b));
  load_weights(path, b);
  EXPECT_EQ(values(a), values(b));  // bit for bit
  std::optional<Tokenizer> t2 = load_tokenizer(path);
  ASSERT_TRUE(t2.has_value());
  EXPECT_EQ(t2->vocab(), tok.vocab());
  h5::File f = h5::File::open_read(path);
  HostTensor head = f.read("lm_head/weight"), wte = f.read("transformer/wte/weight");
  EXPECT_EQ(std::memcmp(head.raw(), wte.raw(), wte.nbytes()), 0);
  std::filesystem::remove(path);
}

TEST(Weights, EveryBadFileIsAClearErrorAndLoadsNothing) {
  manual_seed(3);
  models::GPT model(tiny_config(10));
  const std::vector<double> before = values(model);
  auto expect_error = [&](const std::string& path, const std::string& needle) {
    try {
      load_weights(path, model);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(values(model), before) << "a failed load changed the model (" << needle << ")";
  };
  // A valid file to start from.
  std::string good = tmp_path("good.h5");
  manual_seed(4);
  save_weights(good, models::GPT(tiny_config(10)));
  // Missing parameter: a file written for a model with another name layout (n_layer 2 expects h/1).
  models::GPTConfig two = tiny_config(10);
  two.n_layer = 2;
  models::GPT deeper(two);
  try {
    load_weights(good, deeper);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset 'transformer/h/1/ln_1/weight'"), std::string::npos) << e.what();
  }
  models::GPTConfig wide = tiny_config(12);
  models::GPT other_vocab(wide);
  try {
    load_weights(good, other_vocab);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'transformer/wte/weight' has shape [10, 16]"), std::string::npos) << e.what();
  }
  std::string wrong_dtype = tmp_path("dtype.h5");
  {
    h5::File src = h5::File::open_read(good);
    h5::File dst = h5::File::create(wrong_dtype);
    dst.write_attribute("format", std::string("kiln-weights"));
    dst.write_attribute("format_version", kWeightsFormatVersion);
    for (const auto& [name, p] : model.named_parameters()) {
      HostTensor h = src.read(dataset_path(name));
      HostTensor d = HostTensor::zeros(name == "transformer.ln_f.bias" ? DType::f64 : DType::f32, h.shape());
      for (int64_t i = 0; i < h.numel(); ++i) d.set(i, h.get(i));
      dst.write(dataset_path(name), d);
    }
  }
  expect_error(wrong_dtype, "dataset 'transformer/ln_f/bias' is f64, expected float32");
  std::string other_format = tmp_path("format.h5");
  {
    h5::File f = h5::File::create(other_format);
    f.write_attribute("format", std::string("something-else"));
  }
  expect_error(other_format, "is not a kiln weights file");
  std::string not_hdf5 = tmp_path("text.h5");
  { std::ofstream(not_hdf5) << "hello"; }
  expect_error(not_hdf5, "not HDF5");
  expect_error(tmp_path("missing.h5"), "cannot open");
  for (const auto& p : {good, wrong_dtype, other_format, not_hdf5}) std::filesystem::remove(p);
}

TEST(Weights, AFileWithoutTokenizerLoadsButCannotGiveOne) {
  std::string path = tmp_path("notok.h5");
  manual_seed(5);
  save_weights(path, models::GPT(tiny_config(9)));
  EXPECT_FALSE(load_tokenizer(path).has_value());
  std::filesystem::remove(path);
}

struct TrainRun {
  std::vector<double> losses, weights;
};

// The tiny runs' corpus, tokenizer and data (seed 21).
struct TinyData {
  std::string text = generated_text(400);
  Tokenizer tok = Tokenizer::char_level(text);
  TextDataset data{tok.encode(text), 21};
};

// Their options: batch 4, lr 1e-3 after 2 warmup steps, no validation, no periodic checkpoint.
TrainOptions tiny_options(int64_t steps) {
  TrainOptions o;
  o.batch = 4;
  o.steps = steps;
  o.lr = 1e-3;
  o.warmup = 2;
  o.eval_interval = 0;
  o.eval_batches = 2;
  o.log_interval = 1000;
  o.checkpoint_interval = 0;
  return o;
}

// An 8-step schedule stopped after `stop_at` steps (0: all 8), as if interrupted.
TrainRun train_tiny(int64_t steps, const std::string& checkpoint, const std::string& resume, int64_t stop_at = 0,
                    double lr = 1e-3, bool traced = true) {
  TinyData d;
  // A resumed run starts from a deliberately different seed: the checkpoint restores the RNG.
  manual_seed(resume.empty() ? 21 : 999);
  models::GPT model(resume.empty() ? tiny_config(d.tok.vocab_size()) : read_checkpoint_config(resume));
  TrainOptions o = tiny_options(steps);
  o.lr = lr;
  o.checkpoint = checkpoint;
  o.stop_at = stop_at;
  o.traced = traced;
  Trainer t(model, d.data, d.tok, 21, o);
  if (!resume.empty()) t.resume(resume);
  TrainRun r;
  r.losses = t.run().losses;
  r.weights = values(model);
  return r;
}

TEST(Checkpoint, ResumeIsBitExact) {
  TrainRun full = train_tiny(8, "", "");
  std::string ckpt = tmp_path("ckpt.h5");
  train_tiny(8, ckpt, "", 4);  // interrupted after 4 of 8 steps, checkpoint written there
  // Only this checkpoint's temporaries (atomic_file: path.tmp-PID-N): other tests running beside
  // this one write their own (e.g. metrics_ckpt.h5.tmp-...) into the same folder.
  const std::string own_tmp = std::filesystem::path(ckpt).filename().string() + ".tmp";
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(ckpt).parent_path()))
    EXPECT_NE(e.path().filename().string().rfind(own_tmp, 0), 0u) << "temporary left: " << e.path();
  // Same schedule: the resumed run trains steps 4..8 of an 8-step run.
  TrainRun rest = train_tiny(8, "", ckpt);
  ASSERT_EQ(rest.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rest.losses[i], full.losses[4 + i]) << "step " << 4 + i;
  EXPECT_EQ(rest.weights, full.weights);
  std::filesystem::remove(ckpt);
}

// Outputs stored over dying inputs and AdamW's new state written over the old (Program,
// Target::cpu_overwrite_inputs) train the same bits as every value in a buffer of its own,
// replayed (traced) or not.
TEST(Training, OverwritingDyingValuesAndUpdatingInPlaceTrainsBitForBit) {
  for (bool traced : {true, false}) {
    TrainRun apart;
    {
      testing::ScopedTarget own_buffers([](Target& t) { t.cpu_overwrite_inputs = false; });
      apart = train_tiny(6, "", "", 0, 1e-2, traced);
    }
    const TrainRun over = train_tiny(6, "", "", 0, 1e-2, traced);
    EXPECT_EQ(over.losses, apart.losses) << traced;
    EXPECT_EQ(over.weights, apart.weights) << traced;
  }
}

// The metrics log: a line per step (loss, lr, gradient norm, ms/step, tokens/s) and per
// validation; a run resumed from a checkpoint appends to it, a new run replaces it.
TEST(Training, WritesAMetricsLogThatAResumedRunAppendsTo) {
  const std::string log = tmp_path("metrics.jsonl"), ckpt = tmp_path("metrics_ckpt.h5");
  auto run = [&](int64_t stop_at, const std::string& resume) {
    TinyData d;
    manual_seed(21);
    models::GPT model(resume.empty() ? tiny_config(d.tok.vocab_size()) : read_checkpoint_config(resume));
    TrainOptions o = tiny_options(8);
    o.eval_interval = 2;
    o.checkpoint = ckpt;
    o.stop_at = stop_at;
    o.metrics_log = log;
    Trainer t(model, d.data, d.tok, 21, o);
    if (!resume.empty()) t.resume(resume);
    return t.run();
  };
  std::ofstream(log) << "left from an earlier run\n";
  TrainResult first = run(4, "");
  std::vector<MetricsRecord> r = read_metrics(log);  // replaced: the earlier line is gone
  ASSERT_EQ(r.size(), 1u + 4 + 2);                   // start, 4 steps, validation after 2 and 4
  EXPECT_TRUE(r[0].start);
  EXPECT_EQ(r[0].step, 0);
  EXPECT_EQ(r[1].step, 1);
  EXPECT_EQ(*r[1].loss, first.losses[0]);  // the loss to the bit
  EXPECT_GT(*r[1].grad_norm, 0);
  EXPECT_GT(*r[1].ms_per_step, 0);
  EXPECT_GT(*r[1].tokens_per_s, 0);
  EXPECT_GT(*r[2].lr, *r[1].lr);  // warmup
  EXPECT_TRUE(r[3].val_loss.has_value() && !r[3].loss.has_value());
  EXPECT_EQ(r[3].step, 2);
  run(0, ckpt);  // steps 5..8, appended
  r = read_metrics(log);
  ASSERT_EQ(r.size(), 2u * 7);
  EXPECT_TRUE(r[7].start);
  EXPECT_EQ(r[7].step, 4);
  EXPECT_EQ(r[8].step, 5);
  EXPECT_EQ(r.back().step, 8);
  EXPECT_TRUE(r.back().val_loss.has_value());
  std::filesystem::remove(log);
  std::filesystem::remove(ckpt);
}

// Non-finite values are written as null and read back as NaN; a malformed line is an error
// naming the file and the line.
TEST(MetricsLogFile, NullForNonFiniteAndErrorsNameTheLine) {
  const std::string log = tmp_path("metrics_nan.jsonl");
  {
    MetricsLog m(log, false);
    m.start(0, 3, 8, "cpu f32");
    m.train_step(1, std::nan(""), 1e-3, std::numeric_limits<double>::infinity(), 2.5, 3200);
  }
  std::vector<MetricsRecord> r = read_metrics(log);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(std::isnan(*r[1].loss));
  EXPECT_TRUE(std::isnan(*r[1].grad_norm));
  EXPECT_EQ(*r[1].lr, 1e-3);
  std::ofstream(log, std::ios::app) << "{\"step\": 2, \"loss\": 1.5, \"accuracy\": 0.5}\n";
  try {
    read_metrics(log);
    ADD_FAILURE() << "an unknown field was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + log + "', line 3: unknown field \"accuracy\""), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read_metrics(tmp_path("no_such_metrics.jsonl")), Error);
  std::filesystem::remove(log);
}

// A learning rate that blows the weights up: training stops with an error naming the step and
// the loss, and the checkpoint keeps the last finite state (written every step until then). With
// skip_non_finite the non-finite steps are skipped, and a run that does not recover still stops.
void expect_non_finite_run_stops(bool skip, const std::string& expected) {
  std::string ckpt = tmp_path("nan_ckpt.h5");
  TinyData d;
  manual_seed(21);
  models::GPT model(tiny_config(d.tok.vocab_size()));
  TrainOptions o = tiny_options(8);
  o.lr = o.min_lr = 1e30;
  o.warmup = 0;
  o.grad_clip = 0;
  o.checkpoint = ckpt;
  o.checkpoint_interval = 1;
  o.skip_non_finite = skip;
  o.max_skipped_in_a_row = 3;
  Trainer t(model, d.data, d.tok, 21, o);
  try {
    t.run();
    FAIL() << "training with a learning rate of 1e30 finished";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(expected), std::string::npos) << msg;
    EXPECT_NE(msg.find("the last checkpoint in '" + ckpt + "' is kept"), std::string::npos) << msg;
  }
  // The skipped steps were taken off the optimizer's count; the model in memory is finite.
  EXPECT_EQ(t.optimizer().steps(), 1);
  for (double v : values(model)) ASSERT_TRUE(std::isfinite(v));
  // Whatever the checkpoint holds was saved from a finite step.
  h5::File f = h5::File::open_read(ckpt);
  for (const auto& [name, p] : model.named_parameters()) {
    HostTensor saved = f.read("model/" + dataset_path(name));
    for (int64_t i = 0; i < saved.numel(); ++i) ASSERT_TRUE(std::isfinite(saved.get(i))) << name;
  }
  std::filesystem::remove(ckpt);
}

TEST(Training, ANonFiniteLossStopsTrainingAndNeverReachesACheckpoint) {
  expect_non_finite_run_stops(false, "training stopped at step 2: the loss is ");
}

TEST(Training, SkippedNonFiniteStepsStopARunThatDoesNotRecover) {
  expect_non_finite_run_stops(true, "training stopped at step 4: 3 steps in a row were skipped");
}

// Ctrl-C during training: the step under way finishes, a checkpoint of it is written, and the
// error says where; resuming from it continues the run to the bit.
TEST(Training, SigintStopsAfterTheStepWithACheckpoint) {
  std::string ckpt = tmp_path("sigint_ckpt.h5");
  TrainRun full = train_tiny(8, "", "");
  TinyData d;
  manual_seed(21);
  models::GPT model(tiny_config(d.tok.vocab_size()));
  TrainOptions o = tiny_options(8);
  o.interrupt_checkpoint = ckpt;
  o.after_step = [](int64_t step) {
    if (step == 3) raise(SIGINT);
  };
  Trainer t(model, d.data, d.tok, 21, o);
  try {
    t.run();
    FAIL() << "the run went on after SIGINT";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("SIGINT (Ctrl-C) received: training stopped after step 3 of 8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checkpoint written to '" + ckpt + "'"), std::string::npos) << msg;
  }
  TrainRun rest = train_tiny(8, "", ckpt);
  ASSERT_EQ(rest.losses.size(), 5u);
  EXPECT_EQ(rest.losses.back(), full.losses.back());
  EXPECT_EQ(rest.weights, full.weights);
  std::filesystem::remove(ckpt);
}

// The trainer replays a traced step by default (tests/test_traced_step.cpp has the engine-level
// checks); recording every step anew gives the same run.
TEST(Training, TracedAndReRecordedStepsGiveTheSameRun) {
  TrainRun traced = train_tiny(8, "", "", 0, 1e-3, true), recorded = train_tiny(8, "", "", 0, 1e-3, false);
  EXPECT_EQ(traced.losses, recorded.losses);
  EXPECT_EQ(traced.weights, recorded.weights);
}

TEST(Training, LossFallsOnGeneratedText) {
  TrainRun r = train_tiny(150, "", "", 0, 1e-2);
  double head = (r.losses[0] + r.losses[1] + r.losses[2]) / 3,
         tail = (r.losses[147] + r.losses[148] + r.losses[149]) / 3;
  EXPECT_LT(tail, 0.6 * head) << head << " -> " << tail;
}

// Fused ops in the training step's plan (the largest) for the engine's Target and passes.
size_t fused_ops_in_step() {
  const Engine& engine = Engine::current();
  const Plan* step = nullptr;
  for (const Plan* p : Engine::current().plan_cache().plans())
    if (p->target == engine.target() && p->pipeline == engine.pipeline() &&
        (!step || p->optimized_ops > step->optimized_ops))
      step = p;
  size_t n = 0;
  for (const Op& op : step->program->circuit().ops()) n += op.is(PrimId::fused_rows) || op.absorbed > 0;
  return n;
}

// Fusion may change the order of sums and nothing else: 100 steps with the CPU's passes, with
// the GPU's (row and element groups too, run here by the Eigen executor) and with fusion off
// give the same losses within 1e-5 relative. Measured: 3.6e-7 at worst over the 100 steps
// (fused reductions add f32 values in another order; every other op rounds each element as
// the unfused one does). The bound leaves 30x for other machines' vector widths; a wrong
// fusion moves a loss by far more.
// With bf16 operands the attention fusion is left out of all three runs: its fused ops round q, k,
// v and do but keep the probabilities and ds in f32, a change of arithmetic by design, not of
// order (FuseAttention.Bf16OperandsAreFusedAndKeepTheUnfusedAccuracy measures it against f64, and
// Bf16PrecisionTracksTheF32LossCurveOver300Steps trains with it).
void fused_and_unfused_runs_give_the_same_losses(Precision precision, double bound, size_t early_steps,
                                                 double early_bound) {
  ScopedPrecision policy(precision);
  std::optional<testing::ScopedPipeline> no_attention_fusion;
  if (precision == Precision::bf16) no_attention_fusion.emplace("-fuse_attention");
  TrainRun cpu = train_tiny(100, "", "", 0, 1e-2);
  EXPECT_GT(fused_ops_in_step(), 10u);
  TrainRun gpu;
  {
    // The GPU's passes; the plans run on the CPU executor.
    testing::ScopedTarget gpu_plans([](Target& t) { t = with_device_of(t, cuda_target(90, /*fake=*/true)); });
    gpu = train_tiny(100, "", "", 0, 1e-2);
    EXPECT_GT(fused_ops_in_step(), 10u);
  }
  TrainRun plain;
  {
    testing::ScopedPipeline off(
        "-fuse_attention,-fuse_pointwise,-fuse_columns,-fuse_matmul,-fuse_rows,-forward_assigns,-merge_multi_tensor");
    plain = train_tiny(100, "", "", 0, 1e-2);
    EXPECT_EQ(fused_ops_in_step(), 0u);
  }
  double worst = 0;
  for (size_t i = 0; i < plain.losses.size(); ++i)
    for (const TrainRun* r : {&cpu, &gpu})
      worst = std::max(worst, std::fabs(r->losses[i] - plain.losses[i]) / plain.losses[i]);
  double early = 0;  // the first steps, before any trajectory has parted
  for (size_t i = 0; i < early_steps; ++i)
    for (const TrainRun* r : {&cpu, &gpu})
      early = std::max(early, std::fabs(r->losses[i] - plain.losses[i]) / plain.losses[i]);
  std::printf(
      "100 steps, CPU and GPU pass pipelines vs no fusion (%s): worst relative loss difference %.3g, "
      "first %zu steps %.3g\n",
      precision_name(precision), worst, early_steps, early);
  EXPECT_LT(early, early_bound);
  EXPECT_LT(worst, bound);
  EXPECT_LT(plain.losses.back(), 0.6 * plain.losses.front());  // and the runs did train
}

TEST(Training, FusedAndUnfusedRunsGiveTheSameLossesFor100Steps) {
  fused_and_unfused_runs_give_the_same_losses(Precision::f32, 1e-5, 10, 1e-5);
}

// The same under --precision bf16, where the matmul fusion also reads the activations' casts
// to bf16 as a rounding prologue (no cast kernel): the same bf16 values are multiplied.
// Measured: the CPU pipeline's losses equal the unfused run's to the bit for all 100 steps; the
// GPU pipeline's for the first 6, then its fused rows' and column sums' other order moves an f32
// value by an ulp across a bf16 rounding boundary now and then (2^-8 instead of 2^-24), and the
// trajectories part: 8.6e-4 at worst. The bound for the whole run is 5e-3; the first 5 steps
// must agree to 1e-6 (matmuls that skipped the rounding were 2e-5 off within them).
TEST(Training, FusedAndUnfusedBf16RunsGiveTheSameLossesFor100Steps) {
  fused_and_unfused_runs_give_the_same_losses(Precision::bf16, 5e-3, 5, 1e-6);
}

// Mixed precision (--precision bf16: matmul operands in bf16, f32 accumulation, everything else
// f32) tracks the f32 run: 300 steps of the tiny GPT from the same initialization and batches.
// Band: the first 10 steps within 1e-3 of f32's losses (a wrong gradient shows there at once),
// the moving average of 20 steps within 10% at every step and the last 20 steps' mean within
// 5%. Measured: first 10 steps 1.1e-4 (the forward pass alone, step 0: 1.4e-5; the difference
// grows as the trajectories part, 2e-3 by step 25), moving average 7.0% at worst (0.056 nats, near step 250,
// where the loss is 0.4 and the run is chaotic), last 20 steps 2.6%. For scale, an f32 run with
// a 1% larger learning rate differs from it by 4.6% at worst: bf16's rounding (about 2e-3 per
// product) perturbs the trajectory like a 1-2% change of learning rate, no more.
TEST(Training, Bf16PrecisionTracksTheF32LossCurveOver300Steps) {
  TrainRun f32 = train_tiny(300, "", "", 0, 1e-2);
  TrainRun bf16;
  {
    ScopedPrecision policy(Precision::bf16);
    bf16 = train_tiny(300, "", "", 0, 1e-2);
  }
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  EXPECT_NE(bf16.losses, f32.losses);  // the policy did change the arithmetic
  double early = 0;
  for (size_t i = 0; i < 10; ++i) early = std::max(early, std::fabs(bf16.losses[i] - f32.losses[i]) / f32.losses[i]);
  const size_t window = 20;
  double worst = 0, tail = 0;
  for (size_t i = window; i <= f32.losses.size(); ++i) {
    double a = 0, b = 0;
    for (size_t j = i - window; j < i; ++j) a += f32.losses[j], b += bf16.losses[j];
    worst = std::max(worst, std::fabs(b - a) / a);
    tail = std::fabs(b - a) / a;  // ends as the last window's
  }
  std::printf("300 steps bf16 vs f32: first 10 steps %.3g, worst 20-step moving average %.3g, last 20 steps %.3g\n",
              early, worst, tail);
  EXPECT_LT(early, 1e-3);
  EXPECT_LT(worst, 0.10);
  EXPECT_LT(tail, 0.05);
  EXPECT_LT(bf16.losses.back(), 0.6 * bf16.losses.front());  // and it trained
}

// On the CPU the bf16 policy's operands are held in f32 rounded to bf16 (bf16_as_rounded_f32, no
// widening copy per product): 20 steps give bit for bit the losses and weights of plans that
// store them in bf16 and widen them for each product.
TEST(Training, Bf16HeldAsRoundedF32GivesTheBitsOfBf16Storage) {
  testing::expect_rounded_f32_trains_as_bf16_storage([] { return train_tiny(20, "", "", 0, 1e-2); });
}

TEST(Sampling, ReproducibleAndOfTheRequestedLength) {
  std::string text = generated_text(100);
  Tokenizer tok = Tokenizer::char_level(text);
  manual_seed(2);
  models::GPT model(tiny_config(tok.vocab_size()));
  model.eval();
  SampleOptions o;
  o.tokens = 20;
  std::string a = sample_text(model, tok, "the ", o), b = sample_text(model, tok, "the ", o);
  EXPECT_EQ(a, b);
  EXPECT_EQ(utf8_decode(a).size(), 20u);
  o.seed = 3;
  EXPECT_NE(sample_text(model, tok, "the ", o), a);
  EXPECT_THROW(sample_text(model, tok, "QQ", o), Error);  // outside the vocabulary
}

TEST(GptGradients, TinyGptEndToEndInF64) {
  models::GPTConfig c;
  c.vocab_size = 7;
  c.block_size = 4;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  manual_seed(8);
  models::GPT model(c);
  model.to(DType::f64);
  HostTensor x = Tensor::from_ints({1, 5, 2, 0, 6, 6, 3, 1}, {2, 4}).to_host();
  HostTensor y = Tensor::from_ints({5, 2, 0, 4, 6, 3, 1, 2}, {2, 4}).to_host();
  auto f = [&](const std::vector<Tensor>& in) { return model.loss(in[0], in[1]); };
  ad::GradCheckResult r = gradcheck(f, {x, y}, {}, /*check_parameters=*/true);
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_EQ(r.rel_error.size(), model.named_parameters().size());
}

}  // namespace
}  // namespace kiln
