// Static memory plan (see memory_plan.hpp).
#include <algorithm>
#include <map>
#include <numeric>

#include <kiln/circuit/exec/memory_plan.hpp>

namespace kiln {

namespace {
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

MemoryPlan plan_memory(const std::vector<PlannedBlock>& blocks, size_t alignment) {
  MemoryPlan plan;
  plan.offset.assign(blocks.size(), 0);
  std::vector<size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (blocks[a].bytes != blocks[b].bytes) return blocks[a].bytes > blocks[b].bytes;
    if (blocks[a].first != blocks[b].first) return blocks[a].first < blocks[b].first;
    return a < b;
  });
  std::vector<size_t> placed;
  for (size_t b : order) {
    const size_t need = round_up(std::max<size_t>(blocks[b].bytes, 1), alignment);
    // The address ranges of placed blocks that meet b in time, by start.
    std::vector<std::pair<size_t, size_t>> taken;
    for (size_t p : placed)
      if (blocks[p].first <= blocks[b].last && blocks[b].first <= blocks[p].last)
        taken.emplace_back(plan.offset[p], plan.offset[p] + round_up(std::max<size_t>(blocks[p].bytes, 1), alignment));
    std::sort(taken.begin(), taken.end());
    size_t at = 0;
    for (const auto& [begin, end] : taken) {
      if (begin >= at + need) break;  // b fits in the gap before this range
      at = std::max(at, end);
    }
    plan.offset[b] = at;
    plan.size = std::max(plan.size, at + need);
    placed.push_back(b);
  }
  return plan;
}

size_t peak_live_bytes(const std::vector<PlannedBlock>& blocks) {
  std::map<int, long long> delta;  // bytes entering at a step, leaving after it
  for (const PlannedBlock& b : blocks) {
    delta[b.first] += static_cast<long long>(b.bytes);
    delta[b.last + 1] -= static_cast<long long>(b.bytes);
  }
  long long live = 0, peak = 0;
  for (const auto& [step, d] : delta) peak = std::max(peak, live += d);
  return static_cast<size_t>(peak);
}

}  // namespace kiln
