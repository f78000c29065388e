// Statistics of a compiled step for `kiln train --stats`: the work its plan does per phase
// (forward, backward, optimizer update), the bytes its ops read and write, and the memory it
// needs: the peak of intermediates live at once when each is freed after its last use as the
// device program frees them (circuit/exec/liveness.hpp), next to the persistent buffers and inputs.
#pragma once

#include <array>
#include <string>

#include <kiln/core/plan_cache.hpp>

namespace kiln {

struct StepStats {
  std::array<size_t, 3> ops{};               // ops that do work (not aliases), by Phase
  std::array<size_t, 3> launches{};          // GPU kernel launches once lowered, by Phase (f32/i32 plans)
  bool lowered = false;                      // false: the plan has dtypes the GPU does not run
  double bytes_read = 0, bytes_written = 0;  // each input and output of each working op once
  size_t peak_intermediate_bytes = 0;
  size_t persistent_bytes = 0, input_bytes = 0;
  std::string summary() const;  // one line
};

StepStats measure_step(const Plan& plan);

}  // namespace kiln
