// PlanCache: structural lookup, pass pipeline on a miss, LRU eviction.
#include <spdlog/spdlog.h>

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

std::shared_ptr<const Plan> PlanCache::build(uint64_t hash, const Circuit& recorded,
                                             const std::vector<ValueId>& requested, const Target& target,
                                             const PipelineOptions& pipeline) {
  recorded.verify();  // ordering of buffer reads and writes, before passes could hide it
  std::vector<ValueId> outputs = requested;
  Circuit optimized = optimize(recorded, outputs, target, pipeline);
  auto plan = std::make_shared<Plan>();
  plan->recorded = recorded;
  plan->requested = requested;
  plan->target = target;
  plan->pipeline = pipeline;
  plan->recorded_ops = recorded.ops().size();
  plan->optimized_ops = optimized.ops().size();
  plan->program = std::make_unique<Program>(std::move(optimized), std::move(outputs), target);
  plan->program->set_adaptive_threads(!target.deterministic);  // a deterministic run keeps its team size
  entries_.push_front(Entry{hash, std::move(plan)});
  if (entries_.size() > capacity_) {
    spdlog::debug("plan cache full ({} plans): evicting the least recently used", capacity_);
    entries_.pop_back();
  }
  return entries_.front().plan;
}

}  // namespace kiln
