// The ordered pass list and the KILN_DISABLE_PASSES switch.
#include <algorithm>
#include <array>
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/options.hpp>
#include <kiln/circuit/passes/absorb_casts.hpp>
#include <kiln/circuit/passes/absorb_padding.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/passes/matmul_column_sums.hpp>
#include <kiln/circuit/passes/pad_bf16_rows.hpp>
#include <kiln/circuit/passes/pipeline.hpp>

namespace kiln {

namespace {

Circuit forward_assigns(const Circuit& c, std::vector<ValueId>&) { return forward_assigned_values(c); }

// In pipeline order. Switching cse off leaves dead-code elimination in its place.
constexpr std::array<PassInfo, 13> kPasses = {{
    {"cse", false, "common-subexpression elimination (off: dead-code elimination only)", cse},
    {"simplify_row_indexing", false, "gathers by 0..R-1 read the table itself", simplify_row_indexing},
    {"forward_assigns", false, "readers of an assign read the assigned value", forward_assigns},
    {"fuse_attention", false, "attention chains and their backward become attention ops (no (T, T) values)",
     fuse_attention},
    {"fuse_pointwise", false, "chains of pointwise ops become one", fuse_pointwise},
    {"fuse_columns", true, "sums over the token axes absorb their producers (column_sums)", fuse_columns},
    {"pad_bf16_rows", true, "bf16 casts and buffers that matmuls read get rows of a multiple of 8 (16-byte chunks)",
     pad_bf16_rows},
    {"fuse_matmul", true, "matmuls read through views, with prologues and epilogues (fused_matmul)", fuse_matmul},
    {"fuse_rows", false, "row reductions with the ops around them (fused_rows)", fuse_rows},
    {"absorb_casts", true,
     "casts to bf16 of fused_rows, fused_matmul and attention outputs become outputs stored as bf16 by those ops",
     absorb_casts},
    {"absorb_padding", true, "zero columns concatenated after fused_rows outputs are written by the op (padded rows)",
     absorb_padding},
    {"matmul_column_sums", true,
     "column sums of a matmul epilogue become 128-row block sums the matmul writes (the epilogue not stored)",
     matmul_column_sums},
    {"merge_multi_tensor", true, "per-parameter update work in one op (multi_tensor)", merge_multi_tensor},
}};

}  // namespace

std::span<const PassInfo> pipeline_passes() { return kPasses; }

Circuit optimize(const Circuit& recorded, std::vector<ValueId>& outputs, const PipelineOptions& options) {
  const std::vector<std::string> disabled = options::disabled_passes();
  for (const std::string& name : disabled)
    if (std::none_of(kPasses.begin(), kPasses.end(), [&](const PassInfo& p) { return name == p.name; })) {
      std::string known;
      for (const PassInfo& p : kPasses) known += std::string(known.empty() ? "" : ", ") + p.name;
      throw Error("KILN_DISABLE_PASSES: no pass is named '" + name + "' (the passes: " + known + ")");
    }
  auto enabled = [&](const PassInfo& p) {
    return std::find(disabled.begin(), disabled.end(), p.name) == disabled.end();
  };
  Circuit c = enabled(kPasses[0]) ? cse(recorded, outputs) : dce(recorded, outputs);
  for (const PassInfo& pass : std::span(kPasses).subspan(1))
    if (enabled(pass) && (options.gpu || !pass.gpu_only)) c = pass.run(c, outputs);
  if (options.deterministic) c = ordered_scatter_sums(c, outputs);
  return c;
}

}  // namespace kiln
