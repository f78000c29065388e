// The SIMT simulator: runs kernel IR on the CPU with CUDA's execution model, so that lowering is
// tested without a GPU. A grid of blocks, each of warps of 32 threads with active masks and its
// own shared memory; bar.sync, full-mask shfl.sync, atomics and membar.gl. Threads of a warp are
// scheduled independently (as since sm_70), never in lockstep. By default several blocks are
// resident at once and the simulator interleaves their threads in short segments of seeded
// random length and order, as a GPU runs a grid's blocks at once and in any order.
//
// It reports, naming the kernel, the instruction, the block and the thread: out-of-bounds
// global or shared accesses (and misaligned ones), barriers some threads of a block miss
// (exited or waiting elsewhere), shuffles some lanes of a warp miss, shared-memory races between
// threads (across or within a warp) that a barrier would have prevented, and global-memory
// reads of a value that another thread wrote in the same launch with nothing to order the write
// before the read (a global-memory race). Ordering, whatever the schedule happened to be:
//  - within a block, a bar.sync between the write and the read;
//  - across blocks, PTX's release and acquire patterns: the writer's block passes a bar.sync (or
//    the writer is the releasing thread), the releasing thread runs membar.gl and then an atomic
//    on some word; a thread whose atomic reads that word, after its own later membar.gl (and, for
//    the other threads of its block, a bar.sync after that), sees everything released there.
// sm_90's mbarriers and tensor copies: a wait blocks until its phase completes (threads left
// waiting for phases that cannot complete are reported as a deadlock), and bytes a tensor copy
// wrote may be touched only by threads that waited for the phase it completed on.
// Approximate instructions (ex2, lg2, rcp, rsqrt, tanh, sin, cos) are evaluated within the
// error the PTX ISA documents for them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <kiln/cuda/kir/kir.hpp>

namespace kiln::sim {

using Dim3 = kir::Dim3;

// The simulator's record of the last write to a 4-byte word of global memory during a launch
// (launch ids are unique per process, so a record from an earlier launch is simply stale).
struct WordWrite {
  uint64_t launch = 0;
  uint64_t block = 0;     // linear block index in the grid
  uint32_t barriers = 0;  // bar.syncs the writing block had completed
  uint32_t seq = 0;       // the writing thread's global stores so far, this one included
  uint32_t pc = 0;
  uint16_t thread = 0;  // linear thread index in the block
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
  // The write records of the words from the one holding `addr` (an address at() accepted) to
  // the end of its allocation; find_write_records is null where nothing was recorded yet.
  WordWrite* write_records(uint64_t addr);
  const WordWrite* find_write_records(uint64_t addr) const;
  size_t live_allocations() const { return blocks_.size(); }
  size_t live_bytes() const;

 private:
  struct Allocation {
    std::vector<std::byte> bytes;
    std::vector<WordWrite> writes;  // one per 4-byte word, made on the first write_record()
  };
  std::map<uint64_t, Allocation> blocks_;  // base address -> allocation
  uint64_t next_ = 0x7f0000000000;
};

struct SimOptions {
  uint64_t schedule_seed = 1;  // varies the order in which threads (and blocks) run
  bool check_races = true;     // shared- and global-memory races
  // Blocks resident at once, their threads interleaved in segments of 1 to 32 instructions.
  // 1: blocks run one after another, each thread of a block to its next synchronization.
  uint32_t resident_blocks = 8;
  // Count warp-level requests (SimStats): lanes of a warp that run the same access the same time
  // round are one request; a shared one is served in wavefronts of one word per bank (bank
  // conflicts), a global one moves the 32-byte sectors its lanes touch.
  bool count_requests = false;
  // 0: every block of the grid. k > 0: k blocks spread evenly over it (the first and the last
  // among them) and no others, for counts a performance model scales by grid / SimStats::blocks;
  // what the skipped blocks would have written is left as it was.
  uint64_t sample_blocks = 0;
};

struct SimStats {
  int64_t blocks = 0;        // blocks run: the grid's, or SimOptions::sample_blocks of them
  int64_t instructions = 0;  // executed by all threads
  int64_t barriers = 0;      // block-wide barrier completions
  // The work a performance model bounds the time with (cuda/perf/estimate.hpp):
  int64_t fp32_flops = 0;          // f32 add, sub, mul and min/max 1, fma 2, per thread
  int64_t tensor_flops = 0;        // mma.sync and wgmma: 2 m n k per warp or warpgroup instruction
  int64_t tf32_tensor_flops = 0;   // the part of them on tf32 (tensor cores take twice as long)
  int64_t global_load_bytes = 0;   // ld.global, atomics, cp.async sources, tensor copies' boxes
  int64_t global_store_bytes = 0;  // st.global, atomics
  int64_t tensor_copy_bytes = 0;   // the tensor copies' part of the loads
  // With SimOptions::count_requests: warp-level global requests of ld, st, atom and cp.async
  // (tensor copies are not), and the distinct 32-byte sectors they touch (4 a request where 32
  // lanes read consecutive floats).
  int64_t global_requests = 0;
  int64_t global_sectors = 0;
  // With SimOptions::count_requests: warp-level shared-memory requests, the wavefronts
  // they took (32 banks of 4 bytes; 8- and 16-byte accesses are served a half or a quarter
  // warp at a time, as on NVIDIA GPUs; lanes reading one word share it), and the wavefronts
  // beyond one per request phase (bank conflicts).
  int64_t shared_requests = 0;
  int64_t shared_wavefronts = 0;
  int64_t bank_conflicts = 0;
};

// A kernel prepared for simulation (flattened to straight-line code with branches).
class SimKernel;
std::shared_ptr<const SimKernel> prepare(const kir::Kernel& k);

// Runs the kernel. `params` holds one raw value per kernel parameter (a 32-bit parameter uses the
// low 32 bits). Throws kiln::Error on the faults listed above.
SimStats simulate(const SimKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
                  const SimOptions& options = {});
SimStats simulate(const kir::Kernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
                  const SimOptions& options = {});

}  // namespace kiln::sim
