// The simulator's executor outside the interpreter: the launch's checks and state, blocks admitted
// as slots free up, bar.sync, shfl.sync and warp-wide operations completed once every thread
// waits, and the diagnostics that name the kernel, block, thread and instruction.
#include <algorithm>
#include <cstring>
#include <string>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/sim/executor.hpp>

namespace kiln::sim::detail {

Executor::Executor(const SimKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
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
  if (options.count_requests) {
    shared_slot_.assign(k.code.size(), -1);
    global_slot_.assign(k.code.size(), -1);
    for (size_t pc = 0; pc < k.code.size(); ++pc) {
      const Code c = k.code[pc].code;
      if (c == Code::LdS || c == Code::StS || c == Code::AtomS || c == Code::Ldmatrix || c == Code::CpAsync)
        shared_slot_[pc] = shared_ops_++;
      if (c == Code::LdG || c == Code::StG || c == Code::AtomG || c == Code::CpAsync) global_slot_[pc] = global_ops_++;
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
    b.global_runs.resize(size_t{nthreads_} * static_cast<size_t>(global_ops_));
  }
}

void Executor::admit(BlockRun& b, uint64_t index) {
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
  std::fill(b.global_runs.begin(), b.global_runs.end(), 0);
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

void Executor::complete_shuffle(uint32_t w) {
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

void Executor::resume_after_warp_op(uint32_t t) {
  BlockRun& b = *cur_;
  ++b.pc[t];
  b.state[t] = State::ready;
  b.since_sync[t] = 0;
  b.ready.push_back(t);
}

void Executor::complete_barrier() {
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

void Executor::fail_race(uint32_t t, uint32_t pc, Access kind, uint32_t addr, int16_t other, uint32_t other_pc,
                         Access other_kind) const {
  static const char* kVerb[] = {"reads", "writes", "atomically updates"};
  static const char* kPast[] = {"read", "wrote", "atomically updated"};
  const auto o = static_cast<uint32_t>(other);
  throw Error("simulator: shared-memory race " + where() + ": thread " + thread_name(t) + " " +
              kVerb[static_cast<int>(kind)] + " shared byte " + hex_address(addr) + " that thread " + thread_name(o) +
              " " + kPast[static_cast<int>(other_kind)] + " with no bar.sync in between; thread " + thread_name(t) +
              ": " + k_.text[pc] + "; thread " + thread_name(o) + ": " + k_.text[other_pc]);
}

void Executor::fail_global_race(uint32_t t, uint32_t pc, uint64_t addr, const WordWrite& w,
                                const std::string& why) const {
  const bool same_block = w.block == cur_->index;
  throw Error(std::string("simulator: ") + (same_block ? "global-memory race" : "cross-block race") + " " + where() +
              ": thread " + thread_name(t) + " reads global word " + hex_address(addr) + " that block " +
              block_name(w.block) + " thread " + thread_name(w.thread) + " wrote in this launch " + why +
              "; reader: " + k_.text[pc] + "; writer: " + k_.text[w.pc]);
}

// "threads (0,0,0)..(9,0,0) wait at ...; thread (10,0,0) exited": consecutive threads of
// [begin, end) grouped by what they do, at most a few groups.
std::string Executor::groups(uint32_t begin, uint32_t end) const {
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

void Executor::fail_divergent_shuffle(uint32_t w) const {
  const uint32_t first = w * kWarp, end = std::min(first + kWarp, nthreads_);
  std::string msg = "simulator: divergent shuffle " + where() + ", warp " + std::to_string(w) +
                    ": not all 32 lanes reach the same shfl.sync or mma.sync (full mask): " + groups(first, end);
  if (end - first < kWarp)
    msg += "; lanes " + std::to_string(end - first) + "-31 do not exist (the block has " + std::to_string(nthreads_) +
           " threads)";
  throw Error(msg);
}

}  // namespace kiln::sim::detail
