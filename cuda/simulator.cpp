// The SIMT simulator's executor: runs a prepared kernel block by block; within a block each thread
// runs, in a seeded random order, until it reaches a bar.sync, a shfl.sync or its exit, and then
// the synchronizations complete. Checks global and shared accesses, divergence and races.
#include "cuda/simulator.hpp"

#include <xmmintrin.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "circuit/error.hpp"
#include "cuda/sim_internal.hpp"

namespace kiln::sim {

using kir::Type;

namespace {

enum class State : uint8_t { ready, at_bar, at_shfl, exited };
enum class Access : uint8_t { read, write, atomic };

constexpr uint32_t kWarp = 32;
// A thread that runs this many instructions without reaching a synchronization point is taken to
// loop forever (a for-loop whose step is zero, say): an error instead of a hung test.
constexpr int64_t kMaxRun = int64_t{1} << 32;
constexpr std::byte kSharedPoison{0xff};  // unwritten shared memory reads as NaN / all ones

// splitmix64: draws the schedule.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint32_t below(uint32_t n) {
    s_ += 0x9e3779b97f4a7c15ULL;
    return static_cast<uint32_t>((mix(s_) >> 32) * n >> 32);
  }

 private:
  uint64_t s_;
};

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

class Executor {
 public:
  Executor(const SimKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
           const SimOptions& options)
      : k_(k), grid_(grid), block_(block), mem_(mem), options_(options) {
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
    regs_.resize(size_t{nthreads_} * nslots_);
    pc_.resize(nthreads_);
    state_.resize(nthreads_);
    warp_waiting_.resize((nthreads_ + kWarp - 1) / kWarp);
    shared_.resize(static_cast<size_t>(k.shared_bytes));
    if (options.check_races) shadow_.resize(shared_.size());
  }

  SimStats run() {
    for (uint32_t z = 0; z < grid_.z; ++z)
      for (uint32_t y = 0; y < grid_.y; ++y)
        for (uint32_t x = 0; x < grid_.x; ++x) {
          ctaid_[0] = x, ctaid_[1] = y, ctaid_[2] = z;
          run_block();
        }
    return stats_;
  }

 private:
  void run_block() {
    std::fill(shared_.begin(), shared_.end(), kSharedPoison);
    ++epoch_;
    for (uint32_t t = 0; t < nthreads_; ++t) {
      std::copy(k_.init.begin(), k_.init.end(), regs_.begin() + size_t{t} * nslots_);
      pc_[t] = 0;
      state_[t] = State::ready;
      ready_.push_back(t);
    }
    const uint64_t block_index = (uint64_t{ctaid_[2]} * grid_.y + ctaid_[1]) * grid_.x + ctaid_[0];
    Rng rng(mix(options_.schedule_seed) ^ mix(block_index + 0x51ed2701));
    for (;;) {
      for (size_t i = ready_.size(); i > 1; --i) std::swap(ready_[i - 1], ready_[rng.below(static_cast<uint32_t>(i))]);
      for (uint32_t t : ready_) run_thread(t);
      ready_.clear();
      // Every thread now waits or has exited: complete the shuffles, then the barrier.
      std::sort(pending_warps_.begin(), pending_warps_.end());  // errors name the first warp, whatever the schedule
      for (uint32_t w : pending_warps_) complete_shuffle(w);
      pending_warps_.clear();
      if (!ready_.empty()) continue;
      if (at_bar_ == 0) return;  // all exited
      complete_barrier();
    }
  }

  void complete_shuffle(uint32_t w) {
    const uint32_t first = w * kWarp;
    if (nthreads_ - first < kWarp || warp_waiting_[w] != kWarp) fail_divergent_shuffle(w);
    for (uint32_t l = 1; l < kWarp; ++l)
      if (pc_[first + l] != pc_[first]) fail_divergent_shuffle(w);
    warp_waiting_[w] = 0;
    const Op& op = k_.code[pc_[first]];
    uint32_t value[kWarp];
    for (uint32_t l = 0; l < kWarp; ++l) value[l] = static_cast<uint32_t>(reg(first + l)[op.a]);
    // PTX's shfl.sync: c packs the clamp value (bits 0-4) and the segment mask (bits 8-12).
    for (uint32_t l = 0; l < kWarp; ++l) {
      uint64_t* r = reg(first + l);
      const auto b = static_cast<int32_t>(r[op.b] & 31), c = static_cast<int32_t>(r[op.c]);
      const int32_t seg = (c >> 8) & 31, max_lane = (static_cast<int32_t>(l) & seg) | (c & 31 & ~seg);
      const int32_t min_lane = static_cast<int32_t>(l) & seg, lane = static_cast<int32_t>(l);
      int32_t j = lane;
      bool ok = false;
      switch (static_cast<kir::ShflMode>(op.aux)) {
        case kir::ShflMode::up:
          j = lane - b;
          ok = j >= max_lane;
          break;
        case kir::ShflMode::down:
          j = lane + b;
          ok = j <= max_lane;
          break;
        case kir::ShflMode::bfly:
          j = lane ^ b;
          ok = j <= max_lane;
          break;
        case kir::ShflMode::idx:
          j = min_lane | (b & ~seg);
          ok = j <= max_lane;
          break;
      }
      r[op.d] = value[ok ? j : lane];
      ++pc_[first + l];
      state_[first + l] = State::ready;
      ready_.push_back(first + l);
    }
  }

  void complete_barrier() {
    if (at_bar_ != nthreads_) fail_divergent_barrier();
    for (uint32_t t = 1; t < nthreads_; ++t)
      if (pc_[t] != pc_[0]) fail_divergent_barrier();
    for (uint32_t t = 0; t < nthreads_; ++t) {
      ++pc_[t];
      state_[t] = State::ready;
      ready_.push_back(t);
    }
    at_bar_ = 0;
    ++epoch_;
    ++stats_.barriers;
  }

  uint64_t* reg(uint32_t t) { return regs_.data() + size_t{t} * nslots_; }

  uint32_t sreg(uint32_t t, kir::SReg s) const {
    switch (s) {
      case kir::SReg::tid_x: return t % block_.x;
      case kir::SReg::tid_y: return t / block_.x % block_.y;
      case kir::SReg::tid_z: return t / (block_.x * block_.y);
      case kir::SReg::ntid_x: return block_.x;
      case kir::SReg::ntid_y: return block_.y;
      case kir::SReg::ntid_z: return block_.z;
      case kir::SReg::ctaid_x: return ctaid_[0];
      case kir::SReg::ctaid_y: return ctaid_[1];
      case kir::SReg::ctaid_z: return ctaid_[2];
      case kir::SReg::nctaid_x: return grid_.x;
      case kir::SReg::nctaid_y: return grid_.y;
      case kir::SReg::nctaid_z: return grid_.z;
      case kir::SReg::laneid: return t % kWarp;
    }
    return 0;
  }

  // Runs thread t until it waits at a bar.sync or shfl.sync, or exits.
  void run_thread(uint32_t t);

  std::byte* global(uint32_t t, uint32_t pc, uint64_t addr, uint32_t bytes, const char* what) {
    if (addr % bytes)
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

  std::byte* shared(uint32_t t, uint32_t pc, uint64_t raw, uint32_t bytes, const char* what, Access kind) {
    const auto addr = static_cast<uint32_t>(raw);  // shared addresses are 32-bit
    if (uint64_t{addr} + bytes > shared_.size())
      fail(t, pc,
           std::string("out-of-bounds shared ") + what + " of " + std::to_string(bytes) + " bytes at offset " +
               hex_address(addr) + " (the block's shared memory is " + std::to_string(shared_.size()) + " bytes)");
    if (addr % bytes)
      fail(t, pc,
           std::string("misaligned shared ") + what + " of " + std::to_string(bytes) + " bytes at offset " +
               hex_address(addr));
    if (options_.check_races) check_race(t, pc, addr, bytes, kind);
    return shared_.data() + addr;
  }

  void check_race(uint32_t t, uint32_t pc, uint32_t addr, uint32_t bytes, Access kind) {
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
    for (uint32_t a = addr; a < addr + bytes; ++a) {
      Shadow& s = shadow_[a];
      if (s.epoch != epoch_) s = Shadow{.epoch = epoch_};
      if (s.writer >= 0 && s.writer != me) fail_race(t, pc, kind, a, s.writer, s.writer_pc, Access::write);
      if (kind != Access::atomic)
        if (int i = other(s.atomic); i >= 0) fail_race(t, pc, kind, a, s.atomic[i], s.atomic_pc[i], Access::atomic);
      if (kind != Access::read)
        if (int i = other(s.reader); i >= 0) fail_race(t, pc, kind, a, s.reader[i], s.reader_pc[i], Access::read);
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
  std::string where() const { return "in kernel '" + k_.name + "', block " + coords(ctaid_[0], ctaid_[1], ctaid_[2]); }

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

  // What a thread does when no thread can run: it exited or waits at a synchronization.
  std::string status(uint32_t t) const { return state_[t] == State::exited ? "exited" : "wait at " + k_.text[pc_[t]]; }

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
                      ": not all 32 lanes reach the same shfl.sync (full mask): " + groups(first, end);
    if (end - first < kWarp)
      msg += "; lanes " + std::to_string(end - first) + "-31 do not exist (the block has " + std::to_string(nthreads_) +
             " threads)";
    throw Error(msg);
  }

  [[noreturn]] void fail_divergent_barrier() const {
    throw Error("simulator: divergent barrier " + where() + ": not all " + std::to_string(nthreads_) +
                " threads of the block reach the same bar.sync: " + groups(0, nthreads_));
  }

  const SimKernel& k_;
  const Dim3 grid_, block_;
  DeviceMemory& mem_;
  const SimOptions options_;
  std::vector<uint64_t> params_;  // masked to their types' widths
  uint32_t nthreads_ = 0, nslots_ = 0;
  uint32_t ctaid_[3] = {};
  std::vector<uint64_t> regs_;  // nthreads_ register files of nslots_ slots
  std::vector<uint32_t> pc_;
  std::vector<State> state_;
  std::vector<uint32_t> ready_;          // threads to run this round
  std::vector<uint32_t> warp_waiting_;   // per warp: lanes waiting at a shfl.sync
  std::vector<uint32_t> pending_warps_;  // warps with lanes waiting at a shfl.sync
  uint32_t at_bar_ = 0;                  // threads waiting at a bar.sync
  std::vector<std::byte> shared_;
  std::vector<Shadow> shadow_;
  uint32_t epoch_ = 0;  // barrier epochs (and blocks) so far
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

void Executor::run_thread(uint32_t t) {
  const Op* const code = k_.code.data();
  const uint32_t* const vslots = k_.vslots.data();
  uint64_t* const r = reg(t);
  uint32_t pc = pc_[t];
  int64_t n = 0;
  for (;;) {
    const Op& op = code[pc];
    ++n;
    switch (op.code) {
      case Code::Bra:
        if (n > kMaxRun)
          fail(t, pc, "runaway thread (" + std::to_string(n) + " instructions without a synchronization)");
        pc = static_cast<uint32_t>(op.imm);
        continue;
      case Code::BrTrue: pc = r[op.a] ? static_cast<uint32_t>(op.imm) : pc + 1; continue;
      case Code::BrFalse: pc = r[op.a] ? pc + 1 : static_cast<uint32_t>(op.imm); continue;
      case Code::Exit: state_[t] = State::exited; goto stop;
      case Code::Bar:
        state_[t] = State::at_bar;
        ++at_bar_;
        goto stop;
      case Code::Shfl:
        state_[t] = State::at_shfl;
        if (warp_waiting_[t / kWarp]++ == 0) pending_warps_.push_back(t / kWarp);
        goto stop;
      case Code::Fence: break;
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
        const std::byte* p = global(t, pc, U64(a) + static_cast<uint64_t>(op.imm), uint32_t{op.size} * op.aux, "load");
        for (int i = 0; i < op.aux; ++i) r[vslots[op.b + i]] = load_elem(p + i * op.size, op.size);
        break;
      }
      case Code::StG: {
        std::byte* p = global(t, pc, U64(a) + static_cast<uint64_t>(op.imm), uint32_t{op.size} * op.aux, "store");
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
        break;
      }
      case Code::AtomG:
      case Code::AtomS: {
        const uint64_t addr = U64(a) + static_cast<uint64_t>(op.imm);
        std::byte* p = op.code == Code::AtomG ? global(t, pc, addr, 4, "atomic add")
                                              : shared(t, pc, addr, 4, "atomic add", Access::atomic);
        const auto old = static_cast<uint32_t>(load_elem(p, 4));
        const uint32_t sum = op.aux ? std::bit_cast<uint32_t>(std::bit_cast<float>(old) + F32(b)) : old + U32(b);
        store_elem(p, sum, 4);
        r[op.d] = old;
        break;
      }
    }
    ++pc;
  }
stop:  // at a synchronization (pc stays on it until it completes) or exited
  pc_[t] = pc;
  stats_.instructions += n;
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
