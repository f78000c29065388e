// The ordered pass list and its switches.
#include <algorithm>
#include <array>
#include <sstream>
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/absorb_casts.hpp>
#include <kiln/circuit/passes/absorb_padding.hpp>
#include <kiln/circuit/passes/bf16_as_rounded_f32.hpp>
#include <kiln/circuit/passes/chunk_loss_head.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/expand_user_prims.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/passes/matmul_column_sums.hpp>
#include <kiln/circuit/passes/overlap_collectives.hpp>
#include <kiln/circuit/passes/pad_bf16_rows.hpp>
#include <kiln/circuit/passes/pipeline.hpp>

namespace kiln {

namespace {

// The passes that need no Target, as PassInfo::run takes them.
template <Circuit (*pass)(const Circuit&, std::vector<ValueId>&)>
Circuit any_target(const Circuit& c, std::vector<ValueId>& outputs, const Target&) {
  return pass(c, outputs);
}
Circuit forward_assigns(const Circuit& c, std::vector<ValueId>&) { return forward_assigned_values(c); }

// Plans that store bf16 values: the GPU's, and the CPU's whose bf16 products are oneDNN's (a CPU
// plan of rounded_f32 products holds them in f32 and has no cast to bf16 left to absorb).
Circuit absorb_stored_casts(const Circuit& c, std::vector<ValueId>& outputs, const Target& target) {
  return target.gpu() || target.cpu_bf16 == CpuBf16Products::onednn ? absorb_casts(c, outputs) : c;
}

// Listed for its name and description; optimize() runs it with PipelineOptions::loss_chunk_bytes.
Circuit chunk_loss_head_with_default_size(const Circuit& c, std::vector<ValueId>& outputs, const Target& target) {
  return chunk_loss_head(c, outputs, target);
}

// In pipeline order. Switching cse off leaves dead-code elimination in its place.
constexpr std::array<PassInfo, 16> kPasses = {{
    {"cse", false, "common-subexpression elimination (off: dead-code elimination only)", any_target<cse>},
    {"chunk_loss_head", false,
     "CPU: a language model's head, loss and the head's backward products run chunk by chunk of sequences where "
     "the logits exceed 256 MiB (the whole batch's logits never held at once; before recompute)",
     chunk_loss_head_with_default_size},
    {"simplify_row_indexing", false, "gathers by 0..R-1 read the table itself", any_target<simplify_row_indexing>},
    {"forward_assigns", false, "readers of an assign read the assigned value", any_target<forward_assigns>},
    {"fuse_attention", false,
     "attention chains become attention ops, before each backward() (its VJP: attention_grad) and here for the rest",
     any_target<fuse_attention>},
    {"bf16_as_rounded_f32", false,
     "CPU: bf16 operands held in f32 rounded to bf16 (the same f32 products, no widening copies)", bf16_as_rounded_f32},
    {"fuse_pointwise", false, "chains of pointwise ops become one", any_target<fuse_pointwise>},
    {"fuse_columns", true, "sums over the token axes absorb their producers (column_sums)", any_target<fuse_columns>},
    {"pad_bf16_rows", true, "bf16 casts and buffers that matmuls read get rows of a multiple of 8 (16-byte chunks)",
     pad_bf16_rows},
    {"fuse_matmul", true, "matmuls read through views, with prologues and epilogues (fused_matmul)", fuse_matmul},
    {"fuse_rows", false, "row reductions with the ops around them (fused_rows)", any_target<fuse_rows>},
    {"absorb_casts", false,
     "casts to bf16 of fused_rows, fused_matmul and attention outputs become outputs stored as bf16 by those ops "
     "(plans that store bf16: GPU, CPU with --cpu-bf16 onednn)",
     absorb_stored_casts},
    {"absorb_padding", true, "zero columns concatenated after fused_rows outputs are written by the op (padded rows)",
     any_target<absorb_padding>},
    {"matmul_column_sums", true,
     "column sums of a matmul epilogue become 128-row block sums the matmul writes (the epilogue not stored)",
     any_target<matmul_column_sums>},
    {"merge_multi_tensor", true, "per-parameter update work in one op (multi_tensor)", any_target<merge_multi_tensor>},
    {"overlap_collectives", false,
     "CPU: each gradient bucket's all-reduce starts as soon as the backward has made the bucket and finishes just "
     "before the first read of the mean (nonblocking MPI, moved on between ops)",
     overlap_collectives},
}};

}  // namespace

std::span<const PassInfo> pipeline_passes() { return kPasses; }

void check_pipeline_options(const PipelineOptions& options) {
  for (const std::string& name : options.disabled)
    if (std::none_of(kPasses.begin(), kPasses.end(), [&](const PassInfo& p) { return name == p.name; })) {
      std::string known;
      for (const PassInfo& p : kPasses) known += std::string(known.empty() ? "" : ", ") + p.name;
      throw Error("--passes: no pass is named '" + name + "' (the passes: " + known + ")");
    }
}

PipelineOptions parse_pipeline_options(std::string_view text) {
  PipelineOptions options;
  std::stringstream items{std::string(text)};
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) continue;
    if (item[0] != '-')
      throw Error("--passes: expected passes to switch off, each named with a leading '-' (-fuse_rows), received '" +
                  item + "'");
    options.disabled.push_back(item.substr(1));
  }
  check_pipeline_options(options);
  return options;
}

RecomputeMode recompute_mode(const PipelineOptions& options, const Target& target) {
  if (options.recompute) return *options.recompute;
  return target.gpu() ? RecomputeMode::none : RecomputeMode::automatic;
}

Circuit optimize(const Circuit& recorded, std::vector<ValueId>& outputs, const Target& target,
                 const PipelineOptions& options) {
  check_pipeline_options(options);
  const std::vector<std::string>& disabled = options.disabled;
  auto off = [&](std::string_view name) { return std::find(disabled.begin(), disabled.end(), name) != disabled.end(); };
  Circuit c = off("cse") ? dce(recorded, outputs) : cse(recorded, outputs);
  c = expand_user_prims(c, outputs, target);
  if (!off("chunk_loss_head")) c = chunk_loss_head(c, outputs, target, options.loss_chunk_bytes);  // kPasses[1]
  c = recompute(c, outputs, recompute_mode(options, target), options.checkpointed_blocks);
  for (const PassInfo& pass : std::span(kPasses).subspan(2)) {
    // Without fuse_matmul nothing folds pad_bf16_rows's slices: the padding would only add kernels.
    const bool needs_fuse_matmul = std::string_view(pass.name) == "pad_bf16_rows" && off("fuse_matmul");
    if (!off(pass.name) && !needs_fuse_matmul && (target.gpu() || !pass.gpu_only)) c = pass.run(c, outputs, target);
  }
  if (target.deterministic) c = ordered_scatter_sums(c, outputs);
  return c;
}

}  // namespace kiln
