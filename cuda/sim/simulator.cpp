// The SIMT simulator's interpreter (Executor::run_thread: one thread's instructions until it waits
// or exits), the block scheduler around it (run, step) and simulate(). The executor keeps several blocks of the grid
// resident and runs their threads in short segments of seeded random order and length (or, with one resident block,
// each block's threads in a random order to their next bar.sync, shfl.sync or exit); a block's synchronizations
// complete once none of its threads can run. Its parts: executor.hpp.
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
#include <kiln/cuda/sim/executor.hpp>
#include <kiln/cuda/sim/internal.hpp>
#include <kiln/cuda/sim/simulator.hpp>
#include <kiln/cuda/sim/tensor_map.hpp>

namespace kiln::sim {

namespace detail {

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

// Admits blocks in grid order as slots free up (as a GPU's block scheduler roughly does) and
// runs the resident ones: one after another when there is one slot, else a seeded random
// block's random ready thread for a segment of 1 to kSegment instructions at a time.
SimStats Executor::run() {
  // The blocks run, in order: every one, or SimOptions::sample_blocks spread over the grid.
  const uint64_t total = grid_.count();
  const uint64_t runs = options_.sample_blocks == 0 ? total : std::min(total, options_.sample_blocks);
  auto block = [&](uint64_t i) { return runs == total ? i : runs == 1 ? 0 : i * (total - 1) / (runs - 1); };
  stats_.blocks = static_cast<int64_t>(runs);
  uint64_t next = 0;
  std::vector<size_t> active;
  for (size_t i = 0; i < slots_.size() && next < runs; ++i) {
    admit(slots_[i], block(next++));
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
    if (next < runs) {
      admit(b, block(next++));
    } else {
      active[which] = active.back();
      active.pop_back();
    }
  }
  return stats_;
}

// Runs some of block b; false once every thread of it has exited.
bool Executor::step(BlockRun& b, bool interleave) {
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
    for (size_t i = b.ready.size(); i > 1; --i) std::swap(b.ready[i - 1], b.ready[below(b, static_cast<uint32_t>(i))]);
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

// The register arithmetic: the instructions that read and write the thread's slots only (the
// rest, control flow, memory and synchronization, are run_thread's own cases).
[[gnu::always_inline]] inline void arithmetic(const Op& op, uint64_t* r) {
  switch (op.code) {
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
      r[op.d] = static_cast<uint64_t>(f32_to_bf16(F32(a)).bits) | static_cast<uint64_t>(f32_to_bf16(F32(b)).bits) << 16;
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
    default: break;
  }
}

namespace {

// The f32 floating-point operations an instruction does in one thread (fma: a multiply and an add).
constexpr auto kFp32Flops = [] {
  std::array<uint8_t, static_cast<size_t>(Code::FenceProxyTensormap) + 1> f{};
  for (Code c : {Code::AddF32, Code::SubF32, Code::MulF32, Code::MinF32, Code::MaxF32}) f[static_cast<size_t>(c)] = 1;
  f[static_cast<size_t>(Code::FmaF32)] = 2;
  return f;
}();

}  // namespace

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
      default:
        stats_.fp32_flops += kFp32Flops[static_cast<size_t>(op.code)];
        arithmetic(op, r);
        break;
      case Code::LdG: {
        const uint64_t addr = U64(a) + static_cast<uint64_t>(op.imm);
        stats_.global_load_bytes += int64_t{op.size} * op.aux;
        if (options_.count_requests) gather_global_request(t, pc, static_cast<int64_t>(addr), uint32_t{op.size} * op.aux);
        const std::byte* p = global(t, pc, addr, uint32_t{op.size} * op.aux, "load");
        if (races) check_global_read(t, pc, addr, uint32_t{op.size} * op.aux);
        for (int i = 0; i < op.aux; ++i) r[vslots[op.b + i]] = load_elem(p + i * op.size, op.size);
        break;
      }
      case Code::StG: {
        const uint64_t addr = U64(a) + static_cast<uint64_t>(op.imm);
        stats_.global_store_bytes += int64_t{op.size} * op.aux;
        if (options_.count_requests) gather_global_request(t, pc, static_cast<int64_t>(addr), uint32_t{op.size} * op.aux);
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
        if (op.code == Code::AtomG) {
          stats_.global_load_bytes += 4;
          stats_.global_store_bytes += 4;
          if (options_.count_requests) gather_global_request(t, pc, static_cast<int64_t>(addr), 4);
          if (races) atomic_sync(t, addr);
        }
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

}  // namespace detail

namespace {

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
  return detail::Executor(k, grid, block, params, mem, options).run();
}

SimStats simulate(const kir::Kernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& params, DeviceMemory& mem,
                  const SimOptions& options) {
  return simulate(*prepare(k), grid, block, params, mem, options);
}

}  // namespace kiln::sim
