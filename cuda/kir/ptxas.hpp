// Validation of generated PTX with the CUDA toolkit's ptxas: assembles a module for one target
// and reports whether it assembled, the log, and the resource usage ptxas -v prints. Used by
// the tests and by the CLI; kiln itself never needs ptxas to run.
#pragma once

#include <string>

namespace kiln::cuda {

struct PtxasResult {
  bool ok = false;        // ptxas exited with status 0
  std::string log;        // stdout and stderr together
  int registers = -1;     // "Used N registers" (-1 when not reported)
  int spill_stores = 0;   // "N bytes spill stores"
  int spill_loads = 0;    // "N bytes spill loads"
  int shared_bytes = -1;  // "N bytes smem"; 0 when ptxas reports usage without it, -1 when no usage
};

// The ptxas executable: the first on PATH, else /usr/local/cuda/bin/ptxas; "" when neither.
std::string find_ptxas();

// Runs `ptxas -arch=sm_<sm> -v -o /dev/null` on the PTX (written to a unique temporary file,
// removed afterwards). Throws kiln::Error when ptxas cannot be found or started.
PtxasResult run_ptxas(const std::string& ptx, int sm);

}  // namespace kiln::cuda
