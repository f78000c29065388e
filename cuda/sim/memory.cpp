// The simulated device's global memory: bounds-checked allocations. New memory is poisoned (like
// cuMemAlloc's, it holds no zeros to rely on) and allocations are separated by unmapped gaps so
// that an access just past an allocation's end is an error, not a hit in its neighbour.
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/sim/internal.hpp>

namespace kiln::sim {

namespace {

constexpr uint64_t kAlign = 256;
constexpr uint64_t kGap = 256;  // unmapped bytes after each allocation
constexpr std::byte kPoison{0xff};

}  // namespace

std::string hex_address(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t DeviceMemory::alloc(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const uint64_t base = next_;
  blocks_.emplace(base, Allocation{std::vector<std::byte>(bytes, kPoison), {}});
  next_ += (bytes + kAlign - 1) / kAlign * kAlign + kGap;
  return base;
}

void DeviceMemory::free(uint64_t addr) {
  if (blocks_.erase(addr) == 0)
    throw Error("device memory: free of " + hex_address(addr) + ", which is not a live allocation");
}

void DeviceMemory::write(uint64_t addr, const void* src, size_t bytes) {
  if (bytes) std::memcpy(at(addr, bytes), src, bytes);
}

void DeviceMemory::read(uint64_t addr, void* dst, size_t bytes) const {
  // at() only looks the allocation up: casting const away to share its checks modifies nothing.
  if (bytes) std::memcpy(dst, const_cast<DeviceMemory*>(this)->at(addr, bytes), bytes);
}

std::byte* DeviceMemory::at(uint64_t addr, size_t bytes) {
  auto above = blocks_.upper_bound(addr);
  if (above != blocks_.begin()) {
    auto& [base, a] = *std::prev(above);
    const uint64_t off = addr - base;
    if (off <= a.bytes.size() && bytes <= a.bytes.size() - off) return a.bytes.data() + off;
  }
  // Name the allocation the access belongs to most likely: the one it starts in or runs past,
  // else the nearest one.
  std::string where = "there are no live allocations";
  const auto below = above == blocks_.begin() ? blocks_.end() : std::prev(above);
  const uint64_t below_end = below == blocks_.end() ? 0 : below->first + below->second.bytes.size();
  const bool use_below =
      below != blocks_.end() && (above == blocks_.end() || addr < below_end || addr - below_end <= above->first - addr);
  const auto near = use_below ? below : above;
  if (near != blocks_.end()) {
    const uint64_t base = near->first, size = near->second.bytes.size();
    where = "allocation " + hex_address(base) + " of " + std::to_string(size) + " bytes";
    if (addr >= base && addr < base + size)
      where = "runs past the end of " + where;
    else if (addr >= base)
      where = "starts " + std::to_string(addr - base - size) + " bytes past the end of " + where;
    else
      where = "lies " + std::to_string(base - addr) + " bytes before " + where;
  }
  throw Error("device memory: access of " + std::to_string(bytes) + " bytes at " + hex_address(addr) +
              " outside every live allocation (" + where + ")");
}

WordWrite* DeviceMemory::write_records(uint64_t addr) {
  auto& [base, a] = *std::prev(blocks_.upper_bound(addr));
  if (a.writes.empty()) a.writes.resize((a.bytes.size() + 3) / 4);
  return a.writes.data() + (addr - base) / 4;
}

const WordWrite* DeviceMemory::find_write_records(uint64_t addr) const {
  const auto& [base, a] = *std::prev(blocks_.upper_bound(addr));
  return a.writes.empty() ? nullptr : a.writes.data() + (addr - base) / 4;
}

size_t DeviceMemory::live_bytes() const {
  size_t total = 0;
  for (const auto& [base, a] : blocks_) total += a.bytes.size();
  return total;
}

}  // namespace kiln::sim
