// A static memory plan: buffers with known lifetimes placed at fixed offsets of one workspace,
// so that two buffers share bytes only when their lifetimes do not meet. A step planned this way
// allocates nothing while it runs and every buffer has the same address in every run. The GPU's
// DeviceProgram and the CPU's Program both place their intermediates with it.
#pragma once

#include <cstddef>
#include <vector>

namespace kiln {

// A buffer live from step `first` to step `last`, both included (op indices of a run).
struct PlannedBlock {
  int first = 0, last = 0;
  size_t bytes = 0;
};

struct MemoryPlan {
  std::vector<size_t> offset;  // per block, a multiple of the alignment
  size_t size = 0;             // workspace bytes
};

// Greedy by size (largest first, ties by first use, then by index: deterministic): each block
// goes at the lowest aligned offset that no block it meets in time covers.
MemoryPlan plan_memory(const std::vector<PlannedBlock>& blocks, size_t alignment = 256);

// The most bytes live at once: the least any plan can use (before alignment and fragmentation).
size_t peak_live_bytes(const std::vector<PlannedBlock>& blocks);

}  // namespace kiln
