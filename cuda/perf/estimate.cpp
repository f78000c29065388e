// The performance model's limits and its estimate (see estimate.hpp).
#include <algorithm>
#include <cctype>
#include <cmath>

#include <kiln/cuda/perf/estimate.hpp>

namespace kiln::perf {

const char* limit_name(Limit l) {
  switch (l) {
    case Limit::dram: return "dram";
    case Limit::l2: return "l2";
    case Limit::tensor: return "tensor";
    case Limit::fp32: return "fp32";
    case Limit::issue: return "issue";
    case Limit::shared: return "shared";
    case Limit::latency: return "latency";
    case Limit::launch: return "launch";
  }
  return "?";
}

namespace {

// The fractions of each limit kiln's kernels reach, the cycles an instruction of a thread's chain
// takes and the shortest kernel, fitted (scripts/perf_model_calibration.py --fit, 2026-12-06) to
// 15 products and attentions timed on H100s and H200s (docs/BENCHMARKS.md, "GPU performance
// model"). No figure there is bound by tensor cores, f32 units or shared memory in the model: those
// three fractions are guesses, not fitted. Order: dram, l2, tensor, fp32, issue, shared, latency
// (unused: kLatencyCycles), launch (unused: kLaunchSeconds).
constexpr std::array<double, kLimits> kReached{0.698, 0.969, 0.70, 0.525, 0.552, 1.0, 1.0, 1.0};
constexpr double kLatencyCycles = 3.34;
constexpr double kLaunchSeconds = 2.3e-6;

DeviceLimits hopper(const char* name, double dram_bytes_per_s) {
  DeviceLimits d;
  d.name = name;
  d.sms = 132;
  d.clock_hz = 1.98e9;
  d.dram_bytes_per_s = dram_bytes_per_s;
  d.l2_bytes_per_s = 5.5e12;
  d.bf16_tensor_flops = 989.4e12;
  d.tf32_tensor_flops = 494.7e12;
  d.fp32_flops = 66.9e12;
  d.shared_bytes_per_sm = 228 * 1024;
  d.launch_s = kLaunchSeconds;
  d.latency_cycles = kLatencyCycles;
  d.reached = kReached;
  return d;
}

}  // namespace

// NVIDIA's H100 SXM5 and H200 SXM data sheets: 132 SMs, 989.4 TFLOP/s dense bf16, 494.7 tf32,
// 66.9 f32; HBM3 at 3.35 TB/s, HBM3e at 4.8 TB/s.
const DeviceLimits& h100_sxm() {
  static const DeviceLimits d = hopper("H100 SXM", 3.35e12);
  return d;
}
const DeviceLimits& h200() {
  static const DeviceLimits d = hopper("H200", 4.8e12);
  return d;
}

std::optional<DeviceLimits> device_limits(const std::string& name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "h100") return h100_sxm();
  if (n == "h200") return h200();
  return std::nullopt;
}

int blocks_per_sm(const KernelWork& w, const DeviceLimits& d) {
  const int64_t warps = (w.threads + 31) / 32;
  const int64_t per_warp = (std::max(w.registers > 0 ? w.registers : 32, 1) * 32 + 255) / 256 * 256;
  int64_t n = std::min<int64_t>(d.blocks_per_sm, d.threads_per_sm / std::max<int64_t>(warps * 32, 1));
  n = std::min<int64_t>(n, d.registers_per_sm / std::max<int64_t>(warps * per_warp, 1));
  if (w.shared_bytes > 0) n = std::min<int64_t>(n, d.shared_bytes_per_sm / (w.shared_bytes + 1024));
  return static_cast<int>(std::max<int64_t>(n, 1));
}

KernelEstimate estimate(const KernelWork& w, const DeviceLimits& d) {
  KernelEstimate e;
  e.blocks_per_sm = blocks_per_sm(w, d);
  const double blocks = static_cast<double>(std::max<uint64_t>(w.blocks, 1));
  const double wave = static_cast<double>(d.sms) * e.blocks_per_sm;
  e.waves = std::ceil(blocks / wave);
  // The busiest SM's share of work X: the blocks it runs (as slots free up, ceil(blocks / SMs)),
  // X / blocks each, at the SM's rate however many of them are resident at once.
  const double busiest = std::ceil(blocks / d.sms);
  auto per_sm = [&](double x, double rate_per_sm) { return busiest * (x / blocks) / rate_per_sm; };
  auto& b = e.raw_s;
  // DRAM moves the op's inputs and outputs once at most where the threads touch all of them, and
  // at most what they touch where they do not (a gather reads a few elements of its table).
  b[static_cast<int>(Limit::dram)] = std::min(w.compulsory_bytes, w.global_bytes) / d.dram_bytes_per_s;
  b[static_cast<int>(Limit::l2)] = w.global_bytes / d.l2_bytes_per_s;
  b[static_cast<int>(Limit::tensor)] = per_sm(w.tensor_flops, d.bf16_tensor_flops / d.sms) +
                                       per_sm(w.tf32_tensor_flops, d.tf32_tensor_flops / d.sms);
  b[static_cast<int>(Limit::fp32)] = per_sm(w.fp32_flops, d.fp32_flops / d.sms);
  b[static_cast<int>(Limit::issue)] = per_sm(w.instructions / 32, 4 * d.clock_hz);
  b[static_cast<int>(Limit::shared)] = per_sm(w.shared_wavefronts, d.clock_hz);
  const double chain = w.instructions / blocks / std::max<uint32_t>(w.threads, 1);  // a thread's
  b[static_cast<int>(Limit::latency)] = e.waves * chain * d.latency_cycles / d.clock_hz;
  b[static_cast<int>(Limit::launch)] = d.launch_s;
  for (int l = 0; l < kLimits; ++l) {
    e.bound_s[l] = b[l] / d.reached[l];
    if (e.bound_s[l] > e.seconds) {
      e.seconds = e.bound_s[l];
      e.binding = static_cast<Limit>(l);
    }
  }
  return e;
}

}  // namespace kiln::perf
