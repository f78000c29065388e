// The pass pipeline: which passes a plan runs, in which order, under which names. A name is
// what PipelineOptions::disabled (the CLI's `--passes -NAME,...`) takes to switch a pass off for
// debugging; an unknown name there is an error listing the known ones.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>
#include <kiln/circuit/passes/recompute.hpp>

namespace kiln {

struct PassInfo {
  const char* name;
  bool gpu_only;  // run only for plans the GPU back end lowers
  const char* does;
  // Rewrites c for `target`; `outputs` (values of c) are rewritten to their ids in the result.
  Circuit (*run)(const Circuit& c, std::vector<ValueId>& outputs, const Target& target);
};

// Every switchable pass, in the order the pipeline runs them.
std::span<const PassInfo> pipeline_passes();

// Part of every plan's key, with the Target.
struct PipelineOptions {
  std::vector<std::string> disabled;  // pass names switched off (each a pipeline_passes() name)
  // What the backward recomputes (`--recompute`); unset: the device's default (recompute_mode).
  // Blocks mode in the first `checkpointed_blocks` blocks only where that is not negative (how
  // the budget search below steps between modes).
  std::optional<RecomputeMode> recompute;
  int checkpointed_blocks = -1;
  // `--memory-budget`: the most bytes the plan's workspace may take, 0 for no limit. A plan over
  // it recomputes more, block by block (PlanCache::build); none fitting is an error.
  size_t memory_budget = 0;
  // chunk_loss_head: logits over this many bytes are computed this many bytes at a time (whole
  // sequences; one at least).
  size_t loss_chunk_bytes = size_t{256} << 20;
  bool operator==(const PipelineOptions&) const = default;
};

// The recompute mode a plan for `target` runs: the one asked for, else automatic on the CPU and
// none on the GPU (a GPU has not yet timed the copies' kernels: a kernel choice that has never
// run on a GPU is not a default there).
RecomputeMode recompute_mode(const PipelineOptions& options, const Target& target);

// "-cse,-fuse_rows" (the `--passes` option: each item a pass to switch off, named with a
// leading '-') into options; throws kiln::Error naming an unknown pass and listing the known.
PipelineOptions parse_pipeline_options(std::string_view text);
// Throws the same error for a name in options.disabled that names no pass.
void check_pipeline_options(const PipelineOptions& options);

// Runs the pipeline over `recorded` for `target`: CSE, chunk_loss_head (CPU), the recompute pass
// (options.recompute), then the others: the GPU-only passes where target.gpu(),
// scatter sums in source order (ordered_scatter_sums) where target.deterministic. `outputs`
// (values of `recorded` the caller needs) are rewritten to their ids in the result.
Circuit optimize(const Circuit& recorded, std::vector<ValueId>& outputs, const Target& target,
                 const PipelineOptions& options = {});

}  // namespace kiln
