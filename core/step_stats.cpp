// Step statistics (see step_stats.hpp).
#include "core/step_stats.hpp"

#include <spdlog/fmt/fmt.h>

#include "circuit/error.hpp"
#include "cuda/lower.hpp"

namespace kiln {

namespace {

size_t bytes_of(const ValueInfo& v) { return static_cast<size_t>(v.shape.numel()) * dtype_size(v.dtype); }

}  // namespace

StepStats measure_step(const Plan& plan) {
  StepStats s;
  const Circuit& c = plan.program->circuit();
  for (ValueId x : c.externals())
    (c.value(x).role == ValueRole::Persistent ? s.persistent_bytes : s.input_bytes) += bytes_of(c.info(x));
  // Working ops and aliases: lowering says which ops alias an input (reshape, stop_gradient,
  // assign) and how many kernels the others launch.
  std::vector<int> alias_of(c.ops().size(), -1);
  s.lowered = true;
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    try {
      cuda::LoweredOp l = cuda::lower(c, static_cast<int>(i));
      alias_of[i] = l.alias_of;
      s.launches[static_cast<size_t>(op.phase)] += l.launches.size();
    } catch (const Error&) {
      s.lowered = false;
      if (op.prim->name == "reshape" || op.prim->name == "stop_gradient") alias_of[i] = 0;
      if (op.prim->side_effect) alias_of[i] = 1;
    }
    if (alias_of[i] >= 0) continue;
    ++s.ops[static_cast<size_t>(op.phase)];
    for (ValueId in : op.inputs) s.bytes_read += static_cast<double>(bytes_of(c.info(in)));
    for (ValueId out : op.outputs) s.bytes_written += static_cast<double>(bytes_of(c.info(out)));
  }
  // Peak of live intermediates: an op's outputs are allocated when it runs (aliases share their
  // source's storage) and freed after the last op that reads them (or their aliases); values the
  // step returns live to the end.
  std::vector<ValueId> root(c.num_values());
  for (size_t v = 0; v < root.size(); ++v) root[v] = static_cast<ValueId>(v);
  std::vector<int64_t> last_use(c.num_values(), -1);
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    if (alias_of[i] >= 0)
      root[static_cast<size_t>(op.outputs[0])] = root[static_cast<size_t>(op.inputs[static_cast<size_t>(alias_of[i])])];
    for (ValueId in : op.inputs) last_use[static_cast<size_t>(root[static_cast<size_t>(in)])] = static_cast<int64_t>(i);
  }
  for (ValueId o : plan.program->outputs()) last_use[static_cast<size_t>(root[static_cast<size_t>(o)])] = INT64_MAX;
  std::vector<std::vector<ValueId>> free_after(c.ops().size());
  size_t live = 0;
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    if (alias_of[i] < 0)
      for (ValueId out : op.outputs) {
        live += bytes_of(c.info(out));
        const int64_t last = last_use[static_cast<size_t>(out)];
        if (last >= 0 && last != INT64_MAX) free_after[static_cast<size_t>(last)].push_back(out);
        if (last < 0) free_after[i].push_back(out);  // never read: freed at once
      }
    s.peak_intermediate_bytes = std::max(s.peak_intermediate_bytes, live);
    for (ValueId v : free_after[i]) live -= bytes_of(c.info(v));
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
