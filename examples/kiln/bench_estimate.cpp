// kiln bench's --estimate (bench_estimate.hpp).
#include "bench_estimate.hpp"

#include <spdlog/fmt/fmt.h>

#include <cstdio>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/traced_step.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/perf/kernel_work.hpp>

#include "commands.hpp"

namespace kiln::cli {

std::optional<EstimateRequest> estimate_flags(const Args& a, const DeviceSelection& device) {
  if (!a.has("estimate")) return std::nullopt;
  const std::string name = a.str("estimate", "");
  std::optional<perf::DeviceLimits> limits = perf::device_limits(name);
  if (!limits) throw Error("kiln bench: --estimate takes h100 or h200, received '" + name + "'");
  if (!device.simulated())
    throw Error("kiln bench: --estimate runs the step on the simulator: add --device sim");
  EstimateRequest r{*limits, a.integer("sample-blocks", 8, 1), target_from_flags(a, cuda_target(90, /*fake=*/false))};
  // The kernels the real device would get: sm_90's defaults (wgmma), the flags given on top.
  r.target.matmul.wgmma = r.target.wgmma();
  Engine::current().set_target(r.target);
  return r;
}

double print_estimate(TracedStep& step, const std::vector<HostTensor>& inputs, const EstimateRequest& r,
                      const std::string& what) {
  step.run(inputs);
  const auto counted = cuda::fake_driver_kernel_stats();
  const Plan* plan = Engine::current().last_plan();
  if (!plan || !plan->device) throw Error("kiln bench --estimate: the step made no GPU plan");
  const std::vector<perf::KernelRowEstimate> rows = perf::estimate_program(*plan->device, counted, r.limits, 90);
  double total = 0;
  for (const auto& row : rows) total += row.estimate.seconds * static_cast<double>(row.launches);
  std::printf("estimate on %s, %s: %.2f us (%zu kernels, %lld blocks sampled a launch)\n", r.limits.name.c_str(),
              what.c_str(), total * 1e6, rows.size(), static_cast<long long>(r.sample_blocks));
  // The model's calibration, for scripts/perf_model_calibration.py.
  std::string reached = "  model: reached";
  for (int l = 0; l < perf::kLimits; ++l)
    reached += fmt::format(" {}={:.4g}", perf::limit_name(static_cast<perf::Limit>(l)), r.limits.reached[l]);
  std::printf("%s; latency_cycles=%.4g launch_us=%.4g\n", reached.c_str(), r.limits.latency_cycles,
              r.limits.launch_s * 1e6);
  for (const auto& row : rows) {
    std::printf("  %-48s %3lld x %9.2f us  %-7s (grid %llu, %u threads, %d registers, %lld blocks an SM)\n",
                row.kernel.c_str(), static_cast<long long>(row.launches), row.estimate.seconds * 1e6,
                perf::limit_name(row.estimate.binding), static_cast<unsigned long long>(row.work.blocks),
                row.work.threads, row.work.registers, static_cast<long long>(row.estimate.blocks_per_sm));
    // Each limit's time at the whole of it, for refitting the reached fractions
    // (scripts/perf_model_calibration.py reads these lines).
    std::string raw = "    raw us:";
    for (int l = 0; l < perf::kLimits; ++l)
      raw += fmt::format(" {}={:.4g}", perf::limit_name(static_cast<perf::Limit>(l)), row.estimate.raw_s[l] * 1e6);
    std::printf("%s\n", raw.c_str());
  }
  return total;
}

}  // namespace kiln::cli
