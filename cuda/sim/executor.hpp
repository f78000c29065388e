// The SIMT simulator's executor (simulator.hpp says what it checks and its ordering model): the
// state of a launch's resident blocks and the Executor that runs them, shared by its parts: the
// interpreter and the block scheduler in simulator.cpp, block admission, barriers, shuffles and
// diagnostics in executor.cpp, the memory model (global accesses, fences, atomics, races, bank
// conflicts) in executor_memory.cpp, asynchronous copies and tensor-core operations in
// executor_async.cpp.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/sim/internal.hpp>
#include <kiln/cuda/sim/simulator.hpp>
#include <kiln/cuda/sim/tensor_map.hpp>

namespace kiln::sim::detail {

using kir::Type;

enum class State : uint8_t { ready, at_bar, at_shfl, at_mbarrier, exited };
enum class Access : uint8_t { read, write, atomic };

constexpr uint32_t kWarp = 32;
constexpr uint32_t kWarpgroup = 128;  // wgmma's 4 warps
// A thread that runs this many instructions without reaching a synchronization point is taken to
// loop forever (a for-loop whose step is zero, say): an error instead of a hung test.
constexpr int64_t kMaxRun = int64_t{1} << 32;
constexpr std::byte kSharedPoison{0xff};  // unwritten shared memory reads as NaN / all ones

// The race detector's record of one shared-memory byte in the current barrier epoch. Two
// distinct readers suffice: a writer differs from at least one of them.
struct Shadow {
  uint32_t epoch = 0;
  int16_t writer = -1;
  int16_t reader[2] = {-1, -1};
  int16_t atomic[2] = {-1, -1};
  uint32_t writer_pc = 0;
  uint32_t reader_pc[2] = {};
  uint32_t atomic_pc[2] = {};
};

inline uint64_t load_elem(const std::byte* p, int size) {
  switch (size) {
    case 1: return static_cast<uint8_t>(*p);
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

inline void store_elem(std::byte* p, uint64_t v, int size) {  // the low `size` bytes (little-endian host)
  switch (size) {
    case 1: *p = static_cast<std::byte>(v); break;
    case 2: {
      auto x = static_cast<uint16_t>(v);
      std::memcpy(p, &x, 2);
      break;
    }
    case 4: {
      auto x = static_cast<uint32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    default: std::memcpy(p, &v, 8); break;
  }
}

// What a thread has seen of other blocks' global writes through release/acquire chains (the
// simulator's happens-before, see simulator.hpp): per writing block, every write made before
// that block's `barriers`-th bar.sync, and each listed thread's writes up to its store count.
struct Frontier {
  uint32_t barriers = 0;
  std::vector<std::pair<uint16_t, uint32_t>> threads;  // (thread, stores so far)
  void join(const Frontier& o) {
    barriers = std::max(barriers, o.barriers);
    for (const auto& [t, seq] : o.threads) add_thread(t, seq);
  }
  void add_thread(uint16_t t, uint32_t seq) {
    for (auto& [u, s] : threads)
      if (u == t) {
        s = std::max(s, seq);
        return;
      }
    threads.emplace_back(t, seq);
  }
  bool covers(const WordWrite& w) const {
    if (w.barriers < barriers) return true;
    for (const auto& [u, s] : threads)
      if (u == w.thread) return w.seq <= s;
    return false;
  }
};
using Knowledge = std::map<uint64_t, Frontier>;  // writing block -> what of it is visible

inline void join(Knowledge& into, const Knowledge& from) {
  for (const auto& [block, f] : from) into[block].join(f);
}

// A warp's shared-memory request being gathered: each lane's address, for one instruction.
struct WarpRequest {
  uint32_t bytes = 0;  // per lane
  uint32_t lanes = 0;  // arrived so far
  std::array<int64_t, 32> addr;
  WarpRequest() { addr.fill(-1); }
};

// A cp.async copy in flight: its bytes, read from global memory when it was issued, land at
// `dst` in shared memory when its thread's wait lets its group complete.
struct AsyncCopy {
  uint32_t dst = 0, pc = 0;
  uint8_t bytes = 0;
  std::array<std::byte, 16> data{};
};

// A wgmma issued by a warpgroup and not yet completed: it reads shared memory and writes the
// accumulators when a wgmma.wait_group lets its group complete.
// It reads its operands when issued (checked then) and keeps their addresses and bits: at
// completion the bytes must be unchanged (a GPU may read them any time in between).
struct WgmmaRecord {
  uint32_t pc = 0;
  std::vector<uint32_t> a_at, b_at;  // shared byte addresses: A (64 x 16), B (16 x n), row-major
  std::vector<uint16_t> a, b;        // their bf16 bits at issue
};
struct WarpgroupWgmma {
  std::vector<WgmmaRecord> open;                 // issued since the last commit
  std::vector<std::vector<WgmmaRecord>> groups;  // committed, oldest first
  // Per accumulator set in flight (keyed by its first register slot), what its registers must
  // hold when the next of its products completes: the values at the first issue, then each
  // product's D. Any other write to them in between is reported.
  std::map<uint32_t, std::vector<uint32_t>> expected;
};

// An mbarrier of a block (kir::Opc::MbarrierInit): the arrivals and bytes its current phase still
// waits for (bytes may run ahead of their expect_tx, below zero), the phases completed, and the
// threads waiting for a phase.
struct Mbarrier {
  uint32_t count = 0, pending = 0, phase = 0;
  int64_t tx = 0;
  uint32_t init_pc = 0;
  int16_t init_thread = -1;
  bool fenced = false;  // fence.mbarrier_init by its initializing thread since the init
  std::vector<uint32_t> waiters;
};

// One resident block: its threads' registers and states, its shared memory and the race
// detectors' records.
struct BlockRun {
  uint32_t ctaid[3] = {};
  uint64_t index = 0;  // linear index in the grid
  std::vector<uint64_t> regs;
  std::vector<uint32_t> pc;
  std::vector<State> state;
  std::vector<int64_t> since_sync;      // instructions since the thread's last synchronization
  std::vector<uint32_t> ready;          // threads that can run
  std::vector<uint32_t> warp_waiting;   // per warp: lanes waiting at a shfl.sync
  std::vector<uint32_t> pending_warps;  // warps with lanes waiting at a shfl.sync
  uint32_t at_bar = 0;                  // threads waiting at a bar.sync
  uint32_t barriers = 0;                // bar.syncs completed
  uint32_t epoch = 0;                   // shared-race epoch: unique per barrier interval of any block in this slot
  std::vector<std::byte> shared;
  std::vector<Shadow> shadow;
  // Global-memory ordering, per thread: seen (through barriers and acquires; shared by the
  // threads of a block after a bar.sync, null when empty), observed by an atomic but not yet
  // acquired by a fence, released by the last fence, stores so far.
  std::vector<std::shared_ptr<const Knowledge>> seen;
  std::vector<Knowledge> observed, released;
  std::vector<uint32_t> stores;
  bool any_seen = false;  // some thread's `seen` is not empty (barriers merge them)
  uint64_t rng = 0;
  // Bank-conflict counting: per thread and shared-access instruction, how often it ran (the
  // lanes' n-th runs of one instruction form one warp request), and the requests being gathered.
  std::vector<uint32_t> shared_runs;
  std::unordered_map<uint64_t, WarpRequest> requests;
  // The same for global accesses (ld, st, atom, cp.async sources), whose 32-byte sectors count.
  std::vector<uint32_t> global_runs;
  std::unordered_map<uint64_t, WarpRequest> global_requests;
  // cp.async: per thread its committed groups (oldest first) and the group still open, and per
  // shared byte the copies still to land there (an access to such a byte is an error: the
  // kernel lacks a cp.async.wait_group, or a barrier after it).
  std::vector<std::vector<std::vector<AsyncCopy>>> async_groups;
  std::vector<std::vector<AsyncCopy>> async_open;
  std::vector<uint16_t> async_pending;
  bool any_async = false;
  // wgmma (kernels that use it): per warpgroup its products in flight; per thread whether a
  // wgmma.fence came since its last wgmma.wait_group, and its fence.proxy.async count; per
  // shared byte its last writer (-1: none) and that writer's proxy-fence count at the write.
  std::vector<WarpgroupWgmma> wgmma;
  std::vector<uint8_t> wgmma_fenced;
  std::vector<uint32_t> proxy_fences;
  std::vector<int16_t> proxy_writer;
  std::vector<uint32_t> proxy_seq;
  std::vector<uint32_t> proxy_pc;
  // mbarriers (kernels that use them): the block's barriers by shared address, the threads
  // waiting at one, per thread the phases of each barrier it has seen complete, and per shared
  // byte the barrier (its address + 1; 0: none) and phase of the tensor copy that wrote it.
  std::map<uint32_t, Mbarrier> mbarriers;
  uint32_t at_mbarrier = 0;
  std::vector<std::map<uint32_t, uint32_t>> phases_seen;
  std::vector<std::vector<uint64_t>> maps_fenced;  // per thread: tensor maps it ran fence.proxy.tensormap on
  std::vector<uint32_t> copy_barrier, copy_phase, copy_pc;
};

inline std::atomic<uint64_t> launches{0};  // launches so far, for each launch's id

class Executor {
 public:
  Executor(const SimKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
           const SimOptions& options);

  // Admits blocks in grid order as slots free up (as a GPU's block scheduler roughly does) and
  // runs the resident ones: one after another when there is one slot, else a seeded random
  // block's random ready thread for a segment of 1 to kSegment instructions at a time.
  SimStats run();

 private:
  static constexpr uint32_t kSegment = 32;

  uint32_t below(BlockRun& b, uint32_t n) {
    b.rng += 0x9e3779b97f4a7c15ULL;
    return static_cast<uint32_t>((mix(b.rng) >> 32) * n >> 32);
  }

  void admit(BlockRun& b, uint64_t index);

  // Runs some of block b; false once every thread of it has exited.
  bool step(BlockRun& b, bool interleave);

  void complete_shuffle(uint32_t w);

  void resume_after_warp_op(uint32_t t);

  // Every thread of warpgroup g waits at the same instruction.
  bool warpgroup_arrived(uint32_t g) const;

  static bool is_warpgroup_op(Code c) { return c == Code::Wgmma || c == Code::WgmmaCommit || c == Code::WgmmaWait; }

  // wgmma, wgmma.commit_group or wgmma.wait_group for warpgroup g, once all its 128 threads wait
  // at it (its descriptors the same in every thread).
  void complete_warpgroup(uint32_t g);

  // The accumulators of a wgmma (its D registers) of the warpgroup from thread `first`, thread
  // by thread.
  std::vector<uint32_t> accumulators(uint32_t first, const Op& op);

  // A wgmma issued by the warpgroup from thread `first`: its operands, A (64 x 16) and B (16 x n)
  // of bf16, read from shared memory (and checked) now, by the PTX ISA's matrix descriptors and
  // canonical layouts, 128-byte swizzle only (descriptor bits 13-0 start >> 4, 29-16 leading
  // byte offset >> 4, 45-32 stride byte offset >> 4, 51-49 base offset, 63-62 swizzle (1: 128
  // bytes)). Before the swizzle, a K-major operand's (row r, k) is at start + 128 (r % 8) + SBO
  // (r / 8) + 2 k, an MN-major one's at start + 2 (r % 64) + LBO (r / 64) + 128 (k % 8) + SBO (k
  // / 8); the swizzle XORs address bits 4-6 with bits 7-9, whose pattern starts where the start
  // address's bits 7-9 equal the base offset (kiln gives 0: 1024-byte aligned atoms).
  WgmmaRecord issue_wgmma(uint32_t first, uint32_t pc, uint64_t desc_a, uint64_t desc_b);

  // Completes a wgmma, D = A B + D, from the operands read at issue (the shared bytes must not
  // have changed since: a GPU may read them any time before the wait) and the accumulators (which
  // no other instruction may have written since its issue). D: thread l of the group holds rows
  // 16 (l / 32) + (l % 32) / 4 (+ 8 for registers 4 j + 2, + 3) at columns 8 j + 2 (l % 4) (+ 1
  // for odd registers). Sums are exact in double, rounded once to f32 (as complete_mma).
  void complete_wgmma(uint32_t first, const WgmmaRecord& rec, WarpgroupWgmma& wg);

  // A wgmma (the async proxy) reads shared bytes that a thread wrote (the generic proxy): that
  // thread must have run fence.proxy.async since the write.
  void check_proxy_fenced(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes);

  // Shared bytes written by thread t (a store, an atomic or a landed cp.async), for
  // check_proxy_fenced.
  void note_shared_write(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes);

  // mma.sync for the warp from lane `first`: gathers A, B and C from the lanes' fragments by the
  // PTX ISA's layout tables (groupID g = lane / 4, thread-in-group q = lane % 4), computes
  // D = A B + C exactly in double and rounds each element once to f32, and scatters D back.
  // Tensor cores sum in another order and round otherwise: results on a GPU differ within f32
  // accumulation error (exact for the small integers of the known-answer tests).
  void complete_mma(uint32_t first, const Op& op);

  // ldmatrix for the warp from lane `first`: row r of matrix m is the 16 bytes at the address
  // lane 8m + r gives (checked as that lane's shared read); lane l receives, for each matrix,
  // elements 2q and 2q + 1 (q = l % 4) of row l / 4, or with .trans of column l / 4 (rows 2q and
  // 2q + 1), the first in the low half: the PTX ISA's fragment layout for ldmatrix.
  void complete_ldmatrix(uint32_t first, uint32_t pc, const Op& op);

  void complete_barrier();

  uint64_t* reg(uint32_t t) { return cur_->regs.data() + size_t{t} * nslots_; }

  uint32_t sreg(uint32_t t, kir::SReg s) const;

  // Runs thread t for at most `budget` instructions, until it waits at a bar.sync or shfl.sync,
  // or exits; true when it can run on.
  // Inlined into step(), its one caller, as it was while the simulator was one file: out of line
  // the simulator ran 5-8% slower (measured).
  [[gnu::always_inline]] inline bool run_thread(uint32_t t, int64_t budget);

  // `align`: the alignment the access needs (default: its size).
  std::byte* global(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes, const char* what, uint32_t align = 0);

  // A global load by thread t of bytes another thread wrote in this launch must be ordered
  // after that write (simulator.hpp): else a global-memory race.
  void check_global_read(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes);

  void record_global_write(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes);

  // membar.gl (fence.sc.gpu): acquires what the thread's atomics observed, and releases what it
  // has seen, its block's writes before its last bar.sync and its own writes.
  void fence(uint32_t t);

  // An atomic on the word at addr: it observes the releases made there so far (the read of a
  // read-modify-write) and adds the thread's own (when a fence preceded it).
  void atomic_sync(uint32_t t, uint64_t addr);

  std::byte* shared(uint32_t t, uint32_t pc, uint64_t raw, uint32_t bytes, const char* what, Access kind,
                    bool count = true);

  // Shared bytes that a tensor copy wrote are seen by the threads that waited for the mbarrier
  // phase it completed on (or by a bar.sync after such a wait): an access by any other thread
  // is a race. A write then makes them ordinary bytes again.
  void check_copy_seen(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes, const char* what, Access kind);

  Mbarrier& mbarrier(uint32_t t, uint32_t pc, uint32_t at, const char* what);

  void init_mbarrier(uint32_t t, uint32_t pc, uint32_t at, uint32_t count);

  void arrive_expect_tx(uint32_t t, uint32_t pc, uint32_t at, uint32_t bytes);

  // A phase whose arrivals and bytes are all in completes: its waiters run again (and now pass).
  void settle(uint32_t t, uint32_t pc, Mbarrier& m);

  // mbarrier.try_wait.parity in a loop: true when the phase of that parity has completed (the
  // current one has the other parity), else the thread waits for the next completion.
  bool wait_mbarrier(uint32_t t, uint32_t pc, uint32_t at, uint32_t parity);

  // cp.async.bulk.tensor: the box is read now and lands at once; its bytes count against the
  // barrier's current phase, and only threads that wait for that phase may touch them.
  void tensor_copy(uint32_t t, uint32_t pc, const Op& op, const uint64_t* r);

  // cp.async: the source is read now (checked as a global load), the destination is reserved
  // until the copy lands.
  void issue_async_copy(uint32_t t, uint32_t pc, uint32_t dst, uint64_t src, uint32_t bytes, uint32_t src_bytes);

  static bool has_async_copies(const BlockRun& b, uint32_t t);

  // cp.async.wait_group n: every committed group of thread t but the newest n lands.
  void wait_async_groups(uint32_t t, size_t n);

  // Lane t's part of its warp's request at instruction pc; a request is counted once all 32
  // lanes have joined, or at the block's next barrier or end (fewer active lanes).
  void gather_request(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes);
  // Adds lane t to its request in `open`; the request once its 32nd lane joined (then removed
  // from `open`, valid until the next call), else nullptr.
  const WarpRequest* join_request(std::vector<uint32_t>& runs, std::unordered_map<uint64_t, WarpRequest>& open,
                                  int32_t ops, int32_t slot, uint32_t t, int64_t addr, uint32_t bytes);
  WarpRequest done_;  // join_request's last completed request
  // The same for a global access of `bytes` at `addr` (with SimOptions::count_requests).
  // `addr` -1: the lane joins touching nothing.
  void gather_global_request(uint32_t t, uint32_t pc, int64_t addr, uint32_t bytes);

  void flush_requests(BlockRun& b) {
    for (const auto& [key, r] : b.requests) count_request(r);
    b.requests.clear();
    for (const auto& [key, r] : b.global_requests) count_global_request(r);
    b.global_requests.clear();
  }

  // The distinct 32-byte sectors a warp's global request touches.
  void count_global_request(const WarpRequest& r);

  // Phases of 32, 16 or 8 lanes (4-, 8- or 16-byte accesses); in each, the wavefronts are the
  // most distinct words any one bank holds.
  void count_request(const WarpRequest& r);

  // `record` false: checks a write without recording it (a tensor copy's, which other threads
  // then see through its mbarrier, not a bar.sync).
  void check_race(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes, Access kind, bool record = true);

  std::string coords(uint32_t x, uint32_t y, uint32_t z) const {
    return "(" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
  }
  std::string thread_name(uint32_t t) const {
    return coords(sreg(t, kir::SReg::tid_x), sreg(t, kir::SReg::tid_y), sreg(t, kir::SReg::tid_z));
  }
  std::string block_name(uint64_t index) const {
    return coords(static_cast<uint32_t>(index % grid_.x), static_cast<uint32_t>(index / grid_.x % grid_.y),
                  static_cast<uint32_t>(index / (uint64_t{grid_.x} * grid_.y)));
  }
  std::string where() const { return "in kernel '" + k_.name + "', block " + block_name(cur_->index); }

  [[noreturn]] void fail(uint32_t t, uint32_t pc, const std::string& what) const {
    throw Error("simulator: " + what + " " + where() + ", thread " + thread_name(t) + ": " + k_.text[pc]);
  }

  [[noreturn]] void fail_race(uint32_t t, uint32_t pc, Access kind, uint32_t addr, int16_t other, uint32_t other_pc,
                              Access other_kind) const;

  [[noreturn]] void fail_global_race(uint32_t t, uint32_t pc, uint64_t addr, const WordWrite& w,
                                     const std::string& why) const;

  // What a thread does when no thread can run: it exited or waits at a synchronization.
  std::string status(uint32_t t) const {
    return cur_->state[t] == State::exited ? "exited" : "wait at " + k_.text[cur_->pc[t]];
  }

  // "threads (0,0,0)..(9,0,0) wait at ...; thread (10,0,0) exited": consecutive threads of
  // [begin, end) grouped by what they do, at most a few groups.
  std::string groups(uint32_t begin, uint32_t end) const;

  [[noreturn]] void fail_divergent_shuffle(uint32_t w) const;

  [[noreturn]] void fail_mbarrier_deadlock() const {
    throw Error("simulator: deadlock " + where() +
                ": threads wait for mbarrier phases that cannot complete (arrivals or " +
                "bytes missing): " + groups(0, nthreads_));
  }

  [[noreturn]] void fail_divergent_barrier() const {
    throw Error("simulator: divergent barrier " + where() + ": not all " + std::to_string(nthreads_) +
                " threads of the block reach the same bar.sync: " + groups(0, nthreads_));
  }

  const SimKernel& k_;
  const Dim3 grid_, block_;
  DeviceMemory& mem_;
  const SimOptions options_;
  const uint64_t launch_;         // this launch's id (write records of others are stale)
  std::vector<uint64_t> params_;  // masked to their types' widths
  uint32_t nthreads_ = 0, nslots_ = 0;
  std::vector<BlockRun> slots_;       // resident blocks
  BlockRun* cur_ = nullptr;           // the block being run
  uint32_t epochs_ = 0;               // shared-race epochs handed out
  std::vector<int32_t> shared_slot_;  // per pc: its index among the shared accesses, or -1
  int32_t shared_ops_ = 0;
  std::vector<int32_t> global_slot_;  // the same among the global accesses
  int32_t global_ops_ = 0;
  std::unordered_map<uint64_t, Knowledge> sync_;  // per atomically updated word: the releases made there
  SimStats stats_;
};

// The address checks of every load and store, inline in the interpreter (simulator.cpp).
// `align`: the alignment the access needs (default: its size).
inline std::byte* Executor::global(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes, const char* what,
                                   uint32_t align) {
  if (addr % (align ? align : bytes))
    fail(t, pc,
         std::string("misaligned global ") + what + " of " + std::to_string(bytes) + " bytes at " + hex_address(addr));
  try {
    return mem_.at(addr, bytes);
  } catch (const Error& e) {
    fail(t, pc,
         std::string("out-of-bounds global ") + what + " of " + std::to_string(bytes) + " bytes at " +
             hex_address(addr) + " [" + e.what() + "]");
  }
}

inline std::byte* Executor::shared(uint32_t t, uint32_t pc, uint64_t raw, uint32_t bytes, const char* what, Access kind,
                                   bool count) {
  const auto addr = static_cast<uint32_t>(raw);  // shared addresses are 32-bit
  const auto size = cur_->shared.size();
  if (uint64_t{addr} + bytes > size)
    fail(t, pc,
         std::string("out-of-bounds shared ") + what + " of " + std::to_string(bytes) + " bytes at offset " +
             hex_address(addr) + " (the block's shared memory is " + std::to_string(size) + " bytes)");
  if (addr % bytes)
    fail(t, pc,
         std::string("misaligned shared ") + what + " of " + std::to_string(bytes) + " bytes at offset " +
             hex_address(addr));
  if (cur_->any_async)
    for (uint32_t i = 0; i < bytes; ++i)
      if (cur_->async_pending[addr + i])
        fail(t, pc,
             std::string("shared ") + what + " of byte " + hex_address(addr + i) +
                 " that a cp.async has not written yet (its thread has not waited for the group with "
                 "cp.async.wait_group, or this thread read it without a barrier after that wait)");
  if (k_.uses_mbarriers) check_copy_seen(t, pc, addr, bytes, what, kind);
  if (options_.check_races) check_race(t, pc, addr, bytes, kind);
  if (count && options_.count_requests) gather_request(t, pc, addr, bytes);
  return cur_->shared.data() + addr;
}

inline uint32_t Executor::sreg(uint32_t t, kir::SReg s) const {
  switch (s) {
    case kir::SReg::tid_x: return t % block_.x;
    case kir::SReg::tid_y: return t / block_.x % block_.y;
    case kir::SReg::tid_z: return t / (block_.x * block_.y);
    case kir::SReg::ntid_x: return block_.x;
    case kir::SReg::ntid_y: return block_.y;
    case kir::SReg::ntid_z: return block_.z;
    case kir::SReg::ctaid_x: return cur_->ctaid[0];
    case kir::SReg::ctaid_y: return cur_->ctaid[1];
    case kir::SReg::ctaid_z: return cur_->ctaid[2];
    case kir::SReg::nctaid_x: return grid_.x;
    case kir::SReg::nctaid_y: return grid_.y;
    case kir::SReg::nctaid_z: return grid_.z;
    case kir::SReg::laneid: return t % kWarp;
  }
  return 0;
}

}  // namespace kiln::sim::detail
