// Statistics of a compiled step for `kiln train --stats`: the work its plan does per phase
// (forward, the recompute pass's copies, backward, optimizer update; an op fused from copies and
// backward work counts as backward), the bytes its ops read and write, and the memory it
// needs: the peak of intermediates live at once when each is freed after its last use as the
// device program frees them (circuit/exec/liveness.hpp), next to the persistent buffers and inputs.
#pragma once

#include <array>
#include <string>

#include <kiln/core/plan_cache.hpp>

namespace kiln {

struct StepStats {
  std::array<size_t, kPhaseCount> ops{};       // ops that do work (not aliases), by Phase
  std::array<size_t, kPhaseCount> launches{};  // GPU kernel launches once lowered, by Phase (f32/i32 plans)
  bool lowered = false;                        // false: the plan has dtypes the GPU does not run
  double bytes_read = 0, bytes_written = 0;    // each input and output of each working op once
  size_t peak_intermediate_bytes = 0;
  // Forward values the backward reads (what training keeps between the two), and the matmul
  // FLOPs that the recompute pass's copies do again (circuit/passes/recompute.hpp; a matmul is
  // never fused with backward work, so none is missed).
  size_t saved_bytes = 0;
  double recomputed_matmul_flops = 0;
  size_t persistent_bytes = 0, input_bytes = 0;
  std::string summary() const;  // one line
};

StepStats measure_step(const Plan& plan);

// 2 m n k (times the batch) of a matmul or fused_matmul op; 0 for any other op.
double matmul_flops(const Circuit& c, const Op& op);

}  // namespace kiln
