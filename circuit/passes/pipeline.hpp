// The pass pipeline: which passes a plan runs, in which order, under which names. A name is
// what KILN_DISABLE_PASSES takes (comma-separated) to switch a pass off for debugging; an
// unknown name there is an error listing the known ones.
#pragma once

#include <span>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln {

struct PassInfo {
  const char* name;
  bool gpu_only;  // run only for plans the GPU back end lowers
  const char* does;
  // Rewrites c; `outputs` (values of c) are rewritten to their ids in the result.
  Circuit (*run)(const Circuit& c, std::vector<ValueId>& outputs);
};

// Every switchable pass, in the order the pipeline runs them.
std::span<const PassInfo> pipeline_passes();

struct PipelineOptions {
  bool gpu = false;            // run the GPU-only passes too
  bool deterministic = false;  // scatter sums in source order (ordered_scatter_sums)
};

// Runs the pipeline over `recorded`; `outputs` (values of `recorded` the caller needs) are
// rewritten to their ids in the result. KILN_DISABLE_PASSES is read once per call.
Circuit optimize(const Circuit& recorded, std::vector<ValueId>& outputs, const PipelineOptions& options);

}  // namespace kiln
