// The cache of compiled plans. A recorded step is looked up by its structural hash and the hit
// is confirmed by full structural equality (a hash alone can collide); a miss runs the passes
// and builds a Program. The cache is bounded: the least recently used plan is evicted.
#pragma once

#include <list>
#include <memory>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

namespace kiln {

struct Plan {
  Circuit recorded;                  // the key: the circuit as recorded
  std::vector<ValueId> requested;    // the key: the values the caller asked for (recorded ids)
  std::unique_ptr<Program> program;  // optimized circuit; outputs in the order of `requested`
  size_t recorded_ops = 0, optimized_ops = 0;
  bool for_gpu = false;        // the key too: built with the GPU-only passes
  bool deterministic = false;  // the key too: scatter sums in source order (no float atomics)
  // The optimized circuit lowered for the GPU, built on the plan's first run there.
  mutable std::unique_ptr<cuda::DeviceProgram> device;
};

class PlanCache {
 public:
  explicit PlanCache(size_t capacity = 64) : capacity_(capacity < 1 ? 1 : capacity) {}
  // The plan for (recorded, requested), or nullptr. Plans are shared: one evicted stays alive
  // while a holder (a traced step, the engine's last plan) keeps it.
  std::shared_ptr<const Plan> find(uint64_t hash, const Circuit& recorded, const std::vector<ValueId>& requested);
  // Builds (the pass pipeline of circuit/passes/pipeline.hpp, then a Program) and inserts;
  // evicts the least recently used beyond capacity.
  std::shared_ptr<const Plan> build(uint64_t hash, const Circuit& recorded, const std::vector<ValueId>& requested);
  size_t size() const { return entries_.size(); }
  std::vector<const Plan*> plans() const;  // most recently used first
  const Plan* largest() const;             // the plan with the most ops (a training step), or null
  // Plans built from now on are for the GPU: they also run the GPU-only passes (fuse_columns,
  // fuse_matmul, fuse_rows, merge_multi_tensor), which lower launch counts but make the Eigen
  // executor slower (measured: docs/BENCHMARKS.md). The engine sets it with its device; `kiln ptx` and kernel-count
  // tests set it to plan for the GPU on any machine.
  void set_gpu_target(bool gpu) { gpu_ = gpu; }
  // Plans built from now on are deterministic: on the GPU no float atomics, on the CPU a fixed
  // thread count (no team size chosen by the machine's load). On the GPU: scatter sums in
  // source order; every other reduction is already a fixed tree), so a run repeats bit for bit.
  void set_deterministic(bool on) { deterministic_ = on; }
  bool deterministic() const { return deterministic_; }
  size_t capacity() const { return capacity_; }
  void clear() { entries_.clear(); }

 private:
  struct Entry {
    uint64_t hash;
    std::shared_ptr<Plan> plan;
  };
  size_t capacity_;
  bool gpu_ = false;
  bool deterministic_ = false;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace kiln
