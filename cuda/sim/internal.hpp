// Internals of the SIMT simulator shared by its source files: the flattened instruction form
// that prepare() produces and simulate() executes, the prepared kernel, and the numeric helpers
// (PTX float semantics, f16/bf16, conversions, approximate functions). Not part of the API.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/sim/simulator.hpp>

namespace kiln::sim {

// Flattened opcodes: one per (operation, type class) so that the interpreter is a single
// switch. Registers and immediates are slots of a per-thread uint64_t register file; a value
// is kept zero-extended in its slot (predicates as 0/1), so 32-bit ops mask their results.
// clang-format off
enum class Code : uint16_t {
  // Control: Bra/BrTrue/BrFalse jump to `imm`; BrTrue/BrFalse test slot `a`.
  Bra, BrTrue, BrFalse, Exit, Bar, Shfl, Fence,
  // A warp's matrix product (mma.sync): aux = kir::MmaShape; vslots from b: D[4], A[4], B[2], C[4].
  Mma,
  // A warp's ldmatrix: aux = matrices, size = 1 when transposed; a = the lane's row address;
  // vslots from b: one destination a matrix.
  Ldmatrix,
  // Moves: Mov copies a slot (also zero-extending cvt and shared addresses); Selp: d = c ? a : b.
  Mov, Selp, LdParam, Sreg,
  // 32-bit integers (u32 and s32 share the wrapping ops).
  Add32, Sub32, Mul32, Mad32, Neg32, Not32, Shl32, ShrU32, ShrS32, MulHiU32, MulHiS32, MulWideU32, MulWideS32,
  DivU32, DivS32, RemU32, RemS32, MinU32, MinS32, MaxU32, MaxS32, AbsS32,
  // 64-bit integers.
  Add64, Sub64, Mul64, Mad64, Neg64, Not64, Shl64, ShrU64, ShrS64, MulHiU64, MulHiS64, DivU64, DivS64, RemU64,
  RemS64, MinU64, MinS64, MaxU64, MaxS64, AbsS64,
  // Bitwise on canonical slots of any width; NotPred flips a predicate.
  And, Or, Xor, NotPred,
  // Floats. Approx: aux holds the kir::Opc (ex2, lg2, rcp, rsqrt, tanh, sin, cos).
  AddF32, SubF32, MulF32, DivF32, FmaF32, MinF32, MaxF32, NegF32, AbsF32, SqrtF32, Approx, RoundTf32, PackBf16x2,
  AddF64, SubF64, MulF64, DivF64, FmaF64, MinF64, MaxF64, NegF64, AbsF64,
  // f16/bf16 arithmetic (aux: kir::Opc, size: kir::Type), computed in double and rounded.
  Half,
  // Comparisons, six per type in kir::Cmp order (the first of each six is eq), then the general
  // one for f16, bf16 and pred (aux: cmp, size: type).
  SetpU32, SetpU32Ne, SetpU32Lt, SetpU32Le, SetpU32Gt, SetpU32Ge,
  SetpS32, SetpS32Ne, SetpS32Lt, SetpS32Le, SetpS32Gt, SetpS32Ge,
  SetpU64, SetpU64Ne, SetpU64Lt, SetpU64Le, SetpU64Gt, SetpU64Ge,
  SetpS64, SetpS64Ne, SetpS64Lt, SetpS64Le, SetpS64Gt, SetpS64Ge,
  SetpF32, SetpF32Ne, SetpF32Lt, SetpF32Le, SetpF32Gt, SetpF32Ge,
  SetpF64, SetpF64Ne, SetpF64Lt, SetpF64Le, SetpF64Gt, SetpF64Ge,
  SetpGeneric,
  // Conversions; Cvt is the general one (aux: source type, size: destination type).
  SextS32, Trunc32, CvtF32F64, CvtF64F32, CvtU32F32, CvtS32F32, CvtF32U32, CvtF32S32, Cvt,
  // Memory (aux: vector width, size: element bytes; b: index of the slot list in vslots).
  // Atomics: size 4, aux 1 for f32, 0 for u32; b is the added value's slot.
  LdG, StG, AtomG, LdS, StS, AtomS,
  // cp.async: a = shared destination, b = global source, c = source bytes, size = bytes;
  // commit; wait (imm: groups left pending).
  CpAsync, CpAsyncCommit, CpAsyncWait,
  // A warpgroup's wgmma (imm = n; aux bit 0: A MN-major, bit 1: B MN-major; a, c = the A and B
  // descriptors' slots; vslots from b: the n / 2 accumulators); its fence, commit and wait (imm:
  // groups left pending); fence.proxy.async.
  Wgmma, WgmmaFence, WgmmaCommit, WgmmaWait, FenceProxyAsync,
  // mbarriers (a = the barrier's shared address; b = arrivals, expected bytes or parity) and
  // tensor copies (a = shared destination, b = the tensor map's global address, c = the barrier;
  // vslots from imm: the aux coordinates).
  MbarrierInit, FenceMbarrierInit, MbarrierArriveExpectTx, MbarrierWait, TensorCopy, FenceProxyTensormap,
};
// clang-format on

struct Op {
  Code code = Code::Mov;
  uint8_t aux = 0;
  uint8_t size = 0;
  uint32_t d = 0, a = 0, b = 0, c = 0;  // register-file slots
  int64_t imm = 0;                      // branch target, parameter index, memory offset
};

// A kernel prepared for simulation: straight-line code with branches over a per-thread register
// file whose initial contents are `init` (poisoned registers, then the immediates). Keeps the
// kernel's name and one text per op for error messages, and nothing else of the IR.
class SimKernel {
 public:
  std::string name;
  std::vector<Op> code;
  std::vector<std::string> text;  // per op: the IR instruction it came from
  std::vector<uint32_t> vslots;   // slot lists of Ld destinations and St values
  std::vector<uint64_t> init;     // initial register file
  std::vector<kir::Type> param_types;
  int64_t shared_bytes = 0;
  bool uses_wgmma = false;      // the executor tracks wgmma state and shared writes' proxy fences
  bool uses_mbarriers = false;  // ... and mbarrier phases and the bytes tensor copies wrote
};

// "0x7f0000000100": addresses in error messages (memory.cpp).
std::string hex_address(uint64_t v);

// splitmix64's finalizer: hashes inputs (approximate functions) and seeds (schedules).
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// ---------------------------------------------------------------------------------------------
// Numerics (math.cpp; the small ones inline because the interpreter's hot loop uses them)

inline float f32_of(uint64_t slot) { return std::bit_cast<float>(static_cast<uint32_t>(slot)); }
inline double f64_of(uint64_t slot) { return std::bit_cast<double>(slot); }
inline uint64_t slot_of(float v) { return std::bit_cast<uint32_t>(v); }
inline uint64_t slot_of(double v) { return std::bit_cast<uint64_t>(v); }

// PTX min/max: a NaN operand yields the other operand; -0 orders below +0.
template <typename F>
F ptx_min(F a, F b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}
template <typename F>
F ptx_max(F a, F b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

// Float -> integer as cvt.rzi: truncate, saturate to the destination's range, NaN -> 0.
template <typename I>
I float_to_int(double v) {
  if (std::isnan(v)) return 0;
  const double t = std::trunc(v);
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  // max + 1 is a power of two, exact in double; max itself is not for 64-bit types.
  constexpr double hi_excl = static_cast<double>(std::numeric_limits<I>::max() / 2 + 1) * 2.0;
  if (t <= lo) return std::numeric_limits<I>::min();
  if (t >= hi_excl) return std::numeric_limits<I>::max();
  return static_cast<I>(t);
}

// f16/bf16 <-> wider floats; narrowing rounds to nearest even (one rounding from double).
float f16_to_float(uint16_t h);
float bf16_to_float(uint16_t h);
uint16_t double_to_f16(double v);
uint16_t double_to_bf16(double v);

// cvt between any two types: slot bits in, slot bits out (rules in kir.hpp's Cvt comment).
uint64_t convert(uint64_t bits, kir::Type from, kir::Type to);
// An f16/bf16 arithmetic instruction (Add, Sub, Mul, Div, Fma, Mad, Min, Max, Neg, Abs).
uint64_t half_arith(kir::Opc op, kir::Type t, uint64_t a, uint64_t b, uint64_t c);
// setp for f16, bf16 and pred.
bool compare_generic(kir::Cmp cmp, kir::Type t, uint64_t a, uint64_t b);
// An approximate instruction: the exact value moved by up to the PTX ISA's documented error.
float approx(kir::Opc op, float x);
// The documented error bound of approx(op, .) at input x whose exact result is `exact`:
// absolute, in the result's units.
double approx_bound(kir::Opc op, double exact);

}  // namespace kiln::sim
