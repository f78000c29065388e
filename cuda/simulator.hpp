// The SIMT simulator: runs kernel IR on the CPU with CUDA's execution model, so that lowering is
// tested without a GPU. A grid of blocks, each of warps of 32 threads with active masks and its
// own shared memory; bar.sync, full-mask shfl.sync and atomics. Threads of a warp are scheduled
// independently (as since sm_70): between synchronization points the simulator runs them in a
// varied, seeded order, never in lockstep. It reports, naming the kernel, the instruction, the
// block and the thread: out-of-bounds global or shared accesses (and misaligned ones),
// barriers some threads of a block miss (exited or waiting elsewhere), shuffles some lanes of
// a warp miss, and shared-memory races between threads (across or within a warp) that a
// barrier would have prevented. Approximate instructions (ex2, lg2, rcp, rsqrt, tanh, sin, cos)
// are evaluated within the error the PTX ISA documents for them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "cuda/kir.hpp"

namespace kiln::sim {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
  uint64_t count() const { return uint64_t{x} * y * z; }
};

// The simulated device's global memory: allocations at 256-byte aligned, nonzero addresses.
// Every access is checked against the allocation it falls in.
class DeviceMemory {
 public:
  uint64_t alloc(size_t bytes);  // zero bytes allocates 1 (distinct addresses)
  void free(uint64_t addr);      // throws kiln::Error unless addr is a live allocation's base
  void write(uint64_t addr, const void* src, size_t bytes);
  void read(uint64_t addr, void* dst, size_t bytes) const;
  // Host pointer to [addr, addr + bytes), which must lie inside one live allocation; throws
  // kiln::Error otherwise (the message names the address and the nearest allocation).
  std::byte* at(uint64_t addr, size_t bytes);
  size_t live_allocations() const { return blocks_.size(); }
  size_t live_bytes() const;

 private:
  std::map<uint64_t, std::vector<std::byte>> blocks_;  // base address -> bytes
  uint64_t next_ = 0x7f0000000000;
};

struct SimOptions {
  uint64_t schedule_seed = 1;  // varies the order in which threads run between sync points
  bool check_races = true;
};

struct SimStats {
  int64_t instructions = 0;  // executed by all threads
  int64_t barriers = 0;      // block-wide barrier completions
};

// A kernel prepared for simulation (flattened to straight-line code with branches).
class SimKernel;
std::shared_ptr<const SimKernel> prepare(const kir::Kernel& k);

// Runs the kernel. `params` holds one raw value per kernel parameter (a 32-bit parameter uses the
// low 32 bits). Throws kiln::Error on the faults listed above. Blocks run one after another.
SimStats simulate(const SimKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
                  const SimOptions& options = {});
SimStats simulate(const kir::Kernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
                  const SimOptions& options = {});

}  // namespace kiln::sim
