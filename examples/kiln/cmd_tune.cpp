// `kiln tune`: the autotuner (core/tuning.hpp) over one training step's kernels, its table, and
// the device's tuning file (--list, --clear); and the `--tune off|cached|on` option of kiln train
// and kiln bench.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>

#include <kiln/circuit/exec/thread_governor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/device.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/tuning.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/trainer.hpp>

#include "args.hpp"
#include "commands.hpp"

namespace kiln::cli {

std::map<std::string, std::string> with_tune_flag(std::map<std::string, std::string> options) {
  options["tune"] =
      "kernel choices: cached (default: the device's tuned choices where `kiln tune` measured them, kiln's defaults "
      "elsewhere), off (kiln's defaults) or on (tune the kernels the cache lacks before the first step)";
  return options;
}

TuneMode apply_tune_flag(const Args& a, cuda::Runtime* runtime, bool list_choices) {
  const TuneMode mode = parse_tune_mode(a.str("tune", "cached"));
  Engine& engine = Engine::current();
  if (mode == TuneMode::off) return mode;
  Target t = engine.target();
  if (t.gpu() && !runtime) return mode;
  if (mode == TuneMode::on && t.gpu())
    spdlog::warn("--tune on: GPU kernels are tuned by `kiln tune --device cuda`; the cached choices run");
  if (mode == TuneMode::on && world().size() > 1)
    throw Error("--tune on: under mpirun every rank uses the tuning file as it is; run `kiln tune` first, or --tune cached");
  std::string from;
  const bool threads_fixed = fixed_num_threads() > 0, matmul_fixed = a.has("matmul");
  t.tuned = without_overridden(load_tuned_choices(device_identity(t, runtime), &from), threads_fixed, matmul_fixed);
  engine.set_target(t);
  if (!from.empty())
    spdlog::info("kernel choices: {} tuned kernels from {}{}{}", t.tuned.size(), from,
                 threads_fixed ? " (per-op thread counts left to --threads)" : "",
                 matmul_fixed ? " (matmul kernels left to --matmul)" : "");
  if (list_choices)
    for (const auto& [kernel, choice] : t.tuned.entries())
      if (!choice.is_default()) spdlog::info("  tuned: {} -> {}", kernel, choice.str());
  return t.gpu() ? TuneMode::cached : mode;  // GPU kernels are tuned by kiln tune only
}

namespace {

std::string shortened(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

int list_file(const std::string& device) {
  const std::string user = user_tuning_path(device), shipped = shipped_tuning_path(device);
  std::printf("device: %s\n", device.c_str());
  for (const auto& [what, path] : {std::pair{"your tuning file", user}, std::pair{"shipped with kiln", shipped}}) {
    if (path.empty()) {
      std::printf("%s: none (KILN_CACHE_DIR=off)\n", what);
      continue;
    }
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      std::printf("%s: %s (none yet)\n", what, path.c_str());
      continue;
    }
    const TuningFile f = read_tuning_file(path, device);
    std::printf("%s: %s (%zu entries)\n", what, path.c_str(), f.entries.size());
    for (const TuningEntry& e : f.entries)
      std::printf("  kiln %-7s %-90s %-28s %8.3f -> %8.3f ms\n", e.kiln_version.c_str(), shortened(e.kernel, 90).c_str(),
                  e.choice.str().c_str(), e.default_ms, e.chosen_ms);
  }
  return 0;
}
}  // namespace

int cmd_tune(const std::vector<std::string>& argv) {
  Args a(argv,
         with_target_flags(with_precision_flag(with_thread_flag(
             with_model_flags({{"batch", "sequences per step (default 16)"},
                               {"budget", "seconds of tuning at most (default 120); kernels not reached keep the defaults"},
                               {"device",
                                "cpu (default) or cuda (the matmul kernels' choices; sim is refused: the simulator's "
                                "times are not a GPU's)"},
                               {"list", "print the device's tuning files (yours and the one shipped with kiln) and exit"},
                               {"clear", "remove your tuning file for this device and exit"}},
                              true)))),
         "usage: kiln tune [model and config options] [--budget SECONDS] | --list | --clear\n\n"
         "Tunes the kernels of one training step (forward, backward, AdamW) on this device: each kernel's candidates\n"
         "are checked against kiln's default and timed; the fastest is kept in <cache dir>/tuning/<device>.json,\n"
         "which kiln train and kiln bench use (--tune cached, their default).",
         with_target_switches(with_model_switches({"list", "clear"})));
  if (a.help()) {
    a.print_help();
    return 0;
  }
  apply_thread_flag(a);
  apply_precision_flag(a);
  const DeviceSelection device = parse_device(a.str("device", "cpu"));
  if (device.simulated() && !a.has("list") && !a.has("clear"))
    throw Error("--device sim: the SIMT simulator's times are not a GPU's, so it cannot tune; tune on cpu or cuda");
  Engine::current().set_device(device.device, device.runtime);
  apply_target_flags(a);
  Target untuned = Engine::current().target();
  untuned.tuned = {};
  Engine::current().set_target(untuned);
  const std::string identity = device_identity(untuned, device.runtime);
  if (a.has("list")) return list_file(identity);
  if (a.has("clear")) {
    const std::string path = user_tuning_path(identity);
    std::error_code ec;
    const bool removed = !path.empty() && std::filesystem::remove(path, ec);
    std::printf("%s %s\n", removed ? "removed" : "nothing to remove at", path.empty() ? "(cache off)" : path.c_str());
    return 0;
  }
  const double budget = a.real("budget", 120.0, 0.0, 1e9);
  const int64_t batch = a.integer("batch", 16, 1);
  // A corrupt or foreign tuning file is refused now, not after the tuning.
  if (const std::string path = user_tuning_path(identity); !path.empty()) (void)read_tuning_file(path, identity);
  manual_seed(1);
  std::unique_ptr<models::CausalLM> model = model_from_flags(a, 0, 0.0);
  // kiln train's step with its defaults (trainer.cpp): AdamW's weight decay, beta2 and guard, the
  // gradient clipped, so that the kernels tuned are the ones training runs.
  const TrainOptions train;
  optim::AdamWOptions adamw;
  adamw.beta2 = train.beta2;
  adamw.weight_decay = train.weight_decay;
  adamw.skip_non_finite = true;
  optim::AdamW opt(model->parameters(), adamw);
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{batch, model->block_size()});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 7919) % model->vocab_size()));
  Tensor x = Tensor::from_host(ids), y = Tensor::from_host(ids);
  auto step = [&] {
    Tensor loss = model->loss(x, y);
    loss.backward();
    opt.step(train.grad_clip, loss);
    return std::vector<Tensor>{loss};
  };
  step()[0].item();
  const Circuit plan = Engine::current().last_plan()->program->circuit();  // a copy: the engine may drop its plan
  std::fprintf(stderr, "tuning the %zu ops of one step (target: %s), budget %.0f s\n", plan.ops().size(),
               untuned.str().c_str(), budget);
  TuneOptions options;
  options.budget_s = budget;
  options.runtime = device.runtime;
  options.progress = [](const std::string& line) { std::fprintf(stderr, "tune: %s\n", line.c_str()); };
  const TuneReport report = tune_kernels(plan, untuned, options);

  std::printf("%-72s %5s %10s %10s  %-26s %6s\n", "kernel (per step: all its ops)", "cands", "default ms",
              "chosen ms", "choice", "gain");
  int skipped = 0, dropped = 0;
  for (const KernelResult& r : report.kernels) {
    if (!r.skipped.empty()) {
      ++skipped;
      continue;
    }
    int verified = 0;
    for (const CandidateResult& c : r.candidates) verified += c.failure.empty();
    std::printf("%-72s %2d/%-2zu %10.3f %10.3f  %-26s %5.1f%%\n", shortened(r.kernel, 72).c_str(), verified,
                r.candidates.size(), r.default_ms, r.chosen_ms, r.chosen.str().c_str(),
                r.default_ms > 0 ? 100 * (1 - r.chosen_ms / r.default_ms) : 0.0);
    for (const CandidateResult& c : r.candidates)
      if (!c.failure.empty()) {
        ++dropped;
        std::printf("    dropped %s: %s\n", c.choice.str().c_str(), shortened(c.failure, 160).c_str());
      }
  }
  for (const KernelResult& r : report.kernels)
    if (!r.skipped.empty()) std::printf("not tuned: %s: %s\n", shortened(r.kernel, 72).c_str(), r.skipped.c_str());
  std::printf("%zu kernels in %.1f s, %d timing rounds (%d not tuned, %d candidates dropped as wrong)\n",
              report.kernels.size(), report.seconds, report.rounds, skipped, dropped);
  if (untuned.gpu())
    std::printf("matmul kernels per step, each alone: %.3f ms with kiln's defaults, %.3f ms with the choices\n",
                report.step_default_ms, report.step_tuned_ms);
  else if (report.step_default_ms > 0)  // 0: nothing was timed (no kernel had a candidate to time)
    std::printf("step: %.2f ms with kiln's defaults, %.2f ms with the choices: %.3fx (medians of 7, in turns)%s\n",
                report.step_default_ms, report.step_tuned_ms, report.step_tuned_ms / report.step_default_ms,
                report.kept ? "" : "; not 3% faster: kiln's defaults are kept for every kernel");
  if (const std::string path = record_tuning(identity, tuning_entries(report)); !path.empty())
    std::printf("choices written to %s\n", path.c_str());
  return 0;
}

}  // namespace kiln::cli
