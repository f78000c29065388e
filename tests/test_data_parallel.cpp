// Data parallelism across processes (circuit/comm, core/distributed.hpp, the trainer's shards):
// `mpirun -np N kiln train` against one process on the same global batch, and a rank that dies
// or hangs. The runs are the CLI's own, under Debian's OpenMPI (skipped where mpirun or the CLI
// is missing; CI installs both). Tolerances: losses 1e-5 relative and weights 1e-5 norm-relative,
// because the averaged gradient adds the ranks' partial sums in another order than one process's
// batch reduction (f32: measured 1e-7 on the losses); bit equality is not to be had.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/weights.hpp>

#include "prim_test_util.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

#ifdef KILN_CLI_PATH
constexpr const char* kCli = KILN_CLI_PATH;
#else
constexpr const char* kCli = "";
#endif

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

// A fresh folder with a small corpus (a few hundred lines of varied text).
fs::path workdir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("kiln_dp_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream corpus(d / "corpus.txt");
  for (int i = 0; i < 400; ++i)
    corpus << "line " << i << ": the quick brown fox " << (i * 7919 % 97) << " jumps over the lazy dog\n";
  return d;
}

// Runs a shell command with its output in `log`; returns its exit status and the seconds it took.
std::pair<int, double> run(const std::string& command, const fs::path& log) {
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system((command + " > '" + log.string() + "' 2>&1").c_str());
  return {status, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The "loss" of every step line of a metrics log.
std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);)
    if (const size_t at = line.find("\"loss\": ");
        at != std::string::npos && line.find("\"step\"") != std::string::npos)
      out.push_back(std::stod(line.substr(at + 8)));
  return out;
}

// The weights' distance between two weights files, norm-relative, the worst parameter. The key
// third of each c_attn.bias is apart: its gradient is zero in exact arithmetic (a constant added
// to every score of a row leaves the softmax as it is), so AdamW turns rounding noise into steps
// of about lr, whose signs any change of summation order (or a weight an ulp apart) flips. For
// it: |difference| at most 2 lr a step, 20 steps (0.08), the q and v thirds as the other
// parameters.
double weights_distance(const fs::path& got, const fs::path& want) {
  std::unique_ptr<models::CausalLM> g = load_model(got.string()), w = load_model(want.string());
  const auto a = w->named_parameters(), b = g->named_parameters();
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const HostTensor x = b[i].second.to_host(), y = a[i].second.to_host();
    if (a[i].first.find("attn.c_attn.bias") == std::string::npos) {
      worst = std::max(worst, testing::relative_error(x, y));
      continue;
    }
    const int64_t c = x.numel() / 3;
    for (int third : {0, 2}) {
      HostTensor xs = HostTensor::zeros(DType::f32, Shape{c}), ys = HostTensor::zeros(DType::f32, Shape{c});
      for (int64_t e = 0; e < c; ++e) xs.set(e, x.get(third * c + e)), ys.set(e, y.get(third * c + e));
      worst = std::max(worst, testing::relative_error(xs, ys));
    }
    for (int64_t e = c; e < 2 * c; ++e) EXPECT_LE(std::fabs(x.get(e) - y.get(e)), 0.08) << a[i].first << " " << e;
  }
  return worst;
}

// The largest relative distance between two runs' losses, step by step.
double worst_relative(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / std::fabs(want[i]));
  return worst;
}

// kiln train on the corpus in `dir`: a small GPT, 20 steps, a global batch of 6, `threads` threads;
// its buffers poisoned, as the suite's own (tests/test_environment.cpp).
std::string train_command(const fs::path& dir, const std::string& tag, int threads = 1) {
  return std::string(kCli) + " train --poison-buffers --data '" + (dir / "corpus.txt").string() +
         "' --layers 2 --heads 2 --embd 32 --block 32 --batch 6 --steps 20 --warmup 5 --eval-every 0 --threads " +
         std::to_string(threads) + " --out '" + (dir / (tag + ".h5")).string() + "' --metrics '" +
         (dir / (tag + ".jsonl")).string() + "'";
}

// mpirun for N ranks on this machine (root allowed, more ranks than cores allowed), leak checks
// of sanitized builds off for the launched processes (OpenMPI keeps its allocations to the end),
// and killed after 120 s whatever happens (a test never hangs CI).
std::string mpirun(int ranks, const std::string& env = "") {
  return "ASAN_OPTIONS=detect_leaks=0 " + env + " timeout -s KILL 120 mpirun --allow-run-as-root --oversubscribe -np " +
         std::to_string(ranks) + " ";
}

#define KILN_REQUIRE_MPI_OR_SKIP()                                                        \
  do {                                                                                    \
    if (std::string(kCli).empty()) GTEST_SKIP() << "the kiln CLI is not built";           \
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (apt-get install openmpi-bin)"; \
  } while (0)

TEST(DataParallel, RanksAndMicroBatchesTrainAsOneProcessOnTheSameGlobalBatch) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("equal");
  auto [status, secs] = run(train_command(dir, "one"), dir / "one.log");
  ASSERT_EQ(status, 0) << read(dir / "one.log");
  const std::vector<double> one = losses(dir / "one.jsonl");
  ASSERT_EQ(one.size(), 20u) << read(dir / "one.jsonl");
  auto [ts, tsecs] = run(train_command(dir, "two_threads", 2), dir / "two_threads.log");
  ASSERT_EQ(ts, 0) << read(dir / "two_threads.log");
  const double thread_floor = weights_distance(dir / "two_threads.h5", dir / "one.h5");
  // Ranks, and micro-batches a rank (--grad-accum): the same global batch of 6 every time.
  for (auto [ranks, accum] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{1, 3}, std::pair{3, 2}}) {
    const std::string tag = "ranks" + std::to_string(ranks) + "_accum" + std::to_string(accum);
    const std::string command = train_command(dir, tag) + " --grad-accum " + std::to_string(accum);
    auto [rs, rsecs] = run(ranks > 1 ? mpirun(ranks) + command : command, dir / (tag + ".log"));
    ASSERT_EQ(rs, 0) << read(dir / (tag + ".log"));
    if (ranks > 1) {
      EXPECT_NE(read(dir / (tag + ".log")).find("data parallel: " + std::to_string(ranks) + " ranks"),
                std::string::npos)
          << read(dir / (tag + ".log"));
    }
    const std::vector<double> many = losses(dir / (tag + ".jsonl"));
    ASSERT_EQ(many.size(), one.size());
    const double worst = worst_relative(many, one);
    EXPECT_LT(worst, 1e-5) << tag;
    const double worst_weight = weights_distance(dir / (tag + ".h5"), dir / "one.h5");
    EXPECT_LT(worst_weight, 1e-5) << tag;
    std::printf(
        "%d rank(s), %d micro-batches each, against one process: losses %.2g relative at worst, weights %.2g "
        "norm-relative (one process on two threads: %.2g)\n",
        ranks, accum, worst, worst_weight, thread_floor);
  }
  fs::remove_all(dir);
}

// A run stopped after step 10 (--stop-at) and resumed on 2 ranks goes on as the uninterrupted
// run of one process: the checkpoint holds no trace of the world size, and the ranks' shards of
// each step's global batch are the batch one process draws.
TEST(DataParallel, AResumedRunMayChangeTheNumberOfRanks) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("resume");
  auto [status, secs] = run(train_command(dir, "whole"), dir / "whole.log");
  ASSERT_EQ(status, 0) << read(dir / "whole.log");
  const std::string ckpt = (dir / "half.ckpt.h5").string();
  auto [hs, hsecs] = run(train_command(dir, "half") + " --stop-at 10 --checkpoint '" + ckpt + "'", dir / "half.log");
  ASSERT_EQ(hs, 0) << read(dir / "half.log");
  // The training flags again (a checkpoint keeps the model's config and tokenizer, not the schedule).
  auto [rs, rsecs] = run(mpirun(2) + train_command(dir, "rest") + " --resume '" + ckpt + "'", dir / "rest.log");
  ASSERT_EQ(rs, 0) << read(dir / "rest.log");
  EXPECT_NE(read(dir / "rest.log").find("data parallel: 2 ranks"), std::string::npos) << read(dir / "rest.log");
  const std::vector<double> whole = losses(dir / "whole.jsonl"), rest = losses(dir / "rest.jsonl");
  ASSERT_EQ(whole.size(), 20u);
  ASSERT_EQ(rest.size(), 10u) << read(dir / "rest.jsonl");
  for (size_t i = 0; i < rest.size(); ++i)
    EXPECT_NEAR(rest[i], whole[10 + i], 1e-5 * whole[10 + i]) << "step " << 11 + i;
  fs::remove_all(dir);
}

// kiln train on the fake driver (--device sim: kernels in the simulator): a GPT small enough for
// the simulator, `steps` steps of a global batch of `batch`, no sample (300 tokens on the simulator
// take 100 s under ASan, near mpirun's limit).
std::string fake_gpu_command(const fs::path& dir, const std::string& tag, int steps, int batch) {
  return std::string(kCli) + " train --device sim --poison-buffers --data '" + (dir / "corpus.txt").string() +
         "' --layers 1 --heads 2 --embd 16 --block 8 --batch " + std::to_string(batch) + " --steps " +
         std::to_string(steps) + " --warmup 2 --eval-every 0 --threads 1 --sample-tokens 0 --out '" +
         (dir / (tag + ".h5")).string() + "' --metrics '" + (dir / (tag + ".jsonl")).string() + "'";
}

// GPUs across ranks, on the fake driver: 2 ranks whose gradients are averaged by the device
// collective (through host memory and MPI: the fake driver has no stream capture for NCCL) train
// as one process on the same global batch.
TEST(DataParallel, FakeGpuRanksTrainAsOneProcess) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("fakegpu");
  auto [os, osecs] = run(fake_gpu_command(dir, "one", 4, 4), dir / "one.log");
  ASSERT_EQ(os, 0) << read(dir / "one.log");
  auto [ts, tsecs] = run(mpirun(2) + fake_gpu_command(dir, "two", 4, 4), dir / "two.log");
  ASSERT_EQ(ts, 0) << read(dir / "two.log");
  EXPECT_NE(read(dir / "two.log").find("gradients averaged through host memory and MPI"), std::string::npos)
      << read(dir / "two.log");
  const std::vector<double> one = losses(dir / "one.jsonl"), two = losses(dir / "two.jsonl");
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(two.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(two[i], one[i], 1e-5 * one[i]) << "step " << i + 1;
  fs::remove_all(dir);
}

// A global batch that does not split over the ranks, or a rank's share over the micro-batches, is
// refused, naming the numbers.
TEST(DataParallel, ABatchThatDoesNotSplitOverTheRanksIsAnError) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("split");
  auto [status, secs] = run(mpirun(4) + train_command(dir, "four"), dir / "four.log");
  EXPECT_NE(status, 0);
  EXPECT_NE(read(dir / "four.log").find("the batch of 6 sequences does not split over 4 ranks"), std::string::npos)
      << read(dir / "four.log");
  auto [accum_status, accum_secs] = run(mpirun(2) + train_command(dir, "accum") + " --grad-accum 2", dir / "accum.log");
  EXPECT_NE(accum_status, 0);
  EXPECT_NE(read(dir / "accum.log").find("--grad-accum 2 must divide the 3 sequences each of 2 rank(s)"),
            std::string::npos)
      << read(dir / "accum.log");
  fs::remove_all(dir);
}

// A rank killed mid-run (SIGKILL) ends the job: mpirun notices and stops the others, naming the
// rank; a rank that hangs (SIGSTOP) makes the others' next collective time out
// (KILN_COLLECTIVE_TIMEOUT=5) with an error saying so; SIGTERM on rank 1 alone stops every rank
// after the same step, with rank 0's interrupt checkpoint written. All well inside a minute.
TEST(DataParallel, ADeadOrHungRankStopsTheJobWithinTheTimeout) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("fault");
  for (const char* signal : {"KILL", "STOP", "TERM"}) {
    // Rank 1 sends itself the signal a second after the job's first step is logged (at most 20 s
    // of waiting), well into a long run (exec keeps its PID). A fixed delay from the start let a
    // loaded machine's slow start-up take the signal before the handlers were installed.
    const std::string rank_command =
        std::string("sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then (i=0; while [ $i -lt 100 ] && ! grep -q ") +
        "\"step *1/\" fault.log; do sleep 0.2; i=$((i + 1)); done; sleep 1; kill -" + signal + " $$) & fi; exec " +
        train_command(dir, signal) + " --steps 100000'";
    auto [status, secs] =
        run("cd '" + dir.string() + "' && " + mpirun(2, "KILN_COLLECTIVE_TIMEOUT=5") + rank_command, dir / "fault.log");
    const std::string log = read(dir / "fault.log");
    EXPECT_NE(status, 0) << signal << ": " << log;
    EXPECT_LT(secs, 60) << signal << ": " << log;
    if (std::string(signal) == "KILL") {
      EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
    } else if (std::string(signal) == "STOP") {
      EXPECT_NE(log.find("did not join within 5 s"), std::string::npos) << log;
    } else {  // TERM: every rank stops after the same step, rank 0's checkpoint on disk first
      EXPECT_NE(log.find("SIGTERM received: training stopped after step"), std::string::npos) << log;
      EXPECT_TRUE(fs::exists(dir / "kiln-interrupted.ckpt.h5")) << log;
    }
    std::printf("SIG%s on rank 1: the job ended after %.1f s\n", signal, secs);
  }
  fs::remove_all(dir);
}

// Overlapped communication (overlap_collectives: each bucket's all-reduce started as soon as the
// backward has made it, nonblocking MPI) gives the results of the same buckets reduced after the
// backward (--passes -overlap_collectives) to the bit, on 2 and 3 ranks, with buckets of 50 KiB (a
// few a step); so does one bucket of everything (every element is summed in rank order wherever
// the buckets cut). `--collectives noop` trains with each rank's own gradients and says so.
TEST(DataParallel, OverlappedAllReducesEqualTheBlockingOnes) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("overlap");
  for (int ranks : {2, 3}) {
    std::vector<double> got[2];
    for (int overlap : {0, 1}) {
      const std::string tag = "r" + std::to_string(ranks) + (overlap ? "_overlap" : "_blocking");
      const std::string command = mpirun(ranks) + train_command(dir, tag) + " --bucket-mb 0.05" +
                                  (overlap ? "" : " --passes -overlap_collectives");
      auto [status, secs] = run(command, dir / (tag + ".log"));
      ASSERT_EQ(status, 0) << read(dir / (tag + ".log"));
      got[overlap] = losses(dir / (tag + ".jsonl"));
      ASSERT_EQ(got[overlap].size(), 20u) << read(dir / (tag + ".jsonl"));
    }
    EXPECT_EQ(got[0], got[1]) << ranks << " ranks";
    const std::string whole = "r" + std::to_string(ranks) + "_one_bucket";
    auto [ws, wsecs] = run(mpirun(ranks) + train_command(dir, whole) + " --bucket-mb 1000", dir / (whole + ".log"));
    ASSERT_EQ(ws, 0) << read(dir / (whole + ".log"));
    EXPECT_EQ(losses(dir / (whole + ".jsonl")), got[1]) << ranks << " ranks, one bucket";
    const std::string tag = "r" + std::to_string(ranks);
    std::unique_ptr<models::CausalLM> a = load_model((dir / (tag + "_blocking.h5")).string());
    std::unique_ptr<models::CausalLM> b = load_model((dir / (tag + "_overlap.h5")).string());
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(testing::relative_error(pa[i].second.to_host(), pb[i].second.to_host()), 0.0)
          << ranks << " ranks: " << pa[i].first;
  }
  auto [status, secs] = run(mpirun(2) + train_command(dir, "noop") + " --collectives noop", dir / "noop.log");
  ASSERT_EQ(status, 0) << read(dir / "noop.log");
  EXPECT_NE(read(dir / "noop.log").find("--collectives noop"), std::string::npos) << read(dir / "noop.log");
  fs::remove_all(dir);
}

// "optimizer state: X MiB on rank 0, ... (Y MiB whole)" of a training log: {X, Y}.
std::pair<double, double> optimizer_state_mib(const std::string& log) {
  const size_t at = log.find("optimizer state: ");
  if (at == std::string::npos) return {-1, -1};
  const size_t whole = log.find('(', at);
  return {std::stod(log.substr(at + 17)), std::stod(log.substr(whole + 1))};
}

// Trains `ranks` ranks with `command(tag)`, unsharded and with --shard-optimizer, and expects the
// same run over its 20 steps to the tolerances (losses, weights; the attention keys' biases as
// weights_distance says; each element is updated as without sharding, only the global norm's sum
// is grouped otherwise), rank 0 holding 1/N of the moments.
void expect_sharding_changes_nothing(const fs::path& dir, int ranks,
                                     const std::function<std::string(const std::string&)>& command,
                                     const std::string& device, double loss_tolerance = 1e-6,
                                     double weight_tolerance = 1e-6) {
  const std::string plain = "r" + std::to_string(ranks), sharded = plain + "_sharded";
  for (const std::string& tag : {plain, sharded}) {
    auto [status, secs] = run(mpirun(ranks) + command(tag) + (tag == sharded ? " --shard-optimizer" : ""),
                              dir / (tag + ".log"));
    ASSERT_EQ(status, 0) << read(dir / (tag + ".log"));
  }
  const std::vector<double> got = losses(dir / (sharded + ".jsonl"));
  ASSERT_EQ(got.size(), 20u) << read(dir / (sharded + ".log"));
  const double loss_error = worst_relative(got, losses(dir / (plain + ".jsonl")));
  const double weight_error = weights_distance(dir / (sharded + ".h5"), dir / (plain + ".h5"));
  EXPECT_LT(loss_error, loss_tolerance) << ranks << " ranks";
  EXPECT_LT(weight_error, weight_tolerance) << ranks << " ranks";
  const auto [shard_mib, whole_mib] = optimizer_state_mib(read(dir / (sharded + ".log")));
  const auto [plain_mib, plain_whole] = optimizer_state_mib(read(dir / (plain + ".log")));
  EXPECT_EQ(plain_mib, plain_whole) << read(dir / (plain + ".log"));
  EXPECT_NEAR(shard_mib, whole_mib / ranks, 0.002) << read(dir / (sharded + ".log"));
  std::printf(
      "ZeRO-1 on %d ranks (%s) against unsharded: losses %.2g relative at worst, weights %.2g; optimizer state "
      "%.3f MiB a rank against %.3f\n",
      ranks, device.c_str(), loss_error, weight_error, shard_mib, plain_mib);
}

// ZeRO-1 (--shard-optimizer) on the CPU: 2 and 3 ranks train as the unsharded run.
TEST(DataParallel, ShardedOptimizerTrainsAsTheUnshardedRun) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("zero");
  for (int ranks : {2, 3})
    expect_sharding_changes_nothing(dir, ranks, [&](const std::string& tag) { return train_command(dir, tag); }, "CPU");
  fs::remove_all(dir);
}

// With bf16 matmuls and 3 micro-batches a rank (the reduce-scatter after the last one) the runs
// agree less closely than in f32: the f32 weights still differ by the norm's rounding (about
// 1e-7), the few that then round to a neighbouring bf16 value (2^-8 apart) move the losses by about
// 1e-5 (measured 1e-5), and weights whose gradients are at the level of that noise take AdamW
// steps of about lr in either direction (the worst parameter 1.3e-3 apart). Hence 1e-4 and 1e-2:
// a wrong chunk moves the losses by 1e-2 and the weights by more than 1.
TEST(DataParallel, ShardedOptimizerWithBf16AndMicroBatches) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("zero_bf16");
  expect_sharding_changes_nothing(
      dir, 2, [&](const std::string& tag) { return train_command(dir, tag) + " --precision bf16 --grad-accum 3"; },
      "CPU, bf16, 3 micro-batches", 1e-4, 1e-2);
  fs::remove_all(dir);
}

// ZeRO-1 on the fake GPU: the device collective's reduce-scatter and all-gather (host staged, the
// fake driver has no NCCL) in the step, 2 and 3 ranks as the unsharded run.
TEST(DataParallel, FakeGpuShardedOptimizerTrainsAsTheUnshardedRun) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("zero_fakegpu");
  for (int ranks : {2, 3}) {
    expect_sharding_changes_nothing(
        dir, ranks, [&](const std::string& tag) { return fake_gpu_command(dir, tag, 20, 6); }, "fake GPU");
    const std::string log = read(dir / ("r" + std::to_string(ranks) + "_sharded.log"));
    EXPECT_NE(log.find("--shard-optimizer on GPUs: collectives through host memory"), std::string::npos) << log;
  }
  fs::remove_all(dir);
}

// A sharded run's checkpoint holds the whole moments: stopped after step 10 on 2 ranks and resumed
// on 3 (sharded) or 1 (unsharded), it goes on as the uninterrupted sharded run.
TEST(DataParallel, AShardedRunResumesOnAnotherNumberOfRanks) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("zero_resume");
  auto [ws, wsecs] = run(mpirun(2) + train_command(dir, "whole") + " --shard-optimizer", dir / "whole.log");
  ASSERT_EQ(ws, 0) << read(dir / "whole.log");
  const std::string ckpt = (dir / "half.ckpt.h5").string();
  auto [hs, hsecs] =
      run(mpirun(2) + train_command(dir, "half") + " --shard-optimizer --stop-at 10 --checkpoint '" + ckpt + "'",
          dir / "half.log");
  ASSERT_EQ(hs, 0) << read(dir / "half.log");
  const std::vector<double> whole = losses(dir / "whole.jsonl");
  ASSERT_EQ(whole.size(), 20u);
  const std::vector<double> rest_of_whole(whole.begin() + 10, whole.end());
  for (const auto& [tag, launch] : {std::pair<std::string, std::string>{"rest3", mpirun(3)}, {"rest1", ""}}) {
    const std::string flags = tag == "rest3" ? " --shard-optimizer" : "";
    auto [rs, rsecs] = run(launch + train_command(dir, tag) + flags + " --resume '" + ckpt + "'", dir / (tag + ".log"));
    ASSERT_EQ(rs, 0) << read(dir / (tag + ".log"));
    const double error = worst_relative(losses(dir / (tag + ".jsonl")), rest_of_whole);
    const double weights = weights_distance(dir / (tag + ".h5"), dir / "whole.h5");
    EXPECT_LT(error, 1e-6) << tag;
    EXPECT_LT(weights, 1e-6) << tag;
    std::printf("a 2-rank sharded run resumed at step 10 (%s): losses %.2g relative at worst, weights %.2g\n",
                tag.c_str(), error, weights);
  }
  fs::remove_all(dir);
}

// kiln bench under mpirun times the step with and without its collectives, in turns.
TEST(DataParallel, BenchReportsTheExposedCommunicationTime) {
  KILN_REQUIRE_MPI_OR_SKIP();
  const fs::path dir = workdir("bench");
  auto [status, secs] = run(mpirun(2) + std::string(kCli) +
                                " bench --layers 1 --heads 2 --embd 16 --block 16 --batch 2 --steps 3 --threads 1",
                            dir / "bench.log");
  const std::string log = read(dir / "bench.log");
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("exposed communication: "), std::string::npos) << log;
  EXPECT_NE(log.find("2 ranks through MPI"), std::string::npos) << log;
  fs::remove_all(dir);
}

// One process: average_over_ranks records nothing, and the all_reduce op is a copy.
TEST(DataParallel, OneRankRecordsNoCollective) {
  EXPECT_EQ(world().size(), 1);
  Tensor a = Tensor::from_host(testing::random_tensor({Shape{3, 4}, DType::f32}, 1));
  std::vector<Tensor> r = average_over_ranks({a}, size_t{1} << 20);
  EXPECT_EQ(r[0].impl(), a.impl());
}

// A world of two ranks inside this process: the other rank contributes 1 to every element of
// every all-reduce, and the calls are counted.
class FakeWorld final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "fake"; }
  void all_reduce_sum(float* data, int64_t n) override { add_one(data, n); }
  void all_reduce_sum(double* data, int64_t n) override { add_one(data, n); }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
  std::vector<int64_t> calls;  // elements of each all-reduce

 private:
  template <class T>
  void add_one(T* data, int64_t n) {
    calls.push_back(n);
    for (int64_t i = 0; i < n; ++i) data[i] += T(1);
  }
};

struct ScopedWorld {
  explicit ScopedWorld(std::shared_ptr<Communicator> c) { set_world(std::move(c)); }
  ~ScopedWorld() { set_world(nullptr); }
};

// The reference: (x + the other rank's 1) / 2, in f32 and f64, one collective per op.
TEST(PrimReferenceAllReduce, AveragesOverTheRanksThroughTheCommunicator) {
  auto fake = std::make_shared<FakeWorld>();
  ScopedWorld scoped(fake);
  for (DType dt : {DType::f32, DType::f64}) {
    Circuit c;
    const ValueId x = c.add_external({Shape{7}, dt}, ValueRole::Input);
    const ValueId y = c.add_op(PrimId::all_reduce, {}, {x})[0];
    HostTensor in = testing::random_tensor({Shape{7}, dt}, 3);
    const HostTensor out = execute(c, {in}, {y})[0];
    for (int64_t i = 0; i < 7; ++i) EXPECT_DOUBLE_EQ(out.get(i), (in.get(i) + 1.0) / 2.0) << dtype_name(dt);
  }
  EXPECT_EQ(fake->calls, (std::vector<int64_t>{7, 7}));
}

// Buckets: the values of a dtype side by side, up to bucket_bytes each (a larger value alone);
// each value comes back averaged in its own shape.
TEST(DataParallel, GradientsAreAveragedInBuckets) {
  auto fake = std::make_shared<FakeWorld>();
  ScopedWorld scoped(fake);
  std::vector<Tensor> xs;
  uint64_t seed = 1;
  for (const Shape& s : {Shape{3, 4}, Shape{5}, Shape{2, 2}})
    xs.push_back(Tensor::from_host(testing::random_tensor({s, DType::f32}, seed++)));
  const std::vector<Tensor> avg = average_over_ranks(xs, /*bucket_bytes=*/10 * sizeof(float));
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(avg[i].shape(), xs[i].shape());
    const HostTensor a = avg[i].to_host(), x = xs[i].to_host();
    for (int64_t e = 0; e < x.numel(); ++e) EXPECT_FLOAT_EQ(static_cast<float>(a.get(e)), (x.get(e) + 1.0f) / 2.0f);
  }
  EXPECT_EQ(fake->calls, (std::vector<int64_t>{12, 9}));
}

// The averaged gradients are the optimizer's inputs, not results of the step: a step over two
// ranks allocates no more host storage than one over one rank (a step that kept them as outputs
// allocated their bytes every step, and on the GPU downloaded them).
TEST(DataParallel, AveragedGradientsAreNotKeptAsTheStepsOutputs) {
  models::GPTConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{2, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 5 + 3) % 13));
  int64_t param_bytes = 0;
  auto step_bytes = [&] {
    manual_seed(3);
    models::GPT model(c);
    optim::AdamW opt(model.parameters(), {});
    param_bytes = 0;
    for (const Tensor& p : model.parameters()) param_bytes += p.numel() * 4;
    Tensor x = Tensor::from_host(ids);
    for (int s = 0; s < 3; ++s) {
      Tensor loss = model.loss(x, x);
      loss.backward();
      opt.step(1.0);
    }
    return static_cast<int64_t>(Engine::current().stats().last_counters.storage_bytes);
  };
  const int64_t one = step_bytes();
  int64_t two = 0;
  {
    ScopedWorld scoped(std::make_shared<FakeWorld>());
    two = step_bytes();
  }
  EXPECT_LT(two, one + param_bytes / 2) << "one rank " << one << " bytes a step, two " << two << ", parameters "
                                        << param_bytes;
}

}  // namespace
}  // namespace kiln
