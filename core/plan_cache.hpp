// The cache of compiled plans. A plan's key is the recorded step, the values requested, the
// Target and the pipeline's options: a step recorded again under another Target (a device, a
// matmul policy, determinism) or other options gets a plan of its own, never a stale one. A step
// is looked up by its structural hash and the hit confirmed by full structural equality (a hash
// alone can collide); a miss runs the passes and builds a Program. The cache is bounded: the
// least recently used plan is evicted.
#pragma once

#include <list>
#include <memory>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/target.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

namespace kiln {

struct Plan {
  Circuit recorded;                  // the key: the circuit as recorded
  std::vector<ValueId> requested;    // the key: the values the caller asked for (recorded ids)
  std::unique_ptr<Program> program;  // optimized circuit; outputs in the order of `requested`
  Target target;                     // the key: what the passes and the lowering were for
  PipelineOptions pipeline;          // the key: the passes switched off, recomputation, budget
  PipelineOptions made_with;         // `pipeline`, or under a memory budget the recomputation chosen
  size_t recorded_ops = 0, optimized_ops = 0;
  // The optimized circuit lowered for `target` on the GPU, built on the plan's first run there.
  mutable std::unique_ptr<cuda::DeviceProgram> device;
};

class PlanCache {
 public:
  explicit PlanCache(size_t capacity = 64) : capacity_(capacity < 1 ? 1 : capacity) {}
  // The plan for (recorded, requested, target, pipeline), or nullptr. Plans are shared: one
  // evicted stays alive while a holder (a traced step, the engine's last plan) keeps it.
  std::shared_ptr<const Plan> find(uint64_t hash, const Circuit& recorded, const std::vector<ValueId>& requested,
                                   const Target& target, const PipelineOptions& pipeline);
  // Builds (the pass pipeline of circuit/passes/pipeline.hpp for `target`: with a CUDA target
  // the GPU-only passes too, which lower launch counts but make the Eigen executor slower,
  // measured in docs/BENCHMARKS.md; then a Program) and inserts; evicts the least recently used
  // beyond capacity.
  std::shared_ptr<const Plan> build(uint64_t hash, const Circuit& recorded, const std::vector<ValueId>& requested,
                                    const Target& target, const PipelineOptions& pipeline);
  size_t size() const { return entries_.size(); }
  std::vector<const Plan*> plans() const;  // most recently used first
  const Plan* largest() const;             // the plan with the most ops (a training step), or null
  size_t capacity() const { return capacity_; }
  // Drops every plan (their memory; held ones live on with their holders). Never needed for
  // correctness: a plan's key holds everything it was made for.
  void clear() { entries_.clear(); }

 private:
  struct Entry {
    uint64_t hash;
    std::shared_ptr<Plan> plan;
  };
  size_t capacity_;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace kiln
