// The autotuner (core/tuning.hpp): the injected clock decides the choice, a wrong candidate is
// dropped and never chosen, every candidate of a real step verifies, choices apply by signature
// only, the tuning file round-trips and refuses corrupt and foreign files, explicit thread counts
// win over tuned ones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/exec/thread_governor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/tensor.hpp>
#include <kiln/core/tuning.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/version.hpp>

#include "scoped_env.hpp"
#include "scoped_eval.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::ScopedEnv;
using testing::ScopedEval;

// a [64, 32] x b [32, 48]: one f32 matmul kernel.
struct OneMatmul {
  Circuit c;
  ValueId out = kNoValue;
  OneMatmul() {
    ValueId a = c.add_external({Shape{64, 32}, DType::f32}, ValueRole::Input);
    ValueId b = c.add_external({Shape{32, 48}, DType::f32}, ValueRole::Input);
    out = Builder(c).matmul(a, b);
  }
  const Op& op() const { return c.ops().back(); }
};

// A clock that gives each candidate the time `ms(choice)`, without timing anything.
TuneOptions clock_of(std::function<double(const KernelChoice&)> ms) {
  TuneOptions o;
  o.team = 2;
  o.budget_s = 0;  // the fewest rounds
  o.clock = [ms](const std::string&, const KernelChoice& c, double) { return ms(c); };
  return o;
}

TEST(Tuning, TheInjectedClockDecidesTheChoice) {
  OneMatmul m;
  const std::vector<KernelChoice> candidates = cpu_candidates(m.c, m.op(), 2);
  ASSERT_GE(candidates.size(), 4u);  // standard, eigen (and onednn), each on the team and on one thread
  EXPECT_TRUE(candidates[0].is_default());
  for (const KernelChoice& winner : candidates) {
    const TuneReport report = tune_kernels(m.c, cpu_target(), clock_of([&](const KernelChoice& c) {
                                             return c == winner ? 1.0 : 2.0;
                                           }));
    const auto& results = report.kernels;
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].chosen, winner) << winner.str();
    EXPECT_EQ(results[0].candidates.size(), candidates.size());
    for (const CandidateResult& c : results[0].candidates) EXPECT_EQ(c.failure, "") << c.choice.str();
    // Kept where the step gains: the sum of its ops' times under the clock.
    EXPECT_EQ(report.kept, !winner.is_default());
    EXPECT_EQ(tuning_entries(report)[0].choice, winner);
  }
  // A lead below kMinGain is noise: the default stays.
  const auto close = tune_kernels(m.c, cpu_target(), clock_of([](const KernelChoice& c) {
                                    return c.is_default() ? 1.0 : 1.0 - kMinGain / 2;
                                  }));
  EXPECT_TRUE(close.kernels[0].chosen.is_default());
  EXPECT_FALSE(close.kept);
}


// Eigen's GEMM planted wrong (one element off by 1e-3 relative): it is the fastest, yet dropped.
TEST(Tuning, AWrongCandidateIsDroppedAndNeverChosen) {
  ScopedEval planted("matmul", [](EvalFn real) {
    return [real](const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
      std::vector<HostTensor> out = real(op, in, bufs);
      if (bufs.choice().gemm == KernelChoice::Gemm::eigen) out[0].set(7, out[0].get(7) * 1.001);
      return out;
    };
  });
  OneMatmul m;
  const TuneReport report = tune_kernels(m.c, cpu_target(), clock_of([](const KernelChoice& c) {
                                           return c.gemm == KernelChoice::Gemm::eigen ? 0.1 : 1.0;
                                         }));
  const auto& results = report.kernels;
  ASSERT_EQ(results.size(), 1u);
  EXPECT_NE(results[0].chosen.gemm, KernelChoice::Gemm::eigen);
  int dropped = 0;
  for (const CandidateResult& c : results[0].candidates)
    if (c.choice.gemm == KernelChoice::Gemm::eigen) {
      EXPECT_NE(c.failure.find("element 7"), std::string::npos) << c.failure;
      EXPECT_EQ(c.ms, 0);  // never timed
      ++dropped;
    } else {
      EXPECT_EQ(c.failure, "");
    }
  EXPECT_EQ(dropped, 2);  // on the team and on one thread
  EXPECT_TRUE(tuning_entries(report)[0].choice.gemm != KernelChoice::Gemm::eigen);
}

// Every candidate of a small GPT step's kernels (GEMM libraries, attention row blocks, fused-row
// chunks, one thread) gives the default's result within the summation-order tolerance.
TEST(Tuning, EveryCandidateOfAGptStepVerifies) {
  manual_seed(3);
  models::GPTConfig cfg;
  cfg.vocab_size = 17;
  cfg.block_size = 48;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 32;
  models::GPT model(cfg);
  optim::AdamW opt(model.parameters(), optim::AdamWOptions{});
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{2, 48});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 5) % 17));
  Tensor x = Tensor::from_host(ids);
  Tensor loss = model.loss(x, x);
  loss.backward();
  opt.step(1e-3, loss);
  const Circuit& plan = Engine::current().last_plan()->program->circuit();
  const auto results = tune_kernels(plan, cpu_target(), clock_of([](const KernelChoice&) { return 1.0; })).kernels;
  std::set<std::string> kinds;
  for (const KernelResult& r : results) {
    EXPECT_EQ(r.skipped, "") << r.kernel;
    for (const CandidateResult& c : r.candidates) {
      EXPECT_EQ(c.failure, "") << r.kernel << " " << c.choice.str();
      if (c.choice.attention_rows) kinds.insert("attention-rows");
      if (c.choice.row_chunk) kinds.insert("row-chunk");
      if (c.choice.gemm != KernelChoice::Gemm::standard) kinds.insert("gemm");
      if (c.choice.threads) kinds.insert("threads");
    }
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"attention-rows", "row-chunk", "gemm", "threads"}));
}

// A choice applies to the kernel of its signature only (an entry for another shape changes nothing).
TEST(Tuning, ChoicesApplyByKernelSignatureOnly) {
  ScopedEval marked("matmul", [](EvalFn real) {
    return [real](const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
      std::vector<HostTensor> out = real(op, in, bufs);
      if (bufs.choice().row_chunk == 7) out[0].set(0, -1.0);  // shows the choice reached the op
      return out;
    };
  });
  OneMatmul m;
  const std::string sig = kernel_signature(m.c, m.op());
  EXPECT_EQ(sig, "matmul ta=0 tb=0 f32[64, 32] f32[32, 48] -> f32[64, 48]");
  std::vector<HostTensor> binds = {HostTensor::zeros(DType::f32, {64, 32}), HostTensor::zeros(DType::f32, {32, 48})};
  KernelChoice marker;
  marker.row_chunk = 7;
  auto first = [&](const std::string& key) {
    Target t = cpu_target();
    t.tuned = KernelChoices({{key, marker}});
    return Program(m.c, {m.out}, t).run(binds)[0].get(0);
  };
  EXPECT_EQ(first(sig), -1.0);
  EXPECT_EQ(first("matmul ta=0 tb=0 f32[64, 32] f32[32, 49] -> f32[64, 49]"), 0.0);
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("kiln_tuning_" + std::to_string(::getpid()) + "_" + name)).string();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(Tuning, TheFileRoundTripsAndKeepsOtherVersionsUnapplied) {
  const std::string path = temp_path("roundtrip/dev.json");
  TuningFile f{"cpu Test \"CPU\" avx2", {}};
  KernelChoice c;
  c.gemm = KernelChoice::Gemm::onednn;
  c.threads = 1;
  f.put({version_string, "matmul a", c, 0.5, 0.25, 6});
  f.put({"0.0.0-old", "matmul b", c, 0.5, 0.25, 6});
  f.put({version_string, "matmul a", KernelChoice{}, 0.5, 0.5, 6});  // replaces the first
  write_tuning_file(path, f);
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(e.path().filename(), "dev.json");  // no temporary left
  const TuningFile back = read_tuning_file(path, f.device);
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[1].kiln_version, "0.0.0-old");
  EXPECT_EQ(back.entries[1].choice, c);
  EXPECT_EQ(back.choices().size(), 1u);  // this version's only
  EXPECT_TRUE(back.choices().find("matmul a")->is_default());
  EXPECT_EQ(back.choices().find("matmul b"), nullptr);
  EXPECT_TRUE(read_tuning_file(temp_path("missing.json"), "cpu X").entries.empty());
  fs::remove_all(fs::path(path).parent_path());
}

void expect_refused(const std::string& text, const std::string& device, const std::string& says) {
  const std::string path = temp_path("bad.json");
  write_text(path, text);
  try {
    read_tuning_file(path, device);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;  // names the file
    EXPECT_NE(what.find(says), std::string::npos) << what;
  }
  fs::remove(path);
}

TEST(Tuning, CorruptAndForeignFilesAreErrorsNamingTheFile) {
  const std::string good_entry =
      R"({"kiln": "1", "kernel": "k", "choice": "threads=1", "default_ms": 1, "chosen_ms": 0.5, "candidates": 2})";
  auto doc = [](const std::string& device, const std::string& entry) {
    return R"({"format": "kiln tuning 1", "device": ")" + device + R"(", "entries": [)" + entry + "]}";
  };
  EXPECT_NO_THROW(read_tuning_file((write_text(temp_path("ok.json"), doc("cpu A", good_entry)), temp_path("ok.json")),
                                   "cpu A"));
  fs::remove(temp_path("ok.json"));
  expect_refused("{\"format\": \"kiln tuning 1\", \"dev", "cpu A", "not valid JSON");
  expect_refused("\x7f\x45\x4c\x46 binary", "cpu A", "not valid JSON");
  expect_refused(doc("cpu A", good_entry) + "x", "cpu A", "not valid JSON");
  expect_refused(R"({"device": "cpu A", "entries": []})", "cpu A", "not a kiln tuning file");
  expect_refused(doc("cpu B avx512f", good_entry), "cpu A", "another device");
  expect_refused(doc("cpu A", R"({"kiln": "1", "kernel": "k", "choice": "threads=0", "default_ms": 1,
                                "chosen_ms": 1, "candidates": 1})"),
                 "cpu A", "entry 0");
  expect_refused(doc("cpu A", R"({"kiln": "1", "kernel": "k", "choice": "tiles=9", "default_ms": 1,
                                "chosen_ms": 1, "candidates": 1})"),
                 "cpu A", "unknown key");
  expect_refused(doc("cpu A", R"({"kiln": 1, "kernel": "k", "choice": "default", "default_ms": 1,
                                "chosen_ms": 1, "candidates": 1})"),
                 "cpu A", "\"kiln\" string");
  expect_refused(doc("cpu A", R"({"kiln": "1", "kernel": "k", "choice": "default", "default_ms": -1,
                                "chosen_ms": 1, "candidates": 1})"),
                 "cpu A", "default_ms");
}

// The user's file wins; where there is none, the file shipped for the device kind serves.
TEST(Tuning, TheUsersFileWinsOverTheShippedOne) {
  const std::string cache = temp_path("cache"), shipped = temp_path("shipped");
  const ScopedEnv cache_dir("KILN_CACHE_DIR", cache);
  const std::string device = "cpu Test CPU avx2";
  KernelChoice shipped_choice, user_choice;
  shipped_choice.threads = 1;
  user_choice.gemm = KernelChoice::Gemm::eigen;
  write_tuning_file(shipped_tuning_path(device, shipped), {device, {{version_string, "k", shipped_choice, 1, 1, 2}}});
  std::string from;
  EXPECT_EQ(*load_tuned_choices(device, &from, shipped).find("k"), shipped_choice);
  EXPECT_EQ(from, shipped_tuning_path(device, shipped));
  write_tuning_file(user_tuning_path(device), {device, {{version_string, "k", user_choice, 1, 1, 2}}});
  EXPECT_EQ(*load_tuned_choices(device, &from, shipped).find("k"), user_choice);
  EXPECT_EQ(from, cache + "/tuning/" + tuning_file_name(device));
  EXPECT_EQ(tuning_file_name(device), "cpu-Test-CPU-avx2.json");
  EXPECT_TRUE(load_tuned_choices("cpu Other", &from, shipped).empty());
  EXPECT_EQ(from, "");
  fs::remove_all(cache);
  fs::remove_all(shipped);
}

// `--tune on`: the engine tunes the next plan's kernels before making it, writes the device's
// file and plans with the choices, fixed from then on (a later plan tunes nothing); a
// deterministic run tunes nothing (the request lapses).
TEST(Tuning, TuneOnTunesTheNextPlanOnlyAndNeverADeterministicOne) {
  const std::string cache = temp_path("tune_on");
  const ScopedEnv cache_dir("KILN_CACHE_DIR", cache);
  const testing::ScopedTarget restored([](Target&) {});
  Engine& engine = Engine::current();
  const std::string file = user_tuning_path(device_identity(engine.target()));
  auto step = [](int64_t rows) {
    HostTensor a = HostTensor::zeros(DType::f32, {rows, 40}), b = HostTensor::zeros(DType::f32, {40, 24});
    for (int64_t i = 0; i < a.numel(); ++i) a.set(i, 0.01 * static_cast<double>(i % 13));
    for (int64_t i = 0; i < b.numel(); ++i) b.set(i, 0.02 * static_cast<double>(i % 7));
    return sum(matmul(Tensor::from_host(a), Tensor::from_host(b))).item();
  };
  engine.set_tune_next_plan(true);
  engine.set_deterministic(true);
  step(48);
  engine.set_deterministic(false);
  EXPECT_FALSE(fs::exists(file));
  EXPECT_TRUE(engine.target().tuned.empty());
  step(48);  // the request lapsed with the deterministic plan
  EXPECT_FALSE(fs::exists(file));

  engine.set_tune_next_plan(true);
  step(52);  // a plan not made yet
  ASSERT_TRUE(fs::exists(file)) << file;
  const KernelChoices chosen = engine.target().tuned;
  EXPECT_FALSE(chosen.empty());
  EXPECT_GE(read_tuning_file(file, device_identity(engine.target())).entries.size(), 2u);  // the matmul, the sum
  const auto written = fs::last_write_time(file);
  step(56);  // a new plan (other shapes): made with the choices, nothing tuned or written
  EXPECT_EQ(fs::last_write_time(file), written);
  EXPECT_EQ(engine.target().tuned, chosen);
  fs::remove_all(cache);
}

TEST(Tuning, KernelChoicesPrintAndParseBack) {
  KernelChoice c;
  EXPECT_EQ(c.str(), "default");
  EXPECT_EQ(KernelChoice::parse("default"), c);
  c.gemm = KernelChoice::Gemm::eigen;
  c.threads = 1;
  c.attention_rows = 64;
  c.row_chunk = 4;
  EXPECT_EQ(c.str(), "gemm=eigen,threads=1,attention-rows=64,row-chunk=4");
  EXPECT_EQ(KernelChoice::parse(c.str()), c);
  EXPECT_THROW(KernelChoice::parse("gemm=mkl"), Error);
  EXPECT_THROW(KernelChoice::parse("threads=x"), Error);
  EXPECT_THROW(KernelChoice::parse("threads=1,threads=2"), Error);
  EXPECT_THROW(KernelChoice::parse("threads=1,"), Error);
  EXPECT_THROW(KernelChoice::parse(""), Error);
}

// An explicit thread count (--threads, KILN_NUM_THREADS) wins over tuned per-op thread counts,
// an explicit --matmul over tuned matmul keys; the other choices stay.
TEST(Tuning, AnExplicitThreadCountWinsOverTunedOnes) {
  KernelChoice c;
  c.threads = 1;
  c.gemm = KernelChoice::Gemm::onednn;
  const KernelChoices tuned({{"k", c}});
  EXPECT_EQ(without_overridden(tuned, false), tuned);
  const KernelChoices fixed = without_overridden(tuned, true);
  ASSERT_NE(fixed.find("k"), nullptr);
  EXPECT_EQ(fixed.find("k")->threads, 0);
  EXPECT_EQ(fixed.find("k")->gemm, KernelChoice::Gemm::onednn);
  // An explicit --matmul wins over tuned matmul keys.
  KernelChoice gpu;
  gpu.matmul = "tile=128x256";
  const KernelChoices keys = without_overridden(KernelChoices({{"m", gpu}}), false, true);
  EXPECT_TRUE(keys.find("m")->matmul.empty());
  // The tuned Target is another plan key, and its line says so.
  Target t = cpu_target();
  const Target untuned = t;
  t.tuned = tuned;
  EXPECT_NE(t, untuned);
  EXPECT_NE(t.str().find(" tuned=1:" + tuned.fingerprint()), std::string::npos) << t.str();
}

}  // namespace
}  // namespace kiln
