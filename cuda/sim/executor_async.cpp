// The simulator's asynchronous copies and tensor-core operations: cp.async groups, mbarriers and
// tensor copies (cp.async.bulk.tensor), mma.sync, ldmatrix and wgmma with their proxy fences.
#include <algorithm>
#include <cstring>
#include <string>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/sim/executor.hpp>

namespace kiln::sim::detail {

// Every thread of warpgroup g waits at the same instruction.
bool Executor::warpgroup_arrived(uint32_t g) const {
  const BlockRun& b = *cur_;
  const uint32_t first = g * kWarpgroup;
  if (nthreads_ < first + kWarpgroup) return false;
  for (uint32_t w = 4 * g; w < 4 * g + 4; ++w)
    if (b.warp_waiting[w] != kWarp) return false;
  for (uint32_t t = first; t < first + kWarpgroup; ++t)
    if (b.pc[t] != b.pc[first]) return false;
  return true;
}

// wgmma, wgmma.commit_group or wgmma.wait_group for warpgroup g, once all its 128 threads wait
// at it (its descriptors the same in every thread).
void Executor::complete_warpgroup(uint32_t g) {
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
      stats_.tensor_flops += int64_t{2} * 64 * op.imm * 16;  // m64 nN k16 (bf16)
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
std::vector<uint32_t> Executor::accumulators(uint32_t first, const Op& op) {
  const auto n_acc = static_cast<uint32_t>(op.imm) / 2;
  std::vector<uint32_t> v(kWarpgroup * size_t{n_acc});
  for (uint32_t l = 0; l < kWarpgroup; ++l)
    for (uint32_t i = 0; i < n_acc; ++i) v[l * n_acc + i] = static_cast<uint32_t>(reg(first + l)[k_.vslots[op.b + i]]);
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
WgmmaRecord Executor::issue_wgmma(uint32_t first, uint32_t pc, uint64_t desc_a, uint64_t desc_b) {
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
    return Desc{start, static_cast<uint32_t>((d >> 16) & 0x3fff) << 4, static_cast<uint32_t>((d >> 32) & 0x3fff) << 4};
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
void Executor::complete_wgmma(uint32_t first, const WgmmaRecord& rec, WarpgroupWgmma& wg) {
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
void Executor::check_proxy_fenced(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes) {
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
void Executor::note_shared_write(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes) {
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
void Executor::complete_mma(uint32_t first, const Op& op) {
  const auto shape = static_cast<kir::MmaShape>(op.aux);
  const bool tf32 = shape == kir::MmaShape::m16n8k8_tf32;
  stats_.tensor_flops += int64_t{2} * 16 * 8 * (tf32 ? 8 : 16);
  if (tf32) stats_.tf32_tensor_flops += int64_t{2} * 16 * 8 * 8;
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
          a[g + 8 * (i % 2)][2 * q + h + 8 * (i / 2)] = half(static_cast<uint32_t>(r[s[4 + i]] >> (16 * h)) & 0xffffu);
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
void Executor::complete_ldmatrix(uint32_t first, uint32_t pc, const Op& op) {
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

// Shared bytes that a tensor copy wrote are seen by the threads that waited for the mbarrier
// phase it completed on (or by a bar.sync after such a wait): an access by any other thread
// is a race. A write then makes them ordinary bytes again.
void Executor::check_copy_seen(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes, const char* what, Access kind) {
  BlockRun& b = *cur_;
  for (uint32_t i = addr; i < addr + bytes; ++i) {
    const uint32_t bar = b.copy_barrier[i];
    if (bar == 0) continue;
    const auto& seen = b.phases_seen[t];
    const auto it = seen.find(bar - 1);
    if (it == seen.end() || it->second <= b.copy_phase[i])
      fail(t, pc,
           std::string("shared ") + what + " of byte " + hex_address(i) + " that a tensor copy (" +
               k_.text[b.copy_pc[i]] + ") writes in phase " + std::to_string(b.copy_phase[i]) + " of the mbarrier at " +
               hex_address(bar - 1) + ", which this thread has not waited for");
    if (kind != Access::read) b.copy_barrier[i] = 0;
  }
}

Mbarrier& Executor::mbarrier(uint32_t t, uint32_t pc, uint32_t at, const char* what) {
  auto it = cur_->mbarriers.find(at);
  if (it == cur_->mbarriers.end())
    fail(t, pc, std::string(what) + " on shared " + hex_address(at) + ", where no mbarrier.init made a barrier");
  return it->second;
}

void Executor::init_mbarrier(uint32_t t, uint32_t pc, uint32_t at, uint32_t count) {
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

void Executor::arrive_expect_tx(uint32_t t, uint32_t pc, uint32_t at, uint32_t bytes) {
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
void Executor::settle(uint32_t t, uint32_t pc, Mbarrier& m) {
  BlockRun& b = *cur_;
  if (m.pending != 0 || m.tx > 0) return;
  if (m.tx < 0) fail(t, pc, "more bytes landed on an mbarrier than its phase's arrivals expect (expect_tx too small)");
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
bool Executor::wait_mbarrier(uint32_t t, uint32_t pc, uint32_t at, uint32_t parity) {
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
void Executor::tensor_copy(uint32_t t, uint32_t pc, const Op& op, const uint64_t* r) {
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
         "a tensor copy with " + std::to_string(op.aux) + " coordinates of a map of rank " + std::to_string(map->rank));
  Mbarrier& m = mbarrier(t, pc, bar, "cp.async.bulk.tensor");
  if (!m.fenced)
    fail(t, pc,
         "cp.async.bulk.tensor completes on the mbarrier at " + hex_address(bar) +
             ", whose init no fence.mbarrier_init followed");
  const uint32_t align = map->swizzle == TensorSwizzle::b128 ? 1024 : 128;
  const uint64_t bytes = map->box_bytes();
  stats_.global_load_bytes += static_cast<int64_t>(bytes);
  stats_.tensor_copy_bytes += static_cast<int64_t>(bytes);
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
      const uint64_t from = base + static_cast<uint64_t>(origin[0] + lo) * eb, n = static_cast<uint64_t>(hi - lo) * eb;
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
void Executor::issue_async_copy(uint32_t t, uint32_t pc, uint32_t dst, uint64_t src, uint32_t bytes,
                                uint32_t src_bytes) {
  BlockRun& b = *cur_;
  if (src_bytes > bytes)
    fail(t, pc,
         "cp.async reads " + std::to_string(src_bytes) + " source bytes of a " + std::to_string(bytes) + "-byte copy");
  AsyncCopy c;
  c.dst = dst, c.pc = pc, c.bytes = static_cast<uint8_t>(bytes);
  stats_.global_load_bytes += src_bytes;
  // A lane that reads nothing (zero fill) still joins its warp's request, touching no sector.
  if (options_.count_requests) gather_global_request(t, pc, src_bytes > 0 ? static_cast<int64_t>(src) : -1, src_bytes);
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

bool Executor::has_async_copies(const BlockRun& b, uint32_t t) {
  if (!b.async_open[t].empty()) return true;
  for (const auto& g : b.async_groups[t])
    if (!g.empty()) return true;
  return false;
}

// cp.async.wait_group n: every committed group of thread t but the newest n lands.
void Executor::wait_async_groups(uint32_t t, size_t n) {
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

}  // namespace kiln::sim::detail
