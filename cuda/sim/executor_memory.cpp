// The simulator's memory model: global accesses and their bounds, the ordering of global writes
// and reads (fences, atomics; simulator.hpp), shared-memory races, and bank-conflict counting.
#include <algorithm>
#include <cstring>
#include <string>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/sim/executor.hpp>

namespace kiln::sim::detail {

// A global load by thread t of bytes another thread wrote in this launch must be ordered
// after that write (simulator.hpp): else a global-memory race.
void Executor::check_global_read(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes) {
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

void Executor::record_global_write(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes) {
  BlockRun& b = *cur_;
  const uint32_t seq = ++b.stores[t];
  const uint64_t first = addr & ~uint64_t{3};
  WordWrite* records = mem_.write_records(first);
  for (uint64_t a = first; a < addr + bytes; a += 4)
    records[(a - first) / 4] = WordWrite{launch_, b.index, b.barriers, seq, pc, static_cast<uint16_t>(t)};
}

// membar.gl (fence.sc.gpu): acquires what the thread's atomics observed, and releases what it
// has seen, its block's writes before its last bar.sync and its own writes.
void Executor::fence(uint32_t t) {
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
void Executor::atomic_sync(uint32_t t, uint64_t addr) {
  BlockRun& b = *cur_;
  Knowledge& word = sync_[addr & ~uint64_t{3}];
  join(b.observed[t], word);
  join(word, b.released[t]);
}

// Lane t's part of its warp's request at instruction pc; a request is counted once all 32
// lanes have joined, or at the block's next barrier or end (fewer active lanes). The lanes' n-th
// runs of an instruction (its slot among the `ops` of its kind) form one request.
const WarpRequest* Executor::join_request(std::vector<uint32_t>& runs, std::unordered_map<uint64_t, WarpRequest>& open,
                                          int32_t ops, int32_t slot, uint32_t t, int64_t addr, uint32_t bytes) {
  const auto n = static_cast<uint64_t>(ops), s = static_cast<uint64_t>(slot);
  const uint32_t run = runs[size_t{t} * n + s]++;
  const uint64_t key = (uint64_t{t / kWarp} * n + s) << 32 | run;
  WarpRequest& r = open[key];
  r.bytes = std::max(r.bytes, bytes);  // a lane of a zero-filling cp.async reads less than the rest
  r.addr[t % kWarp] = addr;
  if (++r.lanes < kWarp) return nullptr;
  done_ = r;
  open.erase(key);
  return &done_;
}

void Executor::gather_request(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes) {
  BlockRun& b = *cur_;
  if (const WarpRequest* r = join_request(b.shared_runs, b.requests, shared_ops_, shared_slot_[pc], t, addr, bytes))
    count_request(*r);
}

void Executor::gather_global_request(uint32_t t, uint32_t pc, int64_t addr, uint32_t bytes) {
  BlockRun& b = *cur_;
  if (const WarpRequest* r = join_request(b.global_runs, b.global_requests, global_ops_, global_slot_[pc], t, addr, bytes))
    count_global_request(*r);
}

void Executor::count_global_request(const WarpRequest& r) {
  std::array<int64_t, 2 * kWarp> sectors;  // an access of at most 16 bytes spans at most 2
  size_t n = 0;
  for (int64_t a : r.addr)
    if (a >= 0)
      for (int64_t s = a / 32; s <= (a + r.bytes - 1) / 32; ++s) sectors[n++] = s;
  std::sort(sectors.begin(), sectors.begin() + static_cast<std::ptrdiff_t>(n));
  ++stats_.global_requests;
  stats_.global_sectors += std::unique(sectors.begin(), sectors.begin() + static_cast<std::ptrdiff_t>(n)) - sectors.begin();
}

// Phases of 32, 16 or 8 lanes (4-, 8- or 16-byte accesses); in each, the wavefronts are the
// most distinct words any one bank holds.
void Executor::count_request(const WarpRequest& r) {
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
void Executor::check_race(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes, Access kind, bool record) {
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

}  // namespace kiln::sim::detail
