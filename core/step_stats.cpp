// Step statistics (see step_stats.hpp).
#include <spdlog/fmt/fmt.h>

#include <kiln/circuit/exec/liveness.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/step_stats.hpp>
#include <kiln/cuda/lower/lower.hpp>

namespace kiln {

namespace {

size_t bytes_of(const ValueInfo& v) { return static_cast<size_t>(v.shape.numel()) * dtype_size(v.dtype); }

}  // namespace

StepStats measure_step(const Plan& plan) {
  StepStats s;
  const Circuit& c = plan.program->circuit();
  for (ValueId x : c.externals())
    (c.value(x).role == ValueRole::Persistent ? s.persistent_bytes : s.input_bytes) += bytes_of(c.info(x));
  // Working ops and their launches (aliases launch nothing and do no work).
  std::vector<int> alias_input(c.ops().size(), -1);
  s.lowered = true;
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    alias_input[i] = cuda::alias_input(op.prim->id);
    if (alias_input[i] >= 0) continue;
    ++s.ops[static_cast<size_t>(op.phase)];
    for (ValueId in : op.inputs) s.bytes_read += static_cast<double>(bytes_of(c.info(in)));
    for (ValueId out : op.outputs) s.bytes_written += static_cast<double>(bytes_of(c.info(out)));
    if (!s.lowered) continue;
    try {
      // Lowered for the plan's Target (a CPU plan's: its choices, lowered as a GPU would lower them).
      s.launches[static_cast<size_t>(op.phase)] += cuda::lower(c, static_cast<int>(i), plan.target).launches.size();
    } catch (const Error&) {
      s.lowered = false;  // a dtype the GPU does not run
    }
  }
  // Peak of live intermediates, with buffers allocated when their op runs and freed as the
  // device program frees them.
  const Liveness live = buffer_liveness(c, plan.program->outputs(), alias_input);
  size_t now = 0;
  for (size_t i = 0; i < c.ops().size(); ++i) {
    if (alias_input[i] < 0)
      for (ValueId out : c.ops()[i].outputs) now += bytes_of(c.info(out));
    s.peak_intermediate_bytes = std::max(s.peak_intermediate_bytes, now);
    for (ValueId v : live.free_after[i]) now -= bytes_of(c.info(v));
  }
  return s;
}

std::string StepStats::summary() const {
  auto mb = [](double b) { return b / (1024.0 * 1024.0); };
  std::string kernels = lowered ? fmt::format("GPU kernels {}/{}/{}", launches[0], launches[1], launches[2])
                                : std::string("GPU kernels n/a (dtype)");
  return fmt::format(
      "ops forward/backward/update {}/{}/{} ({}); read {:.1f} MiB, written {:.1f} MiB; peak intermediates {:.2f} "
      "MiB (+ {:.2f} MiB parameters and state, {:.2f} MiB inputs)",
      ops[0], ops[1], ops[2], kernels, mb(bytes_read), mb(bytes_written),
      mb(static_cast<double>(peak_intermediate_bytes)), mb(static_cast<double>(persistent_bytes)),
      mb(static_cast<double>(input_bytes)));
}

}  // namespace kiln
