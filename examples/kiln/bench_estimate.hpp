// `kiln bench --device sim --estimate DEVICE`: instead of timing a step on the simulator (whose
// times mean nothing), run it once with blocks sampled and print each of its kernels' estimated
// time on DEVICE (cuda/perf/estimate.hpp) and the step's total. The step is planned as that
// device would plan it (sm_90, wgmma), whatever the fake driver reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <kiln/circuit/ir/target.hpp>
#include <kiln/core/device.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/perf/estimate.hpp>

#include "args.hpp"

namespace kiln {
class TracedStep;
class HostTensor;
}  // namespace kiln

namespace kiln::cli {

struct EstimateRequest {
  perf::DeviceLimits limits;
  int64_t sample_blocks = 8;
  Target target;  // the real device's (sm_90, wgmma), the flags given on top
};

// --estimate h100|h200 and --sample-blocks N, refused without --device sim; nullopt without
// --estimate. Sets the engine's target to the real device's (call after apply_target_flags; set
// it again after Engine::set_device, which takes the fake device's).
std::optional<EstimateRequest> estimate_flags(const Args& a, const DeviceSelection& device);

// While alive (with a request), every launch on the fake driver runs r.sample_blocks blocks and
// counts its work: made before the step is recorded, whose recording runs it too.
class SampledBlocks {
 public:
  explicit SampledBlocks(const std::optional<EstimateRequest>& r) : scoped_(r ? static_cast<uint64_t>(r->sample_blocks) : 0) {}

 private:
  cuda::ScopedSampledBlocks scoped_;
};

// Runs `step` once more (inputs `inputs`) under SampledBlocks and prints "estimate on DEVICE,
// WHAT: T us" and a line per kernel; returns the step's estimated seconds.
double print_estimate(TracedStep& step, const std::vector<HostTensor>& inputs, const EstimateRequest& r,
                      const std::string& what);

}  // namespace kiln::cli
