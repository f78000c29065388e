// PlanCache: structural lookup, pass pipeline on a miss, LRU eviction.
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/plan_cache.hpp>

namespace kiln {

std::shared_ptr<const Plan> PlanCache::find(uint64_t hash, const Circuit& recorded,
                                            const std::vector<ValueId>& requested, const Target& target,
                                            const PipelineOptions& pipeline) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const Plan& p = *it->plan;
    if (it->hash != hash || p.target != target || p.pipeline != pipeline || p.requested != requested ||
        !p.recorded.structurally_equal(recorded))
      continue;
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front().plan;
  }
  return nullptr;
}

std::vector<const Plan*> PlanCache::plans() const {
  std::vector<const Plan*> out;
  for (const auto& e : entries_) out.push_back(e.plan.get());
  return out;
}

const Plan* PlanCache::largest() const {
  const Plan* best = nullptr;
  for (const auto& e : entries_)
    if (!best || e.plan->optimized_ops > best->optimized_ops) best = e.plan.get();
  return best;
}

namespace {

std::unique_ptr<Program> make_program(const Circuit& recorded, const std::vector<ValueId>& requested,
                                      const Target& target, const PipelineOptions& pipeline) {
  std::vector<ValueId> outputs = requested;
  Circuit optimized = optimize(recorded, outputs, target, pipeline);
  return std::make_unique<Program>(std::move(optimized), std::move(outputs), target);
}

std::string mib(size_t bytes) {  // "512.00 MiB"; below a MiB in KiB
  const double b = static_cast<double>(bytes);
  return b < 1024.0 * 1024.0 ? fmt::format("{:.2f} KiB", b / 1024.0) : fmt::format("{:.2f} MiB", b / (1024.0 * 1024.0));
}

// The plan under pipeline.memory_budget that recomputes least: the mode asked for, else blocks
// mode in the first k blocks (k = 0: auto), k found by bisection (the workspace shrinks as k
// grows, each block checkpointed keeping only its input), else an error stating what the most
// recomputation needs. The workspace measured is the CPU plan's (a GPU plan of the same circuit
// places the same values, within its alignment). `chosen` receives the options it was made with.
std::unique_ptr<Program> program_within_budget(const Circuit& recorded, const std::vector<ValueId>& requested,
                                               const Target& target, const PipelineOptions& pipeline,
                                               PipelineOptions& chosen) {
  chosen = pipeline;
  std::unique_ptr<Program> asked = make_program(recorded, requested, target, pipeline);
  const size_t budget = pipeline.memory_budget;
  if (budget == 0 || asked->workspace_bytes() <= budget) return asked;
  PipelineOptions p = pipeline;
  p.recompute = RecomputeMode::blocks;
  p.checkpointed_blocks = -1;
  std::unique_ptr<Program> best = make_program(recorded, requested, target, p);
  if (best->workspace_bytes() > budget)
    throw Error("--memory-budget: " + mib(budget) + " is below what this step needs with the most recomputation (" +
                mib(best->workspace_bytes()) + " of workspace with --recompute blocks; --recompute " +
                recompute_mode_name(recompute_mode(pipeline, target)) + " needs " + mib(asked->workspace_bytes()) +
                ")");
  const int blocks = count_blocks(recorded);
  int lo = 0, hi = blocks;  // blocks mode in all of them (`best`) fits
  while (lo < hi) {
    p.checkpointed_blocks = lo + (hi - lo) / 2;
    std::unique_ptr<Program> candidate = make_program(recorded, requested, target, p);
    if (candidate->workspace_bytes() <= budget) {
      hi = p.checkpointed_blocks;
      best = std::move(candidate);
    } else {
      lo = p.checkpointed_blocks + 1;
    }
  }
  p.checkpointed_blocks = hi == blocks ? -1 : hi;
  chosen = p;
  spdlog::info(
      "--memory-budget {}: each block recomputed from its input in {} of {} blocks (the rest as auto), "
      "workspace {}",
      mib(budget), hi, blocks, mib(best->workspace_bytes()));
  return best;
}

}  // namespace

std::shared_ptr<const Plan> PlanCache::build(uint64_t hash, const Circuit& recorded,
                                             const std::vector<ValueId>& requested, const Target& target,
                                             const PipelineOptions& pipeline) {
  recorded.verify();  // ordering of buffer reads and writes, before passes could hide it
  auto plan = std::make_shared<Plan>();
  plan->recorded = recorded;
  plan->requested = requested;
  plan->target = target;
  plan->pipeline = pipeline;
  plan->recorded_ops = recorded.ops().size();
  plan->program = program_within_budget(recorded, requested, target, pipeline, plan->made_with);
  plan->optimized_ops = plan->program->circuit().ops().size();
  plan->program->set_adaptive_threads(!target.deterministic);  // a deterministic run keeps its team size
  entries_.push_front(Entry{hash, std::move(plan)});
  if (entries_.size() > capacity_) {
    spdlog::debug("plan cache full ({} plans): evicting the least recently used", capacity_);
    entries_.pop_back();
  }
  return entries_.front().plan;
}

}  // namespace kiln
