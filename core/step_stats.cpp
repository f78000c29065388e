// Step statistics (see step_stats.hpp).
#include <spdlog/fmt/fmt.h>

#include <kiln/circuit/exec/liveness.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/core/step_stats.hpp>
#include <kiln/cuda/lower/lower.hpp>

namespace kiln {

double matmul_flops(const Circuit& c, const Op& op) {
  if (op.is(PrimId::matmul)) {
    const Shape& a = c.info(op.inputs[0]).shape;
    const int64_t k = MatmulParams::of(op).transpose_a ? a[a.rank() - 2] : a[a.rank() - 1];
    return 2.0 * static_cast<double>(c.info(op.outputs[0]).shape.numel()) * static_cast<double>(k);
  }
  if (op.is(PrimId::fused_matmul)) {
    const FusedMatmul fm = FusedMatmul::from_params(op.params);
    return 2.0 * static_cast<double>(fm.logical().numel()) * static_cast<double>(fm.k);
  }
  return 0;
}

StepStats measure_step(const Plan& plan) {
  StepStats s;
  const Circuit& c = plan.program->circuit();
  for (ValueId x : c.externals())
    (c.value(x).role == ValueRole::Persistent ? s.persistent_bytes : s.input_bytes) += c.info(x).nbytes();
  // Working ops and their launches (aliases launch nothing and do no work).
  std::vector<int> alias_input(c.ops().size(), -1);
  s.lowered = true;
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    alias_input[i] = cuda::alias_input(op.prim->id);
    if (alias_input[i] >= 0) continue;
    ++s.ops[static_cast<size_t>(op.phase)];
    if (op.phase == Phase::Recompute) s.recomputed_matmul_flops += matmul_flops(c, op);
    for (ValueId in : op.inputs) s.bytes_read += static_cast<double>(c.info(in).nbytes());
    for (ValueId out : op.outputs) s.bytes_written += static_cast<double>(c.info(out).nbytes());
    if (!s.lowered) continue;
    try {
      // Lowered for the plan's Target (a CPU plan's: its choices, lowered as a GPU would lower them).
      s.launches[static_cast<size_t>(op.phase)] += cuda::lower(c, static_cast<int>(i), plan.target).launches.size();
    } catch (const Error&) {
      s.lowered = false;  // a dtype the GPU does not run
    }
  }
  std::vector<char> counted(c.num_values(), 0);
  for (const Op& op : c.ops()) {
    if (op.phase == Phase::Forward) continue;
    for (ValueId in : op.inputs) {
      int32_t p = c.value(in).producer;
      while (p >= 0 && alias_input[static_cast<size_t>(p)] >= 0) {  // a view: the buffer it reads
        in = c.ops()[static_cast<size_t>(p)].inputs[static_cast<size_t>(alias_input[static_cast<size_t>(p)])];
        p = c.value(in).producer;
      }
      if (p < 0 || c.ops()[static_cast<size_t>(p)].phase != Phase::Forward || counted[static_cast<size_t>(in)])
        continue;
      counted[static_cast<size_t>(in)] = 1;
      s.saved_bytes += c.info(in).nbytes();
    }
  }
  // Peak of live intermediates, with buffers allocated when their op runs and freed as the
  // device program frees them.
  const Liveness live = buffer_liveness(c, plan.program->outputs(), alias_input);
  size_t now = 0;
  for (size_t i = 0; i < c.ops().size(); ++i) {
    if (alias_input[i] < 0)
      for (ValueId out : c.ops()[i].outputs) now += c.info(out).nbytes();
    s.peak_intermediate_bytes = std::max(s.peak_intermediate_bytes, now);
    for (ValueId v : live.free_after[i]) now -= c.info(v).nbytes();
  }
  return s;
}

std::string StepStats::summary() const {
  auto mb = [](double b) { return b / (1024.0 * 1024.0); };
  auto at = [](const auto& by_phase, Phase p) { return by_phase[static_cast<size_t>(p)]; };
  std::string kernels =
      lowered ? fmt::format("GPU kernels {}/{}/{} and {} recomputing", at(launches, Phase::Forward),
                            at(launches, Phase::Backward), at(launches, Phase::Update), at(launches, Phase::Recompute))
              : std::string("GPU kernels n/a (dtype)");
  return fmt::format(
      "ops forward/backward/update {}/{}/{} and {} recomputing ({}); read {:.1f} MiB, written {:.1f} MiB; saved for "
      "the backward {:.2f} MiB, recomputed {:.3f} matmul GFLOP; peak intermediates {:.2f} MiB (+ {:.2f} MiB "
      "parameters and state, {:.2f} MiB inputs)",
      at(ops, Phase::Forward), at(ops, Phase::Backward), at(ops, Phase::Update), at(ops, Phase::Recompute), kernels,
      mb(bytes_read), mb(bytes_written), mb(static_cast<double>(saved_bytes)), recomputed_matmul_flops / 1e9,
      mb(static_cast<double>(peak_intermediate_bytes)), mb(static_cast<double>(persistent_bytes)),
      mb(static_cast<double>(input_bytes)));
}

}  // namespace kiln
