// The autotuner: the device identity, candidates per kernel, verification against the default and
// timing in turns. The tuning cache file (paths, format, reading and writing) is in tuning_file.cpp.
#include <omp.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/exec/thread_governor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/cpu_gemm.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/onednn_matmul.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/core/tuning.hpp>
#include <kiln/cuda/runtime/device_program.hpp>
#include <kiln/cuda/runtime/runtime.hpp>
#include <kiln/version.hpp>

namespace kiln {

TuneMode parse_tune_mode(std::string_view text) {
  if (text == "off") return TuneMode::off;
  if (text == "cached") return TuneMode::cached;
  if (text == "on") return TuneMode::on;
  throw Error("--tune: expected off, cached or on, received '" + std::string(text) + "'");
}

const char* tune_mode_name(TuneMode m) { return m == TuneMode::off ? "off" : m == TuneMode::on ? "on" : "cached"; }

namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) break;
      std::string name = line.substr(colon + 1);
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      return name;
    }
  return "unknown CPU";
}

}  // namespace

std::string device_identity(const Target& t, const cuda::Runtime* rt) {
  if (t.gpu()) {
    if (!rt) throw Error("tuning: a GPU's identity comes from its runtime, and none was given");
    // The matmul path is part of it: keys tuned for wgmma mean other kernels on mma.sync or tf32.
    return "gpu " + rt->device_name() + " sm_" + std::to_string(rt->sm()) + " driver " +
           std::to_string(rt->driver_version()) + (rt->fake() ? " simulated" : "") +
           (t.wgmma() ? " wgmma" : " mma.sync") + (t.tf32 ? " tf32" : "");
  }
  // The GEMM library kiln was built with too: a build without oneDNN has no gemm=onednn.
  std::string id = std::string("cpu ") + cpu_model_name() + " " + cpu_gemm_library();
  for (auto [on, name] : {std::pair{t.cpu.avx2, "avx2"},
                          {t.cpu.fma, "fma"},
                          {t.cpu.avx512f, "avx512f"},
                          {t.cpu.avx512_bf16, "avx512_bf16"},
                          {t.cpu.amx_bf16, "amx_bf16"}})
    if (on) id += std::string(" ") + name;
  return id;
}

std::vector<KernelChoice> cpu_candidates(const Circuit& c, const Op& op, int team) {
  std::vector<KernelChoice> base{KernelChoice{}};
  if (op.is(PrimId::matmul) && c.info(op.inputs[0]).dtype == DType::f32) {
    for (const auto gemm : {KernelChoice::Gemm::eigen, KernelChoice::Gemm::onednn})
      if (gemm != KernelChoice::Gemm::onednn || OneDnnMatmul::available(DType::f32)) {
        KernelChoice k;
        k.gemm = gemm;
        base.push_back(k);
      }
  } else if ((op.is(PrimId::attention) || op.is(PrimId::attention_grad)) && AttentionParams::of(op).causal) {
    for (int rows : {16, 64, 128}) {
      KernelChoice k;
      k.attention_rows = rows;
      base.push_back(k);
    }
  } else if (op.is(PrimId::fused_rows)) {
    const int64_t n = RowProgram::from_params(op.params).n();
    const int64_t most = n > 0 && n <= 2048 ? 2048 / n : 0;  // the rows a block holds (row_chunks.hpp)
    for (int64_t rows = most / 2; rows >= 1 && rows >= most / 8; rows /= 2) {
      KernelChoice k;
      k.row_chunk = static_cast<int>(rows);
      base.push_back(k);
    }
  }
  std::vector<KernelChoice> out = base;
  if (team > 1)
    for (const KernelChoice& b : base) {
      KernelChoice k = b;
      k.threads = 1;
      out.push_back(k);
    }
  return out;
}

std::vector<KernelChoice> gpu_candidates(const Circuit& c, const Op& op, const Target& t) {
  std::vector<KernelChoice> out{KernelChoice{}};
  if (!op.is(PrimId::matmul) && !op.is(PrimId::fused_matmul)) return out;
  std::vector<std::string> keys;
  if (c.info(op.inputs[0]).dtype == DType::bf16 && t.matmul.bf16_mma) {
    keys = {"tile=128x128", "tile=128x256", "stages=2", "stages=3", "stages=4"};
    if (t.wgmma())
      for (const char* k : {"tile=192x256", "split-k=0", "split-k=2", "staged-stores=odd", "staged-stores=all",
                            "products-first=on", "tensor-copies=on"})
        keys.push_back(k);
  } else {
    keys = {"simt-tile=64", "simt-tile=128"};
  }
  for (const std::string& k : keys) {
    KernelChoice choice;
    choice.matmul = k;
    out.push_back(choice);
  }
  return out;
}

namespace {

// Inputs for a kernel run alone: floats in [0.1, 1) (positive, so that logs, square roots and
// sums of them are well conditioned), integers 0 (a valid index).
HostTensor made_up_input(const ValueInfo& info, uint64_t seed) {
  HostTensor t = HostTensor::zeros(info.dtype, info.shape);
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return 0.1 + 0.9 * static_cast<double>(x >> 11) / 9007199254740992.0;
  };
  if (info.dtype == DType::f32) {  // the common case, written directly (a step's inputs are megabytes)
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(next());
  } else if (info.dtype != DType::i32) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, next());
  }
  return t;
}

// The tolerance of a changed summation order for an output of `dtype` (the reference tests').
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 1e-5;
    case DType::bf16:
    case DType::f16: return 1e-2;
    default: return 0;
  }
}

// The outputs every candidate of a kernel is checked against (the default's on the CPU, Eigen's
// on the GPU), with each output's root mean square over its finite elements.
struct Reference {
  std::vector<HostTensor> outputs;
  std::vector<double> rms;
  explicit Reference(const std::vector<HostTensor>& got) {
    for (const HostTensor& g : got) {
      outputs.push_back(g.clone());
      double squares = 0;
      int64_t finite = 0;
      for (int64_t i = 0; i < g.numel(); ++i)
        if (const double x = g.get(i); std::isfinite(x)) {
          squares += x * x;
          ++finite;
        }
      rms.push_back(finite ? std::sqrt(squares / static_cast<double>(finite)) : 0);
    }
  }
};

// Empty where `got` matches the reference element for element within tolerance; else what
// differs. A changed summation order moves an element by about eps times the magnitude of its
// terms, which an output's root mean square stands for where the element itself is small
// (cancellation, as in a normalization's gradient): the bound is tol * (|element| + rms of the
// output). `f32_tol` > 0 replaces f32's tolerance (tf32 products round their operands to 10 bits).
std::string compare(const Reference& ref, const std::vector<HostTensor>& got, double f32_tol = 0) {
  if (got.size() != ref.outputs.size())
    return fmt::format("{} outputs where the reference has {}", got.size(), ref.outputs.size());
  for (size_t k = 0; k < ref.outputs.size(); ++k) {
    const HostTensor &w = ref.outputs[k], &g = got[k];
    const double rms = ref.rms[k];
    if (g.dtype() != w.dtype() || g.shape() != w.shape())
      return fmt::format("output {}: {}{} where the default gives {}{}", k, dtype_name(g.dtype()), g.shape().str(),
                         dtype_name(w.dtype()), w.shape().str());
    const double tol = w.dtype() == DType::f32 && f32_tol > 0 ? f32_tol : tolerance(w.dtype());
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double a = w.get(i), b = g.get(i);
      if ((std::isnan(a) && std::isnan(b)) || a == b) continue;
      if (!(std::abs(a - b) <= tol * (std::abs(a) + rms)))
        return fmt::format("output {} element {}: {} where the default gives {} (tolerance {:g} x (|{}| + rms {:g}))",
                           k, i, b, a, tol, a, rms);
    }
  }
  return "";
}

// The kernel's choice: the fastest verified candidate ahead of the default by kMinGain, else the
// default (candidates[0]); times per step.
void choose(KernelResult& r) {
  r.default_ms = r.chosen_ms = r.candidates[0].ms;
  r.chosen = KernelChoice{};
  for (const CandidateResult& c : r.candidates)
    if (c.failure.empty() && c.ms < r.chosen_ms && c.ms < r.default_ms * (1 - kMinGain)) {
      r.chosen = c.choice;
      r.chosen_ms = c.ms;
    }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One kernel run alone on made-up inputs: a circuit of its op, a Program per candidate.
struct Kernel {
  std::string signature;
  Circuit circuit;
  std::vector<ValueId> outputs;
  std::vector<HostTensor> bindings;

  Kernel(const Circuit& c, const Op& op, std::string sig) : signature(std::move(sig)) {
    std::vector<ValueId> inputs;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const ValueInfo& info = c.info(op.inputs[i]);
      inputs.push_back(circuit.add_external(info, ValueRole::Input));
      bindings.push_back(made_up_input(info, i + 1));
    }
    outputs = circuit.add_op(op.prim->name, op.params, inputs);
  }
  std::vector<HostTensor> run(const Target& plan_target, const KernelChoice& choice) const {
    Target t = plan_target;
    t.tuned = KernelChoices({{signature, choice}});
    Program p(circuit, outputs, t);
    p.set_adaptive_threads(false);
    return p.run(bindings);
  }
};

// Holds the team size fixed while tuning, then restores the caller's setting.
struct FixedTeam {
  int saved = fixed_num_threads();
  explicit FixedTeam(int team) { set_num_threads(team); }
  ~FixedTeam() { set_num_threads(saved); }
};

bool tunable(const Op& op) {
  return !op.prim->side_effect && op.prim->output_aliases < 0 && !op.inputs.empty() && !is_collective(op);
}

// The plan as a Program that times its ops, on made-up bindings.
struct WholeStep {
  std::unique_ptr<Program> program;
  explicit WholeStep(const Circuit& c, const std::vector<ValueId>& outputs, const Target& t)
      : program(std::make_unique<Program>(c, outputs, t)) {
    program->set_adaptive_threads(false);
    program->set_record_op_times(true);
  }
};

// The GPU's tuner: each matmul kernel alone on the runtime, every candidate checked against
// Eigen's result of the kernel (the CPU executor), then timed by the device in turns.
TuneReport tune_gpu_kernels(const Circuit& optimized, const Target& target, const TuneOptions& options,
                            const KernelChoices& known) {
  if (!options.runtime) throw Error("kiln tune: a GPU Target's kernels are tuned on its runtime, and none was given");
  cuda::Runtime& rt = *options.runtime;
  if (rt.fake() && !options.clock)
    throw Error(
        "kiln tune: the fake driver runs kernels in the SIMT simulator, whose times are not a GPU's; tune on a GPU");
  const auto started = std::chrono::steady_clock::now();
  auto elapsed_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
  TuneReport report;
  std::map<std::string, size_t> index;
  std::vector<size_t> first_op;
  for (size_t i = 0; i < optimized.ops().size(); ++i) {
    const Op& op = optimized.ops()[i];
    if (!tunable(op) || gpu_candidates(optimized, op, target).size() < 2) continue;
    std::string sig = kernel_signature(optimized, op);
    if (known.find(sig)) continue;
    auto [it, fresh] = index.emplace(sig, report.kernels.size());
    if (fresh) {
      report.kernels.push_back({});
      report.kernels.back().kernel = sig;
      first_op.push_back(i);
    }
    ++report.kernels[it->second].occurrences;
  }
  const int rounds = std::max(1, options.gpu_rounds);
  for (size_t k = 0; k < report.kernels.size(); ++k) {
    KernelResult& r = report.kernels[k];
    if (options.progress) options.progress(fmt::format("[{}/{}] {:.60}", k + 1, report.kernels.size(), r.kernel));
    if (elapsed_s() > options.budget_s) {
      r.skipped = fmt::format("budget of {:.0f} s spent", options.budget_s);
      continue;
    }
    const Op& op = optimized.ops()[first_op[k]];
    const Kernel alone(optimized, op, r.kernel);
    std::unique_ptr<Reference> want;
    try {
      want = std::make_unique<Reference>(alone.run(cpu_target(), {}));
    } catch (const Error& e) {
      r.skipped = std::string("no Eigen reference: ") + e.what();
      continue;
    }
    std::vector<std::unique_ptr<cuda::DeviceProgram>> programs;
    std::vector<std::vector<double>> ms;
    for (const KernelChoice& choice : gpu_candidates(optimized, op, target)) {
      CandidateResult c{choice, 0, ""};
      if (!programs.empty() && elapsed_s() > options.budget_s) {  // the default at least
        c.failure = fmt::format("not run: the budget of {:.0f} s was spent", options.budget_s);
        r.candidates.push_back(c);
        programs.emplace_back();
        ms.emplace_back();
        continue;
      }
      Target t = target;
      t.tuned = KernelChoices({{r.kernel, choice}});
      std::unique_ptr<cuda::DeviceProgram> dp;
      try {
        dp = std::make_unique<cuda::DeviceProgram>(alone.circuit, alone.outputs, rt, t);
        c.failure = compare(*want, dp->run(alone.bindings), target.tf32 ? 1e-2 : 0);
      } catch (const Error& e) {
        c.failure = e.what();
      }
      if (!c.failure.empty()) dp.reset();
      r.candidates.push_back(c);
      programs.push_back(std::move(dp));
      ms.emplace_back();
    }
    if (!programs[0]) {
      r.skipped = "the default failed: " + r.candidates[0].failure;
      continue;
    }
    for (int round = 0; round < rounds; ++round)
      for (size_t j = 0; j < programs.size(); ++j)
        if (programs[j]) {
          programs[j]->run(alone.bindings);
          const double measured = programs[j]->last_run().device_ms;
          ms[j].push_back(options.clock ? options.clock(r.kernel, r.candidates[j].choice, measured) : measured);
        }
    for (size_t j = 0; j < programs.size(); ++j)
      if (programs[j]) r.candidates[j].ms = median(ms[j]) * r.occurrences;
    choose(r);
    report.step_default_ms += r.default_ms;
    report.step_tuned_ms += r.chosen_ms;
  }
  report.rounds = rounds;
  report.kept = true;  // per kernel: a GPU kernel alone reads and writes device memory as in the step
  std::stable_sort(report.kernels.begin(), report.kernels.end(),
                   [](const KernelResult& a, const KernelResult& b) { return a.default_ms > b.default_ms; });
  report.seconds = elapsed_s();
  return report;
}

}  // namespace

TuneReport tune_kernels(const Circuit& optimized, const Target& target, const TuneOptions& options,
                        const KernelChoices& known) {
  if (target.gpu()) return tune_gpu_kernels(optimized, target, options, known);
  const auto started = std::chrono::steady_clock::now();
  auto elapsed_ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  };
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  const int team = options.team > 0          ? options.team
                   : fixed_num_threads() > 0 ? fixed_num_threads()
                                             : omp_get_max_threads();
  FixedTeam fixed(team);
  const auto& ops = optimized.ops();

  // Distinct kernels, the ops of each, and their verified candidates.
  TuneReport report;
  std::vector<std::vector<size_t>> kernel_ops;
  std::vector<std::string> op_kernel(ops.size());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!tunable(ops[i])) continue;
    std::string sig = kernel_signature(optimized, ops[i]);
    if (known.find(sig)) continue;
    op_kernel[i] = sig;
    auto [it, fresh] = index.emplace(sig, report.kernels.size());
    if (fresh) {
      report.kernels.push_back({});
      report.kernels.back().kernel = sig;
      kernel_ops.emplace_back();
    }
    kernel_ops[it->second].push_back(i);
    ++report.kernels[it->second].occurrences;
  }
  say(fmt::format("checking the candidates of {} kernels against the defaults", report.kernels.size()));
  std::vector<std::vector<KernelChoice>> verified(report.kernels.size());
  size_t most = 1;  // candidates of the kernel with the most
  for (size_t k = 0; k < report.kernels.size(); ++k) {
    KernelResult& r = report.kernels[k];
    const Op& op = ops[kernel_ops[k][0]];
    const Kernel alone(optimized, op, r.kernel);
    std::unique_ptr<Reference> want;  // the default's outputs
    for (const KernelChoice& choice : cpu_candidates(optimized, op, team)) {
      CandidateResult c{choice, 0, ""};
      try {
        std::vector<HostTensor> got = alone.run(target, choice);
        if (!want)
          want = std::make_unique<Reference>(got);
        else
          c.failure = compare(*want, got);
      } catch (const Error& e) {
        c.failure = e.what();
      }
      if (r.candidates.empty() && !c.failure.empty()) {
        r.skipped = "not runnable alone: " + c.failure;
        break;
      }
      if (c.failure.empty()) verified[k].push_back(choice);
      r.candidates.push_back(c);
    }
    if (!r.skipped.empty()) verified[k].clear();
    most = std::max(most, verified[k].size());
  }
  if (most < 2) {  // nothing to choose between (no kernels, or none with a verified candidate)
    for (KernelResult& r : report.kernels)
      if (r.skipped.empty()) r.skipped = "no candidate but the default ran alone";
    report.seconds = elapsed_ms() / 1000;
    return report;
  }

  // Program j runs the j-th verified candidate of every kernel that has one (the default elsewhere).
  std::vector<WholeStep> steps;
  auto choices_at = [&](size_t j) {
    KernelChoices::Map m;
    for (size_t k = 0; k < report.kernels.size(); ++k)
      if (j < verified[k].size()) m[report.kernels[k].kernel] = verified[k][j];
    Target t = target;
    KernelChoices::Map all = known.entries();
    for (auto& [kernel, choice] : m) all[kernel] = choice;
    t.tuned = KernelChoices(std::move(all));
    return t;
  };
  std::vector<HostTensor> bindings;
  for (size_t e = 0; e < optimized.externals().size(); ++e)
    bindings.push_back(made_up_input(optimized.info(optimized.externals()[e]), 101 + e));
  std::vector<ValueId> no_outputs;
  for (size_t j = 0; j < most; ++j) {
    steps.emplace_back(optimized, no_outputs, choices_at(j));
    steps.back().program->run(bindings);  // first run: constants, compiled forms, scratch
  }
  // Times one run of a step; with an injected clock, the sum of its ops' given times.
  auto run_step = [&](const Program& p, size_t j, std::vector<std::vector<double>>* per_kernel) {
    const auto t0 = std::chrono::steady_clock::now();
    p.run(bindings);
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const std::vector<double>& op_ms = p.last_op_ms();
    double given = 0;
    std::vector<double> kernel_ms(report.kernels.size(), 0.0);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (op_kernel[i].empty()) {
        given += op_ms[i];
        continue;
      }
      const size_t k = index[op_kernel[i]];
      const KernelChoice& choice = j < verified[k].size() ? verified[k][j]
                                   : verified[k].empty()  ? KernelChoice{}
                                                          : verified[k][0];
      const double ms = options.clock ? options.clock(op_kernel[i], choice, op_ms[i]) : op_ms[i];
      kernel_ms[k] += ms;
      given += ms;
    }
    if (per_kernel)
      for (size_t k = 0; k < kernel_ms.size(); ++k)
        if (j < verified[k].size()) (*per_kernel)[k].push_back(kernel_ms[k]);
    return options.clock ? given : wall;
  };
  // Rounds while the budget lasts (3 at least, 31 at most), each running every Program once,
  // keeping back the time of the check at the end (2 x 7 steps).
  say(fmt::format("timing {} candidate steps in rounds, {:.0f} s of the budget spent on checks", most,
                  elapsed_ms() / 1000));
  // samples[j][k]: kernel k's time per step under its j-th candidate, one per round.
  std::vector<std::vector<std::vector<double>>> samples(most, std::vector<std::vector<double>>(report.kernels.size()));
  double round_ms = 0;
  while (report.rounds < 31) {
    const double left_ms = options.budget_s * 1000 - elapsed_ms() - 14 * round_ms / static_cast<double>(most);
    if (report.rounds >= 3 && left_ms < round_ms) break;
    const double t0 = elapsed_ms();
    for (size_t j = 0; j < most; ++j) run_step(*steps[j].program, j, &samples[j]);
    round_ms = elapsed_ms() - t0;
    say(fmt::format("round {} ({:.0f} s)", ++report.rounds, elapsed_ms() / 1000));
  }
  KernelChoices::Map chosen = known.entries();
  for (size_t k = 0; k < report.kernels.size(); ++k) {
    KernelResult& r = report.kernels[k];
    if (!r.skipped.empty()) continue;
    for (size_t j = 0; j < verified[k].size(); ++j)
      for (CandidateResult& c : r.candidates)
        if (c.failure.empty() && c.choice == verified[k][j]) c.ms = median(samples[j][k]);
    choose(r);
    chosen[r.kernel] = r.chosen;
  }
  // The whole step with and without the choices, in turns.
  Target with = target;
  with.tuned = KernelChoices(std::move(chosen));
  WholeStep tuned(optimized, no_outputs, with);
  tuned.program->run(bindings);
  std::vector<double> off, on;
  for (int turn = 0; turn < 7; ++turn) {
    off.push_back(run_step(*steps[0].program, 0, nullptr));
    // The tuned step's ops under their choices: run_step's index is the default's (0), so the
    // injected clock is asked with each kernel's chosen choice instead.
    const auto t0 = std::chrono::steady_clock::now();
    tuned.program->run(bindings);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (options.clock) {
      ms = 0;
      for (size_t i = 0; i < ops.size(); ++i)
        ms += op_kernel[i].empty() ? tuned.program->last_op_ms()[i]
                                   : options.clock(op_kernel[i], report.kernels[index[op_kernel[i]]].chosen,
                                                   tuned.program->last_op_ms()[i]);
    }
    on.push_back(ms);
  }
  report.step_default_ms = median(off);
  report.step_tuned_ms = median(on);
  report.kept = report.step_tuned_ms < report.step_default_ms * (1 - kMinGain);
  std::stable_sort(report.kernels.begin(), report.kernels.end(),
                   [](const KernelResult& a, const KernelResult& b) { return a.default_ms > b.default_ms; });
  report.seconds = elapsed_ms() / 1000;
  return report;
}

std::vector<TuningEntry> tuning_entries(const TuneReport& report) {
  std::vector<TuningEntry> out;
  for (const KernelResult& r : report.kernels) {
    if (!r.skipped.empty()) continue;
    int verified = 0;
    for (const CandidateResult& c : r.candidates) verified += c.failure.empty();
    if (report.kept)
      out.push_back({version_string, r.kernel, r.chosen, r.default_ms, r.chosen_ms, verified});
    else
      out.push_back({version_string, r.kernel, KernelChoice{}, r.default_ms, r.default_ms, verified});
  }
  return out;
}

Target tune_missing_kernels(const Circuit& recorded, const std::vector<ValueId>& requested, const Target& target,
                            const PipelineOptions& pipeline) {
  std::vector<ValueId> outputs = requested;
  const Circuit optimized = optimize(recorded, outputs, target, pipeline);
  const std::string device = device_identity(target), path = user_tuning_path(device);
  KernelChoices::Map known = path.empty() ? KernelChoices::Map{} : read_tuning_file(path, device).choices().entries();
  for (const auto& [kernel, choice] : target.tuned.entries()) known[kernel] = choice;
  TuneOptions options;
  options.progress = [](const std::string& line) { spdlog::debug("tuning: {}", line); };
  spdlog::info("tuning the first step's kernels (--tune on; at most {:.0f} s)", options.budget_s);
  const auto t0 = std::chrono::steady_clock::now();
  const TuneReport report = tune_kernels(optimized, target, options, KernelChoices(known));
  const std::vector<TuningEntry> entries = tuning_entries(report);
  for (const TuningEntry& e : entries) known[e.kernel] = e.choice;
  if (!entries.empty()) {
    record_tuning(device, entries);
    spdlog::info("tuned {} kernels in {:.1f} s (--tune on): step {:.2f} -> {:.2f} ms, {}{}", entries.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), report.step_default_ms,
                 report.step_tuned_ms, report.kept ? "choices kept" : "not 3% faster: the defaults kept",
                 path.empty() ? std::string("; the cache is off, so nothing was written") : "; choices in " + path);
  }
  Target tuned = target;
  tuned.tuned = without_overridden(KernelChoices(std::move(known)), fixed_num_threads() > 0);
  return tuned;
}

}  // namespace kiln
