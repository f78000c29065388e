// The SIMT simulator's executor: keeps several blocks of the grid resident and runs their threads
// in short segments of seeded random order and length (or, with one resident block, each block's
// threads in a random order to their next bar.sync, shfl.sync or exit); a block's
// synchronizations complete once none of its threads can run. Checks global and shared accesses,
// divergence, and shared- and global-memory races (the ordering model is in simulator.hpp).
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

namespace kiln::sim {

using kir::Type;

namespace {

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

uint64_t load_elem(const std::byte* p, int size) {
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

void store_elem(std::byte* p, uint64_t v, int size) {  // the low `size` bytes (little-endian host)
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

void join(Knowledge& into, const Knowledge& from) {
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

std::atomic<uint64_t> launches{0};

class Executor {
 public:
  Executor(const SimKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
           const SimOptions& options)
      : k_(k), grid_(grid), block_(block), mem_(mem), options_(options), launch_(++launches) {
    auto bad = [&](const std::string& why) { throw Error("simulator: cannot launch kernel '" + k.name + "': " + why); };
    if (params.size() != k.param_types.size())
      bad("it takes " + std::to_string(k.param_types.size()) + " parameters, " + std::to_string(params.size()) +
          " given");
    if (grid.count() == 0 || block.count() == 0) bad("empty grid or block");
    if (block.count() > 1024 || block.z > 64) bad("a block has at most 1024 threads and z <= 64");
    for (size_t i = 0; i < params.size(); ++i) {
      const int bytes = kir::type_bytes(k.param_types[i]);
      params_.push_back(bytes == 8 ? params[i] : params[i] & ((uint64_t{1} << (8 * bytes)) - 1));
    }
    nthreads_ = static_cast<uint32_t>(block.count());
    nslots_ = static_cast<uint32_t>(k.init.size());
    if (options.count_bank_conflicts) {
      shared_slot_.assign(k.code.size(), -1);
      for (size_t pc = 0; pc < k.code.size(); ++pc) {
        const Code c = k.code[pc].code;
        if (c == Code::LdS || c == Code::StS || c == Code::AtomS || c == Code::Ldmatrix || c == Code::CpAsync)
          shared_slot_[pc] = shared_ops_++;
      }
    }
    const uint64_t resident = std::clamp<uint64_t>(options.resident_blocks, 1, grid.count());
    slots_.resize(static_cast<size_t>(resident));
    for (BlockRun& b : slots_) {
      b.regs.resize(size_t{nthreads_} * nslots_);
      b.pc.resize(nthreads_);
      b.state.resize(nthreads_);
      b.since_sync.resize(nthreads_);
      b.warp_waiting.resize((nthreads_ + kWarp - 1) / kWarp);
      b.shared.resize(static_cast<size_t>(k.shared_bytes));
      b.async_groups.resize(nthreads_);
      b.async_open.resize(nthreads_);
      b.async_pending.resize(b.shared.size());
      if (options.check_races) {
        b.shadow.resize(b.shared.size());
        b.seen.resize(nthreads_);
        b.observed.resize(nthreads_);
        b.released.resize(nthreads_);
      }
      if (k.uses_wgmma) {
        b.wgmma.resize((nthreads_ + kWarpgroup - 1) / kWarpgroup);
        b.wgmma_fenced.resize(nthreads_);
        b.proxy_fences.resize(nthreads_);
        b.proxy_writer.resize(b.shared.size());
        b.proxy_seq.resize(b.shared.size());
        b.proxy_pc.resize(b.shared.size());
      }
      if (k.uses_mbarriers) {
        b.phases_seen.resize(nthreads_);
        b.maps_fenced.resize(nthreads_);
        b.copy_barrier.resize(b.shared.size());
        b.copy_phase.resize(b.shared.size());
        b.copy_pc.resize(b.shared.size());
      }
      b.stores.resize(nthreads_);
      b.shared_runs.resize(size_t{nthreads_} * static_cast<size_t>(shared_ops_));
    }
  }

  // Admits blocks in grid order as slots free up (as a GPU's block scheduler roughly does) and
  // runs the resident ones: one after another when there is one slot, else a seeded random
  // block's random ready thread for a segment of 1 to kSegment instructions at a time.
  SimStats run() {
    const uint64_t total = grid_.count();
    uint64_t next = 0;
    std::vector<size_t> active;
    for (size_t i = 0; i < slots_.size(); ++i) {
      admit(slots_[i], next++);
      active.push_back(i);
    }
    const bool interleave = slots_.size() > 1;
    uint64_t pick = mix(options_.schedule_seed) ^ 0x5bd1e995;
    while (!active.empty()) {
      size_t which = 0;
      if (interleave) {
        pick += 0x9e3779b97f4a7c15ULL;
        which = static_cast<size_t>((mix(pick) >> 32) * active.size() >> 32);
      }
      BlockRun& b = slots_[active[which]];
      cur_ = &b;
      if (step(b, interleave)) continue;
      if (next < total) {
        admit(b, next++);
      } else {
        active[which] = active.back();
        active.pop_back();
      }
    }
    return stats_;
  }

 private:
  static constexpr uint32_t kSegment = 32;

  uint32_t below(BlockRun& b, uint32_t n) {
    b.rng += 0x9e3779b97f4a7c15ULL;
    return static_cast<uint32_t>((mix(b.rng) >> 32) * n >> 32);
  }

  void admit(BlockRun& b, uint64_t index) {
    b.index = index;
    b.ctaid[0] = static_cast<uint32_t>(index % grid_.x);
    b.ctaid[1] = static_cast<uint32_t>(index / grid_.x % grid_.y);
    b.ctaid[2] = static_cast<uint32_t>(index / (uint64_t{grid_.x} * grid_.y));
    std::fill(b.shared.begin(), b.shared.end(), kSharedPoison);
    b.epoch = ++epochs_;
    b.barriers = 0;
    b.at_bar = 0;
    b.ready.clear();
    b.pending_warps.clear();
    std::fill(b.warp_waiting.begin(), b.warp_waiting.end(), 0);
    for (uint32_t t = 0; t < nthreads_; ++t) {
      std::copy(k_.init.begin(), k_.init.end(), b.regs.begin() + size_t{t} * nslots_);
      b.pc[t] = 0;
      b.state[t] = State::ready;
      b.since_sync[t] = 0;
      b.stores[t] = 0;
      b.ready.push_back(t);
    }
    if (options_.check_races)
      for (uint32_t t = 0; t < nthreads_; ++t) {
        b.seen[t].reset();
        b.observed[t].clear();
        b.released[t].clear();
      }
    b.any_seen = false;
    b.rng = mix(options_.schedule_seed) ^ mix(index + 0x51ed2701);
    std::fill(b.shared_runs.begin(), b.shared_runs.end(), 0);
    if (k_.uses_wgmma) {
      for (auto& w : b.wgmma) w = WarpgroupWgmma{};
      std::fill(b.wgmma_fenced.begin(), b.wgmma_fenced.end(), 0);
      std::fill(b.proxy_fences.begin(), b.proxy_fences.end(), 0);
      std::fill(b.proxy_writer.begin(), b.proxy_writer.end(), -1);
    }
    if (k_.uses_mbarriers) {
      b.mbarriers.clear();
      b.at_mbarrier = 0;
      for (auto& seen : b.phases_seen) seen.clear();
      for (auto& fenced : b.maps_fenced) fenced.clear();
      std::fill(b.copy_barrier.begin(), b.copy_barrier.end(), 0);
    }
    if (b.any_async) {
      for (auto& g : b.async_groups) g.clear();
      for (auto& o : b.async_open) o.clear();
      std::fill(b.async_pending.begin(), b.async_pending.end(), 0);
      b.any_async = false;
    }
  }

  // Runs some of block b; false once every thread of it has exited.
  bool step(BlockRun& b, bool interleave) {
    if (b.ready.empty()) {
      // Every thread waits or has exited: complete the shuffles, then the barrier.
      std::sort(b.pending_warps.begin(), b.pending_warps.end());  // errors name the first warp, whatever the schedule
      // Warp operations first; then warpgroup ones, whose other warps may have been finishing a
      // warp operation: a warpgroup not all at its instruction waits while anything else ran,
      // and is an error (complete_warpgroup says which warp) when nothing did.
      std::vector<uint32_t> groups;
      for (uint32_t w : b.pending_warps) {
        if (is_warpgroup_op(k_.code[b.pc[w * kWarp]].code))
          groups.push_back(w);
        else
          complete_shuffle(w);
      }
      const bool progressed = !b.ready.empty();
      b.pending_warps.clear();
      for (uint32_t w : groups) {
        if (b.warp_waiting[w] == 0) continue;  // completed with its warpgroup
        if (progressed && !warpgroup_arrived(w / 4))
          b.pending_warps.push_back(w);
        else
          complete_warpgroup(w / 4);
      }
      if (!b.ready.empty()) return true;
      flush_requests(b);
      if (b.at_mbarrier > 0) fail_mbarrier_deadlock();
      if (b.at_bar == 0) return false;  // all exited
      complete_barrier();
      return true;
    }
    if (!interleave) {  // each ready thread, in a random order, to its next synchronization
      for (size_t i = b.ready.size(); i > 1; --i)
        std::swap(b.ready[i - 1], b.ready[below(b, static_cast<uint32_t>(i))]);
      const std::vector<uint32_t> run = std::move(b.ready);
      b.ready.clear();
      for (uint32_t t : run) run_thread(t, std::numeric_limits<int64_t>::max());
      return true;
    }
    const uint32_t i = below(b, static_cast<uint32_t>(b.ready.size()));
    const uint32_t t = b.ready[i];
    if (!run_thread(t, 1 + below(b, kSegment))) {
      b.ready[i] = b.ready.back();
      b.ready.pop_back();
    }
    return true;
  }

  void complete_shuffle(uint32_t w) {
    BlockRun& b = *cur_;
    const uint32_t first = w * kWarp;
    if (nthreads_ - first < kWarp || b.warp_waiting[w] != kWarp) fail_divergent_shuffle(w);
    for (uint32_t l = 1; l < kWarp; ++l)
      if (b.pc[first + l] != b.pc[first]) fail_divergent_shuffle(w);
    b.warp_waiting[w] = 0;
    const Op& op = k_.code[b.pc[first]];
    if (op.code == Code::Mma || op.code == Code::Ldmatrix) {
      if (op.code == Code::Mma)
        complete_mma(first, op);
      else
        complete_ldmatrix(first, b.pc[first], op);
      for (uint32_t l = 0; l < kWarp; ++l) resume_after_warp_op(first + l);
      return;
    }
    uint32_t value[kWarp];
    for (uint32_t l = 0; l < kWarp; ++l) value[l] = static_cast<uint32_t>(reg(first + l)[op.a]);
    // PTX's shfl.sync: c packs the clamp value (bits 0-4) and the segment mask (bits 8-12).
    for (uint32_t l = 0; l < kWarp; ++l) {
      uint64_t* r = reg(first + l);
      const auto bl = static_cast<int32_t>(r[op.b] & 31), c = static_cast<int32_t>(r[op.c]);
      const int32_t seg = (c >> 8) & 31, max_lane = (static_cast<int32_t>(l) & seg) | (c & 31 & ~seg);
      const int32_t min_lane = static_cast<int32_t>(l) & seg, lane = static_cast<int32_t>(l);
      int32_t j = lane;
      bool ok = false;
      switch (static_cast<kir::ShflMode>(op.aux)) {
        case kir::ShflMode::up:
          j = lane - bl;
          ok = j >= max_lane;
          break;
        case kir::ShflMode::down:
          j = lane + bl;
          ok = j <= max_lane;
          break;
        case kir::ShflMode::bfly:
          j = lane ^ bl;
          ok = j <= max_lane;
          break;
        case kir::ShflMode::idx:
          j = min_lane | (bl & ~seg);
          ok = j <= max_lane;
          break;
      }
      r[op.d] = value[ok ? j : lane];
      resume_after_warp_op(first + l);
    }
  }

  void resume_after_warp_op(uint32_t t) {
    BlockRun& b = *cur_;
    ++b.pc[t];
    b.state[t] = State::ready;
    b.since_sync[t] = 0;
    b.ready.push_back(t);
  }

  // Every thread of warpgroup g waits at the same instruction.
  bool warpgroup_arrived(uint32_t g) const {
    const BlockRun& b = *cur_;
    const uint32_t first = g * kWarpgroup;
    if (nthreads_ < first + kWarpgroup) return false;
    for (uint32_t w = 4 * g; w < 4 * g + 4; ++w)
      if (b.warp_waiting[w] != kWarp) return false;
    for (uint32_t t = first; t < first + kWarpgroup; ++t)
      if (b.pc[t] != b.pc[first]) return false;
    return true;
  }

  static bool is_warpgroup_op(Code c) { return c == Code::Wgmma || c == Code::WgmmaCommit || c == Code::WgmmaWait; }

  // wgmma, wgmma.commit_group or wgmma.wait_group for warpgroup g, once all its 128 threads wait
  // at it (its descriptors the same in every thread).
  void complete_warpgroup(uint32_t g) {
    BlockRun& b = *cur_;
    const uint32_t first = g * kWarpgroup, pc = b.pc[first];
    const Op& op = k_.code[pc];
    const char* name = op.code == Code::Wgmma         ? "wgmma"
                       : op.code == Code::WgmmaCommit ? "wgmma.commit_group"
                                                      : "wgmma.wait_group";
    if (nthreads_ < first + kWarpgroup)
      fail(first, pc,
           std::string(name) + " needs whole warpgroups of 128 threads; the block has " + std::to_string(nthreads_));
    for (uint32_t w = 4 * g; w < 4 * g + 4; ++w)
      if (b.warp_waiting[w] != kWarp)
        fail(first, pc,
             std::string(name) + ": warp " + std::to_string(w) + " of warpgroup " + std::to_string(g) +
                 " is not at it while the others wait (divergent warpgroup)");
    for (uint32_t t = first; t < first + kWarpgroup; ++t)
      if (b.pc[t] != pc)
        fail(t, b.pc[t],
             std::string(name) + ": thread " + std::to_string(t) + " of warpgroup " + std::to_string(g) +
                 " waits at another instruction (divergent warpgroup)");
    WarpgroupWgmma& wg = b.wgmma[g];
    switch (op.code) {
      case Code::Wgmma: {
        const uint64_t desc_a = reg(first)[op.a], desc_b = reg(first)[op.c];
        for (uint32_t t = first; t < first + kWarpgroup; ++t)
          if (reg(t)[op.a] != desc_a || reg(t)[op.c] != desc_b)
            fail(t, pc,
                 "wgmma: thread " + std::to_string(t) + "'s matrix descriptors differ from thread " +
                     std::to_string(first) + "'s (they must be the same across the warpgroup)");
        const uint32_t key = k_.vslots[op.b];
        if (!wg.expected.contains(key)) wg.expected[key] = accumulators(first, op);
        wg.open.push_back(issue_wgmma(first, pc, desc_a, desc_b));
        break;
      }
      case Code::WgmmaCommit:
        wg.groups.push_back(std::move(wg.open));
        wg.open.clear();
        break;
      default:  // WgmmaWait
        while (wg.groups.size() > static_cast<size_t>(op.imm)) {
          for (const WgmmaRecord& rec : wg.groups.front()) complete_wgmma(first, rec, wg);
          wg.groups.erase(wg.groups.begin());
        }
        if (wg.groups.empty() && wg.open.empty()) wg.expected.clear();
        for (uint32_t t = first; t < first + kWarpgroup; ++t) b.wgmma_fenced[t] = 0;
        break;
    }
    for (uint32_t w = 4 * g; w < 4 * g + 4; ++w) b.warp_waiting[w] = 0;
    for (uint32_t t = first; t < first + kWarpgroup; ++t) resume_after_warp_op(t);
  }

  // The accumulators of a wgmma (its D registers) of the warpgroup from thread `first`, thread
  // by thread.
  std::vector<uint32_t> accumulators(uint32_t first, const Op& op) {
    const auto n_acc = static_cast<uint32_t>(op.imm) / 2;
    std::vector<uint32_t> v(kWarpgroup * size_t{n_acc});
    for (uint32_t l = 0; l < kWarpgroup; ++l)
      for (uint32_t i = 0; i < n_acc; ++i)
        v[l * n_acc + i] = static_cast<uint32_t>(reg(first + l)[k_.vslots[op.b + i]]);
    return v;
  }

  // A wgmma issued by the warpgroup from thread `first`: its operands, A (64 x 16) and B (16 x n)
  // of bf16, read from shared memory (and checked) now, by the PTX ISA's matrix descriptors and
  // canonical layouts, 128-byte swizzle only (descriptor bits 13-0 start >> 4, 29-16 leading
  // byte offset >> 4, 45-32 stride byte offset >> 4, 51-49 base offset, 63-62 swizzle (1: 128
  // bytes)). Before the swizzle, a K-major operand's (row r, k) is at start + 128 (r % 8) + SBO
  // (r / 8) + 2 k, an MN-major one's at start + 2 (r % 64) + LBO (r / 64) + 128 (k % 8) + SBO (k
  // / 8); the swizzle XORs address bits 4-6 with bits 7-9, whose pattern starts where the start
  // address's bits 7-9 equal the base offset (kiln gives 0: 1024-byte aligned atoms).
  WgmmaRecord issue_wgmma(uint32_t first, uint32_t pc, uint64_t desc_a, uint64_t desc_b) {
    const Op& op = k_.code[pc];
    const auto n = static_cast<uint32_t>(op.imm);
    struct Desc {
      uint32_t start, lbo, sbo;
    };
    auto decode = [&](uint64_t d, const char* which) {
      const uint64_t used = 0x3fffull | 0x3fffull << 16 | 0x3fffull << 32 | 0x7ull << 49 | 0x3ull << 62;
      const auto start = static_cast<uint32_t>(d & 0x3fff) << 4;
      if ((d >> 62) != 1 || ((d >> 49) & 7) != 0 || (d & ~used) != 0 || ((start >> 7) & 7) != 0)
        fail(first, pc,
             std::string("wgmma: the ") + which + " descriptor " + hex_address(d) +
                 " is not one the simulator models (128-byte swizzle, base offset 0, a start whose bits 7-9 are "
                 "0, unused bits zero)");
      return Desc{start, static_cast<uint32_t>((d >> 16) & 0x3fff) << 4,
                  static_cast<uint32_t>((d >> 32) & 0x3fff) << 4};
    };
    const Desc da = decode(desc_a, "A"), db = decode(desc_b, "B");
    auto address = [](const Desc& d, bool mn_major, uint32_t r, uint32_t k) {
      const uint32_t at = mn_major ? d.start + 2 * (r % 64) + d.lbo * (r / 64) + 128 * (k % 8) + d.sbo * (k / 8)
                                   : d.start + 128 * (r % 8) + d.sbo * (r / 8) + 2 * k;
      return at ^ ((at & 0x380u) >> 3);
    };
    WgmmaRecord rec;
    rec.pc = pc;
    auto take = [&](uint32_t at, const char* which, std::vector<uint32_t>& where, std::vector<uint16_t>& bits) {
      const std::byte* p = shared(first, pc, at, 2, which, Access::read, false);
      check_proxy_fenced(first, pc, at, 2);
      where.push_back(at);
      bits.push_back(static_cast<uint16_t>(load_elem(p, 2)));
    };
    for (uint32_t r = 0; r < 64; ++r)
      for (uint32_t k = 0; k < 16; ++k) take(address(da, op.aux & 1, r, k), "wgmma A operand read", rec.a_at, rec.a);
    for (uint32_t k = 0; k < 16; ++k)
      for (uint32_t c = 0; c < n; ++c) take(address(db, op.aux & 2, c, k), "wgmma B operand read", rec.b_at, rec.b);
    return rec;
  }

  // Completes a wgmma, D = A B + D, from the operands read at issue (the shared bytes must not
  // have changed since: a GPU may read them any time before the wait) and the accumulators (which
  // no other instruction may have written since its issue). D: thread l of the group holds rows
  // 16 (l / 32) + (l % 32) / 4 (+ 8 for registers 4 j + 2, + 3) at columns 8 j + 2 (l % 4) (+ 1
  // for odd registers). Sums are exact in double, rounded once to f32 (as complete_mma).
  void complete_wgmma(uint32_t first, const WgmmaRecord& rec, WarpgroupWgmma& wg) {
    const Op& op = k_.code[rec.pc];
    const auto n = static_cast<uint32_t>(op.imm);
    auto check_unchanged = [&](const std::vector<uint32_t>& at, const std::vector<uint16_t>& bits) {
      for (size_t i = 0; i < at.size(); ++i)
        if (static_cast<uint16_t>(load_elem(cur_->shared.data() + at[i], 2)) != bits[i])
          fail(first, rec.pc,
               "shared bytes " + hex_address(at[i]) +
                   " that this wgmma reads changed between its issue and the wgmma.wait_group that completes it (a "
                   "stage refilled while a product in flight may still read it)");
    };
    check_unchanged(rec.a_at, rec.a);
    check_unchanged(rec.b_at, rec.b);
    std::vector<uint32_t>& expected = wg.expected[k_.vslots[op.b]];
    if (accumulators(first, op) != expected)
      fail(first, rec.pc,
           "the accumulators of this wgmma were written between its issue and the wgmma.wait_group that completes it");
    const uint32_t* d = k_.vslots.data() + op.b;
    for (uint32_t l = 0; l < kWarpgroup; ++l) {
      uint64_t* r = reg(first + l);
      for (uint32_t i = 0; i < n / 2; ++i) {
        const uint32_t row = 16 * (l / 32) + (l % 32) / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
        double sum = f32_of(r[d[i]]);
        for (uint32_t k = 0; k < 16; ++k)
          sum += static_cast<double>(bf16_to_float(rec.a[row * 16 + k])) *
                 static_cast<double>(bf16_to_float(rec.b[k * n + col]));
        r[d[i]] = std::bit_cast<uint32_t>(static_cast<float>(sum));
      }
    }
    expected = accumulators(first, op);
  }

  // A wgmma (the async proxy) reads shared bytes that a thread wrote (the generic proxy): that
  // thread must have run fence.proxy.async since the write.
  void check_proxy_fenced(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes) {
    const BlockRun& b = *cur_;
    for (uint32_t i = addr; i < addr + bytes; ++i) {
      const int16_t w = b.proxy_writer[i];
      if (w >= 0 && b.proxy_fences[static_cast<size_t>(w)] <= b.proxy_seq[i])
        fail(t, pc,
             "wgmma reads shared byte " + hex_address(i) + " that thread " + std::to_string(w) + " wrote (" +
                 k_.text[b.proxy_pc[i]] + ") with no fence.proxy.async.shared::cta after the write");
    }
  }

  // Shared bytes written by thread t (a store, an atomic or a landed cp.async), for
  // check_proxy_fenced.
  void note_shared_write(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes) {
    BlockRun& b = *cur_;
    for (uint32_t i = addr; i < addr + bytes; ++i) {
      b.proxy_writer[i] = static_cast<int16_t>(t);
      b.proxy_seq[i] = b.proxy_fences[t];
      b.proxy_pc[i] = pc;
    }
  }

  // mma.sync for the warp from lane `first`: gathers A, B and C from the lanes' fragments by the
  // PTX ISA's layout tables (groupID g = lane / 4, thread-in-group q = lane % 4), computes
  // D = A B + C exactly in double and rounds each element once to f32, and scatters D back.
  // Tensor cores sum in another order and round otherwise: results on a GPU differ within f32
  // accumulation error (exact for the small integers of the known-answer tests).
  void complete_mma(uint32_t first, const Op& op) {
    const auto shape = static_cast<kir::MmaShape>(op.aux);
    const bool tf32 = shape == kir::MmaShape::m16n8k8_tf32;
    const int depth = tf32 ? 8 : 16;
    const uint32_t* s = k_.vslots.data() + op.b;  // D[4], A[4], B[2], C[4]
    auto half = [&](uint32_t bits16) {
      return shape == kir::MmaShape::m16n8k16_f16 ? f16_to_float(static_cast<uint16_t>(bits16))
                                                  : bf16_to_float(static_cast<uint16_t>(bits16));
    };
    auto as_f32 = [](uint64_t slot) { return std::bit_cast<float>(static_cast<uint32_t>(slot)); };
    double a[16][16] = {}, bm[16][8] = {}, c[16][8] = {};
    for (uint32_t l = 0; l < kWarp; ++l) {
      const uint64_t* r = reg(first + l);
      const int g = static_cast<int>(l / 4), q = static_cast<int>(l % 4);
      for (int i = 0; i < 4; ++i) c[g + 8 * (i / 2)][2 * q + i % 2] = as_f32(r[s[10 + i]]);
      if (tf32) {
        // tf32 reads the sign, exponent and top 10 mantissa bits of each f32.
        auto t = [&](uint64_t slot) { return std::bit_cast<float>(static_cast<uint32_t>(slot) & 0xffffe000u); };
        for (int i = 0; i < 4; ++i) a[g + 8 * (i % 2)][q + 4 * (i / 2)] = t(r[s[4 + i]]);
        for (int i = 0; i < 2; ++i) bm[q + 4 * i][g] = t(r[s[8 + i]]);
      } else {
        for (int i = 0; i < 4; ++i)
          for (int h = 0; h < 2; ++h)  // register i holds elements 2i (low half) and 2i + 1
            a[g + 8 * (i % 2)][2 * q + h + 8 * (i / 2)] =
                half(static_cast<uint32_t>(r[s[4 + i]] >> (16 * h)) & 0xffffu);
        for (int i = 0; i < 2; ++i)
          for (int h = 0; h < 2; ++h)
            bm[2 * q + h + 8 * i][g] = half(static_cast<uint32_t>(r[s[8 + i]] >> (16 * h)) & 0xffffu);
      }
    }
    for (uint32_t l = 0; l < kWarp; ++l) {
      uint64_t* r = reg(first + l);
      const int g = static_cast<int>(l / 4), q = static_cast<int>(l % 4);
      for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * q + i % 2;
        double sum = c[row][col];
        for (int k = 0; k < depth; ++k) sum += a[row][k] * bm[k][col];
        r[s[i]] = std::bit_cast<uint32_t>(static_cast<float>(sum));
      }
    }
  }

  // ldmatrix for the warp from lane `first`: row r of matrix m is the 16 bytes at the address
  // lane 8m + r gives (checked as that lane's shared read); lane l receives, for each matrix,
  // elements 2q and 2q + 1 (q = l % 4) of row l / 4, or with .trans of column l / 4 (rows 2q and
  // 2q + 1), the first in the low half: the PTX ISA's fragment layout for ldmatrix.
  void complete_ldmatrix(uint32_t first, uint32_t pc, const Op& op) {
    const int count = op.aux;
    const bool trans = op.size != 0;
    uint16_t m[4][8][8];
    for (int mat = 0; mat < count; ++mat)
      for (int row = 0; row < 8; ++row) {
        const uint32_t lane = first + static_cast<uint32_t>(8 * mat + row);
        const std::byte* p = shared(lane, pc, reg(lane)[op.a], 16, "ldmatrix row", Access::read);
        for (int col = 0; col < 8; ++col) m[mat][row][col] = static_cast<uint16_t>(load_elem(p + 2 * col, 2));
      }
    for (uint32_t l = 0; l < kWarp; ++l) {
      const int g = static_cast<int>(l / 4), q = static_cast<int>(l % 4);
      for (int mat = 0; mat < count; ++mat) {
        const uint16_t lo = trans ? m[mat][2 * q][g] : m[mat][g][2 * q];
        const uint16_t hi = trans ? m[mat][2 * q + 1][g] : m[mat][g][2 * q + 1];
        reg(first + l)[k_.vslots[op.b + static_cast<uint32_t>(mat)]] = uint32_t{lo} | uint32_t{hi} << 16;
      }
    }
  }

  void complete_barrier() {
    BlockRun& b = *cur_;
    if (b.at_bar != nthreads_) fail_divergent_barrier();
    for (uint32_t t = 1; t < nthreads_; ++t)
      if (b.pc[t] != b.pc[0]) fail_divergent_barrier();
    for (uint32_t t = 0; t < nthreads_; ++t) {
      ++b.pc[t];
      b.state[t] = State::ready;
      b.since_sync[t] = 0;
      b.ready.push_back(t);
    }
    // What any thread of the block has seen of other blocks, every thread has seen now.
    if (options_.check_races && b.any_seen) {
      auto all = std::make_shared<Knowledge>();
      const Knowledge* last = nullptr;  // threads share one map since the last barrier: join it once
      for (uint32_t t = 0; t < nthreads_; ++t)
        if (b.seen[t] && b.seen[t].get() != last) join(*all, *(last = b.seen[t].get()));
      for (uint32_t t = 0; t < nthreads_; ++t) b.seen[t] = all;
    }
    if (k_.uses_mbarriers) {  // what any thread saw of the barriers' phases, every thread has seen
      std::map<uint32_t, uint32_t> all;
      for (const auto& seen : b.phases_seen)
        for (const auto& [at, phases] : seen) all[at] = std::max(all[at], phases);
      for (auto& seen : b.phases_seen) seen = all;
    }
    b.at_bar = 0;
    ++b.barriers;
    b.epoch = ++epochs_;
    ++stats_.barriers;
  }

  uint64_t* reg(uint32_t t) { return cur_->regs.data() + size_t{t} * nslots_; }

  uint32_t sreg(uint32_t t, kir::SReg s) const {
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

  // Runs thread t for at most `budget` instructions, until it waits at a bar.sync or shfl.sync,
  // or exits; true when it can run on.
  bool run_thread(uint32_t t, int64_t budget);

  // `align`: the alignment the access needs (default: its size).
  std::byte* global(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes, const char* what, uint32_t align = 0) {
    if (addr % (align ? align : bytes))
      fail(
          t, pc,
          std::string("misaligned global ") + what + " of " + std::to_string(bytes) + " bytes at " + hex_address(addr));
    try {
      return mem_.at(addr, bytes);
    } catch (const Error& e) {
      fail(t, pc,
           std::string("out-of-bounds global ") + what + " of " + std::to_string(bytes) + " bytes at " +
               hex_address(addr) + " [" + e.what() + "]");
    }
  }

  // A global load by thread t of bytes another thread wrote in this launch must be ordered
  // after that write (simulator.hpp): else a global-memory race.
  void check_global_read(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes) {
    const BlockRun& b = *cur_;
    const uint64_t first = addr & ~uint64_t{3};
    const WordWrite* records = mem_.find_write_records(first);
    if (!records) return;
    for (uint64_t a = first; a < addr + bytes; a += 4) {
      const WordWrite& w = records[(a - first) / 4];
      if (w.launch != launch_) continue;
      if (w.block == b.index) {
        if (w.thread != t && w.barriers == b.barriers) fail_global_race(t, pc, a, w, "with no bar.sync in between");
        continue;
      }
      const Knowledge* seen = b.seen[t].get();
      const auto it = seen ? seen->find(w.block) : Knowledge::const_iterator{};
      if (!seen || it == seen->end() || !it->second.covers(w))
        fail_global_race(t, pc, a, w,
                         "with nothing ordering the write before the read (the writer's bar.sync, membar.gl and an "
                         "atomic, then this block's atomic on that word and membar.gl)");
    }
  }

  void record_global_write(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes) {
    BlockRun& b = *cur_;
    const uint32_t seq = ++b.stores[t];
    const uint64_t first = addr & ~uint64_t{3};
    WordWrite* records = mem_.write_records(first);
    for (uint64_t a = first; a < addr + bytes; a += 4)
      records[(a - first) / 4] = WordWrite{launch_, b.index, b.barriers, seq, pc, static_cast<uint16_t>(t)};
  }

  // membar.gl (fence.sc.gpu): acquires what the thread's atomics observed, and releases what it
  // has seen, its block's writes before its last bar.sync and its own writes.
  void fence(uint32_t t) {
    BlockRun& b = *cur_;
    if (!b.observed[t].empty()) {
      auto more = std::make_shared<Knowledge>(b.seen[t] ? *b.seen[t] : Knowledge{});
      join(*more, b.observed[t]);
      b.seen[t] = std::move(more);
      b.observed[t].clear();
      b.any_seen = true;
    }
    b.released[t] = b.seen[t] ? *b.seen[t] : Knowledge{};
    Frontier& own = b.released[t][b.index];
    own.barriers = b.barriers;
    own.add_thread(static_cast<uint16_t>(t), b.stores[t]);
  }

  // An atomic on the word at addr: it observes the releases made there so far (the read of a
  // read-modify-write) and adds the thread's own (when a fence preceded it).
  void atomic_sync(uint32_t t, uint64_t addr) {
    BlockRun& b = *cur_;
    Knowledge& word = sync_[addr & ~uint64_t{3}];
    join(b.observed[t], word);
    join(word, b.released[t]);
  }

  std::byte* shared(uint32_t t, uint32_t pc, uint64_t raw, uint32_t bytes, const char* what, Access kind,
                    bool count = true) {
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
    if (count && options_.count_bank_conflicts) gather_request(t, pc, addr, bytes);
    return cur_->shared.data() + addr;
  }

  // Shared bytes that a tensor copy wrote are seen by the threads that waited for the mbarrier
  // phase it completed on (or by a bar.sync after such a wait): an access by any other thread
  // is a race. A write then makes them ordinary bytes again.
  void check_copy_seen(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes, const char* what, Access kind) {
    BlockRun& b = *cur_;
    for (uint32_t i = addr; i < addr + bytes; ++i) {
      const uint32_t bar = b.copy_barrier[i];
      if (bar == 0) continue;
      const auto& seen = b.phases_seen[t];
      const auto it = seen.find(bar - 1);
      if (it == seen.end() || it->second <= b.copy_phase[i])
        fail(t, pc,
             std::string("shared ") + what + " of byte " + hex_address(i) + " that a tensor copy (" +
                 k_.text[b.copy_pc[i]] + ") writes in phase " + std::to_string(b.copy_phase[i]) +
                 " of the mbarrier at " + hex_address(bar - 1) + ", which this thread has not waited for");
      if (kind != Access::read) b.copy_barrier[i] = 0;
    }
  }

  Mbarrier& mbarrier(uint32_t t, uint32_t pc, uint32_t at, const char* what) {
    auto it = cur_->mbarriers.find(at);
    if (it == cur_->mbarriers.end())
      fail(t, pc, std::string(what) + " on shared " + hex_address(at) + ", where no mbarrier.init made a barrier");
    return it->second;
  }

  void init_mbarrier(uint32_t t, uint32_t pc, uint32_t at, uint32_t count) {
    std::byte* p = shared(t, pc, at, 8, "mbarrier.init", Access::write);
    if (count == 0 || count >= (1u << 20))
      fail(t, pc, "mbarrier.init with " + std::to_string(count) + " arrivals (1 to 2^20 - 1)");
    if (auto it = cur_->mbarriers.find(at); it != cur_->mbarriers.end() && !it->second.waiters.empty())
      fail(t, pc, "mbarrier.init of the barrier at " + hex_address(at) + " while threads wait on it");
    std::fill(p, p + 8, std::byte{0});
    Mbarrier& m = cur_->mbarriers[at] = Mbarrier{};
    m.count = m.pending = count;
    m.init_pc = pc;
    m.init_thread = static_cast<int16_t>(t);
  }

  void arrive_expect_tx(uint32_t t, uint32_t pc, uint32_t at, uint32_t bytes) {
    shared(t, pc, at, 8, "mbarrier arrival", Access::atomic);
    Mbarrier& m = mbarrier(t, pc, at, "mbarrier.arrive.expect_tx");
    if (m.pending == 0)
      fail(t, pc,
           "mbarrier.arrive.expect_tx: the barrier at " + hex_address(at) + " has had its " + std::to_string(m.count) +
               " arrivals this phase");
    m.tx += bytes;
    --m.pending;
    settle(t, pc, m);
  }

  // A phase whose arrivals and bytes are all in completes: its waiters run again (and now pass).
  void settle(uint32_t t, uint32_t pc, Mbarrier& m) {
    BlockRun& b = *cur_;
    if (m.pending != 0 || m.tx > 0) return;
    if (m.tx < 0)
      fail(t, pc, "more bytes landed on an mbarrier than its phase's arrivals expect (expect_tx too small)");
    ++m.phase;
    m.pending = m.count;
    for (uint32_t w : m.waiters) {
      b.state[w] = State::ready;
      b.ready.push_back(w);
      --b.at_mbarrier;
    }
    m.waiters.clear();
  }

  // mbarrier.try_wait.parity in a loop: true when the phase of that parity has completed (the
  // current one has the other parity), else the thread waits for the next completion.
  bool wait_mbarrier(uint32_t t, uint32_t pc, uint32_t at, uint32_t parity) {
    BlockRun& b = *cur_;
    shared(t, pc, at, 8, "mbarrier wait", Access::atomic);
    Mbarrier& m = mbarrier(t, pc, at, "mbarrier.try_wait.parity");
    if ((m.phase & 1) != (parity & 1)) {
      uint32_t& seen = b.phases_seen[t][at];
      seen = std::max(seen, m.phase);
      return true;
    }
    b.state[t] = State::at_mbarrier;
    ++b.at_mbarrier;
    m.waiters.push_back(t);
    return false;
  }

  // cp.async.bulk.tensor: the box is read now and lands at once; its bytes count against the
  // barrier's current phase, and only threads that wait for that phase may touch them.
  void tensor_copy(uint32_t t, uint32_t pc, const Op& op, const uint64_t* r) {
    BlockRun& b = *cur_;
    const auto dst = static_cast<uint32_t>(r[op.a]);
    const uint64_t map_at = r[op.b];
    const auto bar = static_cast<uint32_t>(r[op.c]);
    const std::byte* raw = global(t, pc, map_at, kTensorMapBytes, "tensor map read", kTensorMapAlign);
    const std::optional<TensorMap> map = decode_tensor_map(raw);
    const auto& fenced = b.maps_fenced[t];
    if (std::find(fenced.begin(), fenced.end(), map_at) == fenced.end())
      fail(t, pc,
           "the tensor map at " + hex_address(map_at) +
               " in global memory is used with no fence.proxy.tensormap::generic.acquire by this thread first");
    if (!map)
      fail(t, pc,
           "the tensor map at " + hex_address(map_at) + " is not one cuTensorMapEncodeTiled (the fake driver's) made");
    if (map->rank != op.aux)
      fail(t, pc,
           "a tensor copy with " + std::to_string(op.aux) + " coordinates of a map of rank " +
               std::to_string(map->rank));
    Mbarrier& m = mbarrier(t, pc, bar, "cp.async.bulk.tensor");
    if (!m.fenced)
      fail(t, pc,
           "cp.async.bulk.tensor completes on the mbarrier at " + hex_address(bar) +
               ", whose init no fence.mbarrier_init followed");
    const uint32_t align = map->swizzle == TensorSwizzle::b128 ? 1024 : 128;
    const uint64_t bytes = map->box_bytes();
    if (dst % align || dst + bytes > b.shared.size())
      fail(t, pc,
           "a tensor copy of " + std::to_string(bytes) + " bytes to shared " + hex_address(dst) + " (" +
               std::to_string(align) + "-byte aligned, within the block's " + std::to_string(b.shared.size()) + ")");
    std::array<int64_t, kTensorMapMaxRank> origin{};
    for (uint32_t d = 0; d < map->rank; ++d)
      origin[d] = static_cast<int32_t>(static_cast<uint32_t>(r[k_.vslots[static_cast<size_t>(op.imm) + d]]));
    if (options_.check_races) check_race(t, pc, dst, static_cast<uint32_t>(bytes), Access::write, false);
    const uint32_t eb = map->element_bytes;
    std::array<uint32_t, kTensorMapMaxRank> index{};
    const uint64_t rows = bytes / (uint64_t{map->box[0]} * eb);
    for (uint64_t row = 0; row < rows; ++row) {
      uint64_t rest = row, base = map->address;
      bool inside = true;
      for (uint32_t d = 1; d < map->rank; ++d) {
        index[d] = static_cast<uint32_t>(rest % map->box[d]);
        rest /= map->box[d];
        const int64_t c = origin[d] + index[d];
        inside = inside && c >= 0 && static_cast<uint64_t>(c) < map->dims[d];
        base += static_cast<uint64_t>(c) * map->strides[d];
      }
      // The row's elements inside the tensor along dimension 0: [lo, hi) of the box.
      const int64_t lo = std::clamp<int64_t>(-origin[0], 0, map->box[0]);
      const int64_t hi = std::clamp<int64_t>(static_cast<int64_t>(map->dims[0]) - origin[0], 0, map->box[0]);
      const std::byte* src = nullptr;
      if (inside && lo < hi) {
        const uint64_t from = base + static_cast<uint64_t>(origin[0] + lo) * eb,
                       n = static_cast<uint64_t>(hi - lo) * eb;
        src = global(t, pc, from, static_cast<uint32_t>(n), "tensor copy read", eb);
        if (options_.check_races) check_global_read(t, pc, from, static_cast<uint32_t>(n));
      }
      for (uint32_t x = 0; x < map->box[0]; ++x) {
        index[0] = x;
        const uint32_t at = dst + map->box_offset(index);
        const bool in = src && x >= lo && x < hi;
        for (uint32_t i = 0; i < eb; ++i) {
          b.shared[at + i] = in ? src[(x - lo) * eb + i] : std::byte{0};
          b.copy_barrier[at + i] = bar + 1;
          b.copy_phase[at + i] = m.phase;
          b.copy_pc[at + i] = pc;
          if (k_.uses_wgmma) b.proxy_writer[at + i] = -1;  // the async proxy wrote it: no fence needed
        }
      }
    }
    m.tx -= static_cast<int64_t>(bytes);
    settle(t, pc, m);
  }

  // cp.async: the source is read now (checked as a global load), the destination is reserved
  // until the copy lands.
  void issue_async_copy(uint32_t t, uint32_t pc, uint32_t dst, uint64_t src, uint32_t bytes, uint32_t src_bytes) {
    BlockRun& b = *cur_;
    if (src_bytes > bytes)
      fail(
          t, pc,
          "cp.async reads " + std::to_string(src_bytes) + " source bytes of a " + std::to_string(bytes) + "-byte copy");
    AsyncCopy c;
    c.dst = dst, c.pc = pc, c.bytes = static_cast<uint8_t>(bytes);
    if (src_bytes > 0) {
      const std::byte* p = global(t, pc, src, src_bytes, "cp.async source", bytes);  // aligned as the whole copy
      if (options_.check_races) check_global_read(t, pc, src, src_bytes);
      std::copy(p, p + src_bytes, c.data.begin());
    }
    shared(t, pc, dst, bytes, "cp.async destination", Access::write);  // bounds, alignment, races now
    b.any_async = true;
    for (uint32_t i = 0; i < bytes; ++i) ++b.async_pending[dst + i];
    b.async_open[t].push_back(c);
  }

  static bool has_async_copies(const BlockRun& b, uint32_t t) {
    if (!b.async_open[t].empty()) return true;
    for (const auto& g : b.async_groups[t])
      if (!g.empty()) return true;
    return false;
  }

  // cp.async.wait_group n: every committed group of thread t but the newest n lands.
  void wait_async_groups(uint32_t t, size_t n) {
    BlockRun& b = *cur_;
    auto& groups = b.async_groups[t];
    while (groups.size() > n) {
      for (const AsyncCopy& c : groups.front()) {
        for (uint32_t i = 0; i < c.bytes; ++i) --b.async_pending[c.dst + i];
        // Written now, as far as the race detector is concerned: other threads need a barrier.
        if (options_.check_races) check_race(t, c.pc, c.dst, c.bytes, Access::write);
        std::copy(c.data.begin(), c.data.begin() + c.bytes, b.shared.data() + c.dst);
        if (k_.uses_wgmma) note_shared_write(t, c.pc, c.dst, c.bytes);
      }
      groups.erase(groups.begin());
    }
  }

  // Lane t's part of its warp's request at instruction pc; a request is counted once all 32
  // lanes have joined, or at the block's next barrier or end (fewer active lanes).
  void gather_request(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes) {
    BlockRun& b = *cur_;
    const auto slot = static_cast<uint32_t>(shared_slot_[pc]);
    const uint32_t run = b.shared_runs[size_t{t} * static_cast<size_t>(shared_ops_) + slot]++;
    const uint64_t key = (uint64_t{t / kWarp} * static_cast<uint64_t>(shared_ops_) + slot) << 32 | run;
    WarpRequest& r = b.requests[key];
    r.bytes = bytes;
    r.addr[t % kWarp] = addr;
    if (++r.lanes == kWarp) {
      count_request(r);
      b.requests.erase(key);
    }
  }

  void flush_requests(BlockRun& b) {
    for (const auto& [key, r] : b.requests) count_request(r);
    b.requests.clear();
  }

  // Phases of 32, 16 or 8 lanes (4-, 8- or 16-byte accesses); in each, the wavefronts are the
  // most distinct words any one bank holds.
  void count_request(const WarpRequest& r) {
    const uint32_t per_phase = r.bytes >= 16 ? 8 : r.bytes == 8 ? 16 : 32;
    const uint32_t words = std::max<uint32_t>(1, r.bytes / 4);
    ++stats_.shared_requests;
    for (uint32_t first = 0; first < kWarp; first += per_phase) {
      std::array<std::vector<int64_t>, 32> bank;
      bool any = false;
      for (uint32_t l = first; l < first + per_phase; ++l) {
        if (r.addr[l] < 0) continue;
        any = true;
        for (uint32_t w = 0; w < words; ++w) {
          const int64_t word = r.addr[l] / 4 + w;
          auto& held = bank[static_cast<size_t>(word % 32)];
          if (std::find(held.begin(), held.end(), word) == held.end()) held.push_back(word);
        }
      }
      if (!any) continue;
      size_t most = 1;
      for (const auto& held : bank) most = std::max(most, held.size());
      stats_.shared_wavefronts += static_cast<int64_t>(most);
      stats_.bank_conflicts += static_cast<int64_t>(most) - 1;
    }
  }

  // `record` false: checks a write without recording it (a tensor copy's, which other threads
  // then see through its mbarrier, not a bar.sync).
  void check_race(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes, Access kind, bool record = true) {
    const auto me = static_cast<int16_t>(t);
    auto other = [me](const int16_t(&ids)[2]) {
      return ids[0] >= 0 && ids[0] != me ? 0 : ids[1] >= 0 && ids[1] != me ? 1 : -1;
    };
    auto add = [me, pc](int16_t(&ids)[2], uint32_t(&pcs)[2]) {
      for (int i = 0; i < 2; ++i) {
        if (ids[i] == me) return;
        if (ids[i] < 0) {
          ids[i] = me;
          pcs[i] = pc;
          return;
        }
      }
    };
    const uint32_t epoch = cur_->epoch;
    for (uint32_t a = addr; a < addr + bytes; ++a) {
      Shadow& s = cur_->shadow[a];
      if (s.epoch != epoch) s = Shadow{.epoch = epoch};
      if (s.writer >= 0 && s.writer != me) fail_race(t, pc, kind, a, s.writer, s.writer_pc, Access::write);
      if (kind != Access::atomic)
        if (int i = other(s.atomic); i >= 0) fail_race(t, pc, kind, a, s.atomic[i], s.atomic_pc[i], Access::atomic);
      if (kind != Access::read)
        if (int i = other(s.reader); i >= 0) fail_race(t, pc, kind, a, s.reader[i], s.reader_pc[i], Access::read);
      if (!record) continue;
      switch (kind) {
        case Access::read: add(s.reader, s.reader_pc); break;
        case Access::atomic: add(s.atomic, s.atomic_pc); break;
        case Access::write:
          s.writer = me;
          s.writer_pc = pc;
          break;
      }
    }
  }

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
                              Access other_kind) const {
    static const char* kVerb[] = {"reads", "writes", "atomically updates"};
    static const char* kPast[] = {"read", "wrote", "atomically updated"};
    const auto o = static_cast<uint32_t>(other);
    throw Error("simulator: shared-memory race " + where() + ": thread " + thread_name(t) + " " +
                kVerb[static_cast<int>(kind)] + " shared byte " + hex_address(addr) + " that thread " + thread_name(o) +
                " " + kPast[static_cast<int>(other_kind)] + " with no bar.sync in between; thread " + thread_name(t) +
                ": " + k_.text[pc] + "; thread " + thread_name(o) + ": " + k_.text[other_pc]);
  }

  [[noreturn]] void fail_global_race(uint32_t t, uint32_t pc, uint64_t addr, const WordWrite& w,
                                     const std::string& why) const {
    const bool same_block = w.block == cur_->index;
    throw Error(std::string("simulator: ") + (same_block ? "global-memory race" : "cross-block race") + " " + where() +
                ": thread " + thread_name(t) + " reads global word " + hex_address(addr) + " that block " +
                block_name(w.block) + " thread " + thread_name(w.thread) + " wrote in this launch " + why +
                "; reader: " + k_.text[pc] + "; writer: " + k_.text[w.pc]);
  }

  // What a thread does when no thread can run: it exited or waits at a synchronization.
  std::string status(uint32_t t) const {
    return cur_->state[t] == State::exited ? "exited" : "wait at " + k_.text[cur_->pc[t]];
  }

  // "threads (0,0,0)..(9,0,0) wait at ...; thread (10,0,0) exited": consecutive threads of
  // [begin, end) grouped by what they do, at most a few groups.
  std::string groups(uint32_t begin, uint32_t end) const {
    std::string out;
    int shown = 0;
    for (uint32_t i = begin; i < end;) {
      uint32_t j = i + 1;
      const std::string s = status(i);
      while (j < end && status(j) == s) ++j;
      if (shown++ == 6) return out + "; ...";
      const std::string who =
          j - i == 1 ? "thread " + thread_name(i) : "threads " + thread_name(i) + ".." + thread_name(j - 1);
      out += (out.empty() ? "" : "; ") + who + " " + s;
      i = j;
    }
    return out;
  }

  [[noreturn]] void fail_divergent_shuffle(uint32_t w) const {
    const uint32_t first = w * kWarp, end = std::min(first + kWarp, nthreads_);
    std::string msg = "simulator: divergent shuffle " + where() + ", warp " + std::to_string(w) +
                      ": not all 32 lanes reach the same shfl.sync or mma.sync (full mask): " + groups(first, end);
    if (end - first < kWarp)
      msg += "; lanes " + std::to_string(end - first) + "-31 do not exist (the block has " + std::to_string(nthreads_) +
             " threads)";
    throw Error(msg);
  }

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
  std::unordered_map<uint64_t, Knowledge> sync_;  // per atomically updated word: the releases made there
  SimStats stats_;
};

// The interpreter. Slots hold zero-extended values: 32-bit results are stored through W32.
#define U32(x) static_cast<uint32_t>(r[op.x])
#define S32(x) static_cast<int32_t>(static_cast<uint32_t>(r[op.x]))
#define U64(x) r[op.x]
#define S64(x) static_cast<int64_t>(r[op.x])
#define F32(x) f32_of(r[op.x])
#define F64(x) f64_of(r[op.x])
#define W32(v) r[op.d] = static_cast<uint32_t>(v)
#define SETP_CASES(first, get)                                                            \
  case first: r[op.d] = get(a) == get(b); break;                                          \
  case static_cast<Code>(static_cast<int>(first) + 1): r[op.d] = get(a) != get(b); break; \
  case static_cast<Code>(static_cast<int>(first) + 2): r[op.d] = get(a) < get(b); break;  \
  case static_cast<Code>(static_cast<int>(first) + 3): r[op.d] = get(a) <= get(b); break; \
  case static_cast<Code>(static_cast<int>(first) + 4): r[op.d] = get(a) > get(b); break;  \
  case static_cast<Code>(static_cast<int>(first) + 5): r[op.d] = get(a) >= get(b); break;

bool Executor::run_thread(uint32_t t, int64_t budget) {
  BlockRun& blk = *cur_;
  const Op* const code = k_.code.data();
  const uint32_t* const vslots = k_.vslots.data();
  uint64_t* const r = reg(t);
  const bool races = options_.check_races;
  uint32_t pc = blk.pc[t];
  int64_t n = 0;
  bool runs_on = false;
  for (;;) {
    if (n == budget) {
      runs_on = true;
      break;
    }
    const Op& op = code[pc];
    ++n;
    switch (op.code) {
      case Code::Bra:
        if (blk.since_sync[t] + n > kMaxRun)
          fail(t, pc,
               "runaway thread (" + std::to_string(blk.since_sync[t] + n) + " instructions without a synchronization)");
        pc = static_cast<uint32_t>(op.imm);
        continue;
      case Code::BrTrue: pc = r[op.a] ? static_cast<uint32_t>(op.imm) : pc + 1; continue;
      case Code::BrFalse: pc = r[op.a] ? pc + 1 : static_cast<uint32_t>(op.imm); continue;
      case Code::Exit:
        if (blk.any_async && has_async_copies(blk, t))
          fail(t, pc, "thread exits with cp.async copies it never waited for");
        if (k_.uses_wgmma) {
          const WarpgroupWgmma& wg = blk.wgmma[t / kWarpgroup];
          if (!wg.open.empty() || !wg.groups.empty())
            fail(t, pc, "thread exits with wgmma products its warpgroup never waited for");
        }
        blk.state[t] = State::exited;
        goto stop;
      case Code::CpAsync:
        issue_async_copy(t, pc, static_cast<uint32_t>(r[op.a]), r[op.b], op.size, static_cast<uint32_t>(r[op.c]));
        break;
      case Code::CpAsyncCommit:
        blk.async_groups[t].push_back(std::move(blk.async_open[t]));
        blk.async_open[t].clear();
        break;
      case Code::CpAsyncWait: wait_async_groups(t, static_cast<size_t>(op.imm)); break;
      case Code::Bar:
        blk.state[t] = State::at_bar;
        ++blk.at_bar;
        goto stop;
      case Code::Wgmma:
        if (!blk.wgmma_fenced[t])
          fail(t, pc, "wgmma with no wgmma.fence since the thread's last wgmma.wait_group (or its start)");
        [[fallthrough]];
      case Code::WgmmaCommit:
      case Code::WgmmaWait:
      case Code::Shfl:
      case Code::Mma:
      case Code::Ldmatrix:
        blk.state[t] = State::at_shfl;
        if (blk.warp_waiting[t / kWarp]++ == 0) blk.pending_warps.push_back(t / kWarp);
        goto stop;
      case Code::Fence:
        if (races) fence(t);
        break;
      case Code::WgmmaFence: blk.wgmma_fenced[t] = 1; break;
      case Code::FenceProxyAsync:
        if (k_.uses_wgmma) ++blk.proxy_fences[t];
        break;
      case Code::MbarrierInit:
        init_mbarrier(t, pc, static_cast<uint32_t>(r[op.a]), static_cast<uint32_t>(r[op.b]));
        break;
      case Code::FenceMbarrierInit:
        for (auto& [at, m] : blk.mbarriers)
          if (m.init_thread == static_cast<int16_t>(t)) m.fenced = true;
        break;
      case Code::MbarrierArriveExpectTx:
        arrive_expect_tx(t, pc, static_cast<uint32_t>(r[op.a]), static_cast<uint32_t>(r[op.b]));
        break;
      case Code::MbarrierWait:
        if (!wait_mbarrier(t, pc, static_cast<uint32_t>(r[op.a]), static_cast<uint32_t>(r[op.b]))) goto stop;
        break;
      case Code::TensorCopy: tensor_copy(t, pc, op, r); break;
      case Code::FenceProxyTensormap: blk.maps_fenced[t].push_back(r[op.a]); break;
      case Code::Mov: r[op.d] = r[op.a]; break;
      case Code::Selp: r[op.d] = r[op.c] ? r[op.a] : r[op.b]; break;
      case Code::LdParam: r[op.d] = params_[static_cast<size_t>(op.imm)]; break;
      case Code::Sreg: r[op.d] = sreg(t, static_cast<kir::SReg>(op.aux)); break;
      case Code::Add32: W32(U32(a) + U32(b)); break;
      case Code::Sub32: W32(U32(a) - U32(b)); break;
      case Code::Mul32: W32(U32(a) * U32(b)); break;
      case Code::Mad32: W32(U32(a) * U32(b) + U32(c)); break;
      case Code::Neg32: W32(0u - U32(a)); break;
      case Code::Not32: W32(~U32(a)); break;
      case Code::Shl32: W32(U32(b) >= 32 ? 0u : U32(a) << U32(b)); break;
      case Code::ShrU32: W32(U32(b) >= 32 ? 0u : U32(a) >> U32(b)); break;
      case Code::ShrS32: W32(S32(a) >> std::min(U32(b), 31u)); break;
      case Code::MulHiU32: W32(uint64_t{U32(a)} * U32(b) >> 32); break;
      case Code::MulHiS32: W32(int64_t{S32(a)} * S32(b) >> 32); break;
      case Code::MulWideU32: r[op.d] = uint64_t{U32(a)} * U32(b); break;
      case Code::MulWideS32: r[op.d] = static_cast<uint64_t>(int64_t{S32(a)} * S32(b)); break;
      // Division by zero gives all ones (quotient) or the dividend (remainder): PTX leaves it
      // unspecified, the simulator must not crash. INT_MIN / -1 wraps.
      case Code::DivU32: W32(U32(b) ? U32(a) / U32(b) : ~0u); break;
      case Code::DivS32:
        W32(S32(b) == 0 ? ~0u : S32(b) == -1 ? 0u - U32(a) : static_cast<uint32_t>(S32(a) / S32(b)));
        break;
      case Code::RemU32: W32(U32(b) ? U32(a) % U32(b) : U32(a)); break;
      case Code::RemS32: W32(S32(b) == 0 ? U32(a) : S32(b) == -1 ? 0u : static_cast<uint32_t>(S32(a) % S32(b))); break;
      case Code::MinU32: W32(std::min(U32(a), U32(b))); break;
      case Code::MinS32: W32(std::min(S32(a), S32(b))); break;
      case Code::MaxU32: W32(std::max(U32(a), U32(b))); break;
      case Code::MaxS32: W32(std::max(S32(a), S32(b))); break;
      case Code::AbsS32: W32(S32(a) < 0 ? 0u - U32(a) : U32(a)); break;
      case Code::Add64: r[op.d] = U64(a) + U64(b); break;
      case Code::Sub64: r[op.d] = U64(a) - U64(b); break;
      case Code::Mul64: r[op.d] = U64(a) * U64(b); break;
      case Code::Mad64: r[op.d] = U64(a) * U64(b) + U64(c); break;
      case Code::Neg64: r[op.d] = 0 - U64(a); break;
      case Code::Not64: r[op.d] = ~U64(a); break;
      case Code::Shl64: r[op.d] = U32(b) >= 64 ? 0 : U64(a) << U32(b); break;
      case Code::ShrU64: r[op.d] = U32(b) >= 64 ? 0 : U64(a) >> U32(b); break;
      case Code::ShrS64: r[op.d] = static_cast<uint64_t>(S64(a) >> std::min(U32(b), 63u)); break;
      case Code::MulHiU64:
        r[op.d] = static_cast<uint64_t>((static_cast<unsigned __int128>(U64(a)) * U64(b)) >> 64);
        break;
      case Code::MulHiS64: r[op.d] = static_cast<uint64_t>((static_cast<__int128>(S64(a)) * S64(b)) >> 64); break;
      case Code::DivU64: r[op.d] = U64(b) ? U64(a) / U64(b) : ~uint64_t{0}; break;
      case Code::DivS64:
        r[op.d] = S64(b) == 0 ? ~uint64_t{0} : S64(b) == -1 ? 0 - U64(a) : static_cast<uint64_t>(S64(a) / S64(b));
        break;
      case Code::RemU64: r[op.d] = U64(b) ? U64(a) % U64(b) : U64(a); break;
      case Code::RemS64:
        r[op.d] = S64(b) == 0 ? U64(a) : S64(b) == -1 ? 0 : static_cast<uint64_t>(S64(a) % S64(b));
        break;
      case Code::MinU64: r[op.d] = std::min(U64(a), U64(b)); break;
      case Code::MinS64: r[op.d] = static_cast<uint64_t>(std::min(S64(a), S64(b))); break;
      case Code::MaxU64: r[op.d] = std::max(U64(a), U64(b)); break;
      case Code::MaxS64: r[op.d] = static_cast<uint64_t>(std::max(S64(a), S64(b))); break;
      case Code::AbsS64: r[op.d] = S64(a) < 0 ? 0 - U64(a) : U64(a); break;
      case Code::And: r[op.d] = U64(a) & U64(b); break;
      case Code::Or: r[op.d] = U64(a) | U64(b); break;
      case Code::Xor: r[op.d] = U64(a) ^ U64(b); break;
      case Code::NotPred: r[op.d] = U64(a) ^ 1; break;
      case Code::AddF32: r[op.d] = slot_of(F32(a) + F32(b)); break;
      case Code::SubF32: r[op.d] = slot_of(F32(a) - F32(b)); break;
      case Code::MulF32: r[op.d] = slot_of(F32(a) * F32(b)); break;
      case Code::DivF32: r[op.d] = slot_of(F32(a) / F32(b)); break;
      case Code::FmaF32: r[op.d] = slot_of(std::fma(F32(a), F32(b), F32(c))); break;
      case Code::MinF32: r[op.d] = slot_of(ptx_min(F32(a), F32(b))); break;
      case Code::MaxF32: r[op.d] = slot_of(ptx_max(F32(a), F32(b))); break;
      case Code::NegF32: r[op.d] = U64(a) ^ 0x80000000u; break;
      case Code::AbsF32: r[op.d] = U64(a) & 0x7fffffffu; break;
      case Code::SqrtF32: r[op.d] = slot_of(std::sqrt(F32(a))); break;
      case Code::RoundTf32: {  // to nearest on the 13 dropped bits, ties away from zero; NaN and inf kept
        const auto x = static_cast<uint32_t>(r[op.a]);
        r[op.d] = (x & 0x7f800000u) == 0x7f800000u ? x : ((x + 0x1000u) & 0xffffe000u);
        break;
      }
      case Code::PackBf16x2:  // cvt.rn.bf16x2.f32: to nearest even, NaN canonical (the host's bf16 rounding)
        r[op.d] = static_cast<uint64_t>(f32_to_bf16(F32(a)).bits) | static_cast<uint64_t>(f32_to_bf16(F32(b)).bits)
                                                                        << 16;
        break;
      case Code::Approx: r[op.d] = slot_of(approx(static_cast<kir::Opc>(op.aux), F32(a))); break;
      case Code::AddF64: r[op.d] = slot_of(F64(a) + F64(b)); break;
      case Code::SubF64: r[op.d] = slot_of(F64(a) - F64(b)); break;
      case Code::MulF64: r[op.d] = slot_of(F64(a) * F64(b)); break;
      case Code::DivF64: r[op.d] = slot_of(F64(a) / F64(b)); break;
      case Code::FmaF64: r[op.d] = slot_of(std::fma(F64(a), F64(b), F64(c))); break;
      case Code::MinF64: r[op.d] = slot_of(ptx_min(F64(a), F64(b))); break;
      case Code::MaxF64: r[op.d] = slot_of(ptx_max(F64(a), F64(b))); break;
      case Code::NegF64: r[op.d] = U64(a) ^ (uint64_t{1} << 63); break;
      case Code::AbsF64: r[op.d] = U64(a) & ~(uint64_t{1} << 63); break;
      case Code::Half:
        r[op.d] = half_arith(static_cast<kir::Opc>(op.aux), static_cast<Type>(op.size), U64(a), U64(b), U64(c));
        break;
        SETP_CASES(Code::SetpU32, U32)
        SETP_CASES(Code::SetpS32, S32)
        SETP_CASES(Code::SetpU64, U64)
        SETP_CASES(Code::SetpS64, S64)
        SETP_CASES(Code::SetpF32, F32)  // C++ comparisons are PTX's: ordered, except != (unordered)
        SETP_CASES(Code::SetpF64, F64)
      case Code::SetpGeneric:
        r[op.d] = compare_generic(static_cast<kir::Cmp>(op.aux), static_cast<Type>(op.size), U64(a), U64(b));
        break;
      case Code::SextS32: r[op.d] = static_cast<uint64_t>(int64_t{S32(a)}); break;
      case Code::Trunc32: W32(U64(a)); break;
      case Code::CvtF32F64: r[op.d] = slot_of(static_cast<double>(F32(a))); break;
      case Code::CvtF64F32: r[op.d] = slot_of(static_cast<float>(F64(a))); break;
      case Code::CvtU32F32: r[op.d] = slot_of(static_cast<float>(U32(a))); break;
      case Code::CvtS32F32: r[op.d] = slot_of(static_cast<float>(S32(a))); break;
      case Code::CvtF32U32: W32(float_to_int<uint32_t>(F32(a))); break;
      case Code::CvtF32S32: W32(float_to_int<int32_t>(F32(a))); break;
      case Code::Cvt: r[op.d] = convert(U64(a), static_cast<Type>(op.aux), static_cast<Type>(op.size)); break;
      case Code::LdG: {
        const uint64_t addr = U64(a) + static_cast<uint64_t>(op.imm);
        const std::byte* p = global(t, pc, addr, uint32_t{op.size} * op.aux, "load");
        if (races) check_global_read(t, pc, addr, uint32_t{op.size} * op.aux);
        for (int i = 0; i < op.aux; ++i) r[vslots[op.b + i]] = load_elem(p + i * op.size, op.size);
        break;
      }
      case Code::StG: {
        const uint64_t addr = U64(a) + static_cast<uint64_t>(op.imm);
        std::byte* p = global(t, pc, addr, uint32_t{op.size} * op.aux, "store");
        if (races) record_global_write(t, pc, addr, uint32_t{op.size} * op.aux);
        for (int i = 0; i < op.aux; ++i) store_elem(p + i * op.size, r[vslots[op.b + i]], op.size);
        break;
      }
      case Code::LdS: {
        const std::byte* p =
            shared(t, pc, U64(a) + static_cast<uint64_t>(op.imm), uint32_t{op.size} * op.aux, "load", Access::read);
        for (int i = 0; i < op.aux; ++i) r[vslots[op.b + i]] = load_elem(p + i * op.size, op.size);
        break;
      }
      case Code::StS: {
        std::byte* p =
            shared(t, pc, U64(a) + static_cast<uint64_t>(op.imm), uint32_t{op.size} * op.aux, "store", Access::write);
        for (int i = 0; i < op.aux; ++i) store_elem(p + i * op.size, r[vslots[op.b + i]], op.size);
        if (k_.uses_wgmma)
          note_shared_write(t, pc, static_cast<uint32_t>(U64(a) + static_cast<uint64_t>(op.imm)),
                            uint32_t{op.size} * op.aux);
        break;
      }
      case Code::AtomG:
      case Code::AtomS: {
        const uint64_t addr = U64(a) + static_cast<uint64_t>(op.imm);
        std::byte* p = op.code == Code::AtomG ? global(t, pc, addr, 4, "atomic add")
                                              : shared(t, pc, addr, 4, "atomic add", Access::atomic);
        if (races && op.code == Code::AtomG) atomic_sync(t, addr);
        const auto old = static_cast<uint32_t>(load_elem(p, 4));
        const uint32_t sum = op.aux ? std::bit_cast<uint32_t>(std::bit_cast<float>(old) + F32(b)) : old + U32(b);
        store_elem(p, sum, 4);
        if (op.code == Code::AtomS && k_.uses_wgmma) note_shared_write(t, pc, static_cast<uint32_t>(addr), 4);
        r[op.d] = old;
        break;
      }
    }
    ++pc;
  }
stop:  // at a synchronization (pc stays on it until it completes) or exited, or out of budget
  blk.pc[t] = pc;
  blk.since_sync[t] = runs_on ? blk.since_sync[t] + n : 0;
  stats_.instructions += n;
  return runs_on;
}

#undef U32
#undef S32
#undef U64
#undef S64
#undef F32
#undef F64
#undef W32
#undef SETP_CASES

// The host floating-point environment IEEE arithmetic needs, for the duration of a simulation:
// round to nearest and subnormals kept. The CPU executor sets flush-to-zero (FTZ and DAZ) on its
// threads, which only PTX's .ftz instructions do (and the simulator does those explicitly).
class IeeeEnvironment {
 public:
  IeeeEnvironment() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(kFlushToZero | kDenormalsAreZero | kRounding)); }
  ~IeeeEnvironment() { _mm_setcsr(saved_); }
  IeeeEnvironment(const IeeeEnvironment&) = delete;
  IeeeEnvironment& operator=(const IeeeEnvironment&) = delete;

 private:
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040, kRounding = 0x6000;
  unsigned saved_;
};

}  // namespace

SimStats simulate(const SimKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
                  const SimOptions& options) {
  const IeeeEnvironment ieee;
  return Executor(k, grid, block, params, mem, options).run();
}

SimStats simulate(const kir::Kernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
                  const SimOptions& options) {
  return simulate(*prepare(k), grid, block, params, mem, options);
}

}  // namespace kiln::sim
