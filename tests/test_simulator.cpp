// Tests for the SIMT simulator (cuda/sim/simulator.hpp): device memory checks, exact arithmetic,
// reductions through shared memory and shuffles, atomics, approximate functions within their
// documented error, seeded schedules, and its speed (printed). The planted bugs it must catch
// are in test_simulator_faults.cpp.
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/sim/simulator.hpp>

#include "sim_test_util.hpp"

namespace kiln::sim {
namespace {

using namespace kiln::sim::testing;  // NOLINT: the helpers and kir names of the simulator tests

// ---------------------------------------------------------------------------------------------
// Device memory

TEST(SimulatorMemory, AllocationsAreAlignedDistinctAndChecked) {
  DeviceMemory mem;
  const uint64_t a = mem.alloc(1000), b = mem.alloc(0), c = mem.alloc(16);
  EXPECT_NE(a, 0u);
  EXPECT_EQ(a % 256, 0u);
  EXPECT_EQ(b % 256, 0u);
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_EQ(mem.live_allocations(), 3u);
  EXPECT_EQ(mem.live_bytes(), 1000u + 1u + 16u);

  const std::vector<int32_t> v = {1, 2, 3, 4};
  mem.write(c, v.data(), 16);
  EXPECT_EQ(download<int32_t>(mem, c, 4), v);
  EXPECT_EQ(mem.at(c + 4, 4), mem.at(c, 16) + 4);

  expect_error([&] { mem.at(a + 997, 4); }, {"device memory", "4 bytes", "runs past the end", "1000 bytes"});
  expect_error([&] { mem.at(a + 1000, 1); }, {"0 bytes past the end of allocation", "1000 bytes"});
  expect_error([&] { mem.read(a - 8, nullptr, 4); }, {"8 bytes before allocation"});
  mem.free(b);
  expect_error([&] { mem.free(b); }, {"free", "not a live allocation"});
  expect_error([&] { mem.at(b, 1); }, {"outside every live allocation"});
  EXPECT_EQ(mem.live_allocations(), 2u);
}

TEST(SimulatorMemory, NewMemoryIsPoisoned) {
  DeviceMemory mem;
  const uint64_t a = mem.alloc(8);
  EXPECT_EQ(download<uint64_t>(mem, a, 1)[0], ~uint64_t{0});
}

// 16 threads: each loads a 4-vector from global memory, stores it reversed into shared memory,
// and after the barrier reads its neighbour's as two 2-vectors and stores those.
TEST(SimulatorMemory, VectorAccesses) {
  KernelBuilder b("vectors");
  Reg x = b.param("x", Type::u64), y = b.param("y", Type::u64);
  const int sh = b.shared_array("tile", 16 * 16);
  Reg tid = b.sreg(SReg::tid_x);
  Reg quad = b.mul(Type::u32, tid, imm_u32(4));
  std::vector<Reg> v = b.ld_vec(Space::global, Type::f32, b.address(x, quad, 4), 4);
  Reg base = b.shared_addr(sh);
  b.st_vec(Space::shared, Type::f32, b.add(Type::u32, base, b.mul(Type::u32, tid, imm_u32(16))),
           {v[3], v[2], v[1], v[0]});
  b.bar();
  Reg next = b.rem(Type::u32, b.add(Type::u32, tid, imm_u32(1)), imm_u32(16));
  Reg at = b.add(Type::u32, base, b.mul(Type::u32, next, imm_u32(16)));
  std::vector<Reg> lo = b.ld_vec(Space::shared, Type::f32, at, 2), hi = b.ld_vec(Space::shared, Type::f32, at, 2, 8);
  b.st_vec(Space::global, Type::f32, b.address(y, quad, 4), {lo[0], lo[1], hi[0], hi[1]});
  const auto k = prepare(b.finish());
  DeviceMemory mem;
  const auto xs = test_inputs(64);
  const uint64_t xa = upload(mem, xs), ya = mem.alloc(64 * 4);
  simulate(*k, {1}, {16}, {xa, ya}, mem);
  const auto ys = download<float>(mem, ya, 64);
  for (uint32_t t = 0; t < 16; ++t)
    for (uint32_t j = 0; j < 4; ++j) EXPECT_EQ(ys[4 * t + j], xs[4 * ((t + 1) % 16) + 3 - j]) << t << "," << j;
  // A 16-byte vector needs 16-byte alignment.
  expect_error(
      [&] {
        simulate(*k, {1}, {16}, {xa + 8, ya}, mem);
      },
      {"misaligned global load of 16 bytes", "ld.f32 global"});
}

// ---------------------------------------------------------------------------------------------
// Arithmetic

float pointwise_reference(float v) {
  const float q = std::fma(v, 1.5f, -0.25f) / (v + 3.0f);
  return std::fmax(std::sqrt(std::fabs(q)), (v - 0.5f) * v);
}

TEST(SimulatorArith, GuardedPointwiseIsExact) {
  DeviceMemory mem;
  const uint32_t n = 1000;
  const auto x = test_inputs(n);
  const uint64_t xa = upload(mem, x), ya = mem.alloc(n * 4);
  const SimStats stats = simulate(pointwise_kernel(), {(n + 255) / 256}, {256}, {xa, ya, n}, mem);
  const auto y = download<float>(mem, ya, n);
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(bits(y[i]), bits(pointwise_reference(x[i]))) << "element " << i;
  EXPECT_GT(stats.instructions, int64_t{n} * 10);
  EXPECT_EQ(stats.barriers, 0);
}

TEST(SimulatorArith, GridStrideLoopIsExact) {
  KernelBuilder b("grid_stride");
  Reg x = b.param("x", Type::u64), y = b.param("y", Type::u64), count = b.param("n", Type::u32);
  Reg stride = b.mul(Type::u32, b.sreg(SReg::nctaid_x), b.sreg(SReg::ntid_x));
  b.for_(b.global_index_x(), count, stride, [&](Reg i) {
    Reg v = b.ld(Space::global, Type::f32, b.address(x, i, 4));
    b.st(Space::global, Type::f32, b.address(y, i, 4), b.fma(Type::f32, v, v, imm_f32(0.1f)));
  });
  const Kernel k = b.finish();
  const uint32_t n = 1000;
  const auto xv = test_inputs(n);
  DeviceMemory mem;
  const uint64_t xa = upload(mem, xv), ya = mem.alloc(n * 4);
  const auto prepared = prepare(k);
  simulate(*prepared, {3}, {64}, {xa, ya, n}, mem);
  const auto yv = download<float>(mem, ya, n);
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(bits(yv[i]), bits(std::fma(xv[i], xv[i], 0.1f))) << "element " << i;
}

// One thread evaluates a list of expressions; each result is stored in its own 8-byte slot.
class ScalarProgram {
 public:
  ScalarProgram() : b_("scalars") { out_ = b_.param("out", Type::u64); }
  KernelBuilder& b() { return b_; }
  // Stores r into the next slot; returns the slot's number.
  size_t put(Reg r) {
    b_.st(Space::global, r.type, out_, r, static_cast<int64_t>(8 * count_));
    return count_++;
  }
  size_t put_pred(Reg p) { return put(b_.selp(Type::u32, imm_u32(1), imm_u32(0), p)); }
  std::vector<uint64_t> run() {
    DeviceMemory mem;
    const uint64_t out = upload(mem, std::vector<uint64_t>(count_, 0));
    simulate(b_.finish(), {1}, {1}, {out}, mem);
    return download<uint64_t>(mem, out, count_);
  }

 private:
  KernelBuilder b_;
  Reg out_;
  size_t count_ = 0;
};

TEST(SimulatorArith, IntegerOperations) {
  ScalarProgram p;
  auto& b = p.b();
  auto s32 = [](int32_t v) { return kir::imm_s32(v); };
  auto s64 = [](int64_t v) { return kir::imm_s64(v); };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    size_t slot;
    uint64_t expected;
    const char* what;
  };
  std::vector<Case> cases = {
      {p.put(b.mul_hi(Type::u32, imm_u32(0xffffffffu), imm_u32(0xffffffffu))), 0xfffffffeu, "mul.hi.u32"},
      {p.put(b.mul_hi(Type::s32, s32(-2), s32(3))), 0xffffffffu, "mul.hi.s32 negative"},
      {p.put(b.mul_hi(Type::s32, s32(INT32_MIN), s32(INT32_MIN))), 0x40000000u, "mul.hi.s32 min*min"},
      {p.put(b.mul_wide(Type::u32, imm_u32(0xffffffffu), imm_u32(2))), 0x1fffffffeull, "mul.wide.u32"},
      {p.put(b.mul_wide(Type::s32, s32(-3), s32(5))), static_cast<uint64_t>(-15), "mul.wide.s32"},
      {p.put(b.mul_hi(Type::u64, imm_u64(uint64_t{1} << 63), imm_u64(4))), 2, "mul.hi.u64"},
      {p.put(b.mul_hi(Type::s64, s64(-1), s64(1))), ~uint64_t{0}, "mul.hi.s64"},
      {p.put(b.mul(Type::u32, imm_u32(0x10000u), imm_u32(0x10001u))), 0x10000u, "mul.lo.u32 wraps"},
      {p.put(b.add(Type::s32, s32(INT32_MAX), s32(1))), 0x80000000u, "add.s32 wraps"},
      {p.put(b.shl(Type::u32, imm_u32(1), imm_u32(31))), 0x80000000u, "shl.u32 31"},
      {p.put(b.shl(Type::u32, imm_u32(1), imm_u32(32))), 0, "shl.u32 32 clamps"},
      {p.put(b.shl(Type::u32, imm_u32(1), imm_u32(40))), 0, "shl.u32 40 clamps"},
      {p.put(b.shr(Type::u32, imm_u32(0x80000000u), imm_u32(32))), 0, "shr.u32 32"},
      {p.put(b.shr(Type::s32, s32(-8), imm_u32(1))), static_cast<uint32_t>(-4), "shr.s32 arithmetic"},
      {p.put(b.shr(Type::s32, s32(-8), imm_u32(32))), 0xffffffffu, "shr.s32 32 sign-fills"},
      {p.put(b.shr(Type::s32, s32(8), imm_u32(40))), 0, "shr.s32 40 positive"},
      {p.put(b.shl(Type::u64, imm_u64(1), imm_u32(64))), 0, "shl.u64 64"},
      {p.put(b.shr(Type::s64, s64(-5), imm_u32(100))), ~uint64_t{0}, "shr.s64 100 sign-fills"},
      {p.put(b.div(Type::s32, s32(-7), s32(2))), static_cast<uint32_t>(-3), "div.s32 truncates"},
      {p.put(b.rem(Type::s32, s32(-7), s32(2))), static_cast<uint32_t>(-1), "rem.s32 sign of dividend"},
      {p.put(b.div(Type::u32, imm_u32(0xfffffff0u), imm_u32(16))), 0x0fffffffu, "div.u32"},
      {p.put(b.rem(Type::u32, imm_u32(23), imm_u32(5))), 3, "rem.u32"},
      {p.put(b.div(Type::s32, s32(INT32_MIN), s32(-1))), 0x80000000u, "div.s32 min/-1 wraps"},
      {p.put(b.div(Type::s64, s64(-9000000000LL), s64(7))), static_cast<uint64_t>(-9000000000LL / 7), "div.s64"},
      {p.put(b.rem(Type::s64, s64(-9000000000LL), s64(7))), static_cast<uint64_t>(-9000000000LL % 7), "rem.s64"},
      {p.put(b.neg(Type::s32, s32(INT32_MIN))), 0x80000000u, "neg.s32 min"},
      {p.put(b.abs(Type::s32, s32(-5))), 5, "abs.s32"},
      {p.put(b.min(Type::s32, s32(-5), s32(3))), static_cast<uint32_t>(-5), "min.s32"},
      {p.put(b.max(Type::u32, imm_u32(0xfffffffbu), imm_u32(3))), 0xfffffffbu, "max.u32"},
      {p.put(b.not_(Type::u32, imm_u32(0x0f0f0f0fu))), 0xf0f0f0f0u, "not.b32"},
      {p.put(b.xor_(Type::u64, imm_u64(0xff00), imm_u64(0x0ff0))), 0xf0f0, "xor.b64"},
      // Conversions: float -> int truncates and saturates, NaN -> 0.
      {p.put(b.cvt(Type::s32, imm_f32(1e10f))), 0x7fffffffu, "cvt.rzi.s32.f32 saturates high"},
      {p.put(b.cvt(Type::s32, imm_f32(-1e10f))), 0x80000000u, "cvt.rzi.s32.f32 saturates low"},
      {p.put(b.cvt(Type::s32, imm_f32(nan))), 0, "cvt.rzi.s32.f32 NaN"},
      {p.put(b.cvt(Type::s32, imm_f32(-1.5f))), static_cast<uint32_t>(-1), "cvt.rzi.s32.f32 -1.5"},
      {p.put(b.cvt(Type::s32, imm_f32(2.9f))), 2, "cvt.rzi.s32.f32 2.9"},
      {p.put(b.cvt(Type::u32, imm_f32(-3.5f))), 0, "cvt.rzi.u32.f32 negative"},
      {p.put(b.cvt(Type::u32, imm_f32(5e9f))), 0xffffffffu, "cvt.rzi.u32.f32 saturates"},
      {p.put(b.cvt(Type::s64, imm_f32(-1e30f))), static_cast<uint64_t>(INT64_MIN), "cvt.rzi.s64.f32"},
      {p.put(b.cvt(Type::u64, imm_f32(1e30f))), ~uint64_t{0}, "cvt.rzi.u64.f32"},
      // Integer -> integer: extension by the source's signedness, truncation.
      {p.put(b.cvt(Type::s64, s32(-5))), static_cast<uint64_t>(-5), "cvt.s64.s32"},
      {p.put(b.cvt(Type::u64, imm_u32(0xffffffffu))), 0xffffffffu, "cvt.u64.u32"},
      {p.put(b.cvt(Type::u64, s32(-1))), ~uint64_t{0}, "cvt.u64.s32"},
      {p.put(b.cvt(Type::s32, s64(0x123456789LL))), 0x23456789u, "cvt.s32.s64"},
      // Integer -> float rounds to nearest even.
      {p.put(b.cvt(Type::f32, s32(16777217))), bits(16777216.0f), "cvt.rn.f32.s32 tie down"},
      {p.put(b.cvt(Type::f32, s32(16777219))), bits(16777220.0f), "cvt.rn.f32.s32 tie up"},
      {p.put(b.cvt(Type::f32, imm_u64(~uint64_t{0}))), bits(18446744073709551616.0f), "cvt.rn.f32.u64"},
      {p.put(b.cvt(Type::f32, imm_f64(0.1))), bits(0.1f), "cvt.rn.f32.f64"},
      {p.put(b.cvt(Type::f64, imm_f32(0.1f))), std::bit_cast<uint64_t>(static_cast<double>(0.1f)), "cvt.f64.f32"},
      // f16 / bf16 round to nearest even, with overflow to infinity and subnormals.
      {p.put(b.cvt(Type::f16, imm_f32(1.0f))), 0x3c00, "cvt.rn.f16.f32 1"},
      {p.put(b.cvt(Type::f16, imm_f32(1.0f + 0x1p-11f))), 0x3c00, "cvt.rn.f16.f32 tie to even (down)"},
      {p.put(b.cvt(Type::f16, imm_f32(1.0f + 3 * 0x1p-11f))), 0x3c02, "cvt.rn.f16.f32 tie to even (up)"},
      {p.put(b.cvt(Type::f16, imm_f32(65519.0f))), 0x7bff, "cvt.rn.f16.f32 max"},
      {p.put(b.cvt(Type::f16, imm_f32(65520.0f))), 0x7c00, "cvt.rn.f16.f32 overflow"},
      {p.put(b.cvt(Type::f16, imm_f32(0x1p-24f))), 0x0001, "cvt.rn.f16.f32 smallest subnormal"},
      {p.put(b.cvt(Type::f16, imm_f32(0x1p-25f))), 0x0000, "cvt.rn.f16.f32 tie to zero"},
      {p.put(b.cvt(Type::f16, imm_f32(-3 * 0x1p-26f))), 0x8001, "cvt.rn.f16.f32 negative subnormal"},
      {p.put(b.cvt(Type::bf16, imm_f32(1.0f + 0x1p-8f))), 0x3f80, "cvt.rn.bf16.f32 tie to even (down)"},
      {p.put(b.cvt(Type::bf16, imm_f32(1.0f + 3 * 0x1p-8f))), 0x3f82, "cvt.rn.bf16.f32 tie to even (up)"},
      {p.put(b.cvt(Type::f32, Operand::imm(Type::f16, 0x3c01))), bits(1.0f + 0x1p-10f), "cvt.f32.f16"},
      {p.put(b.cvt(Type::f32, Operand::imm(Type::bf16, 0xc0a0))), bits(-5.0f), "cvt.f32.bf16"},
      {p.put(b.add(Type::f16, Operand::imm(Type::f16, 0x3c00), Operand::imm(Type::f16, 0x1400))), 0x3c01,
       "add.f16 (1 + 2^-10)"},
      {p.put(b.mul(Type::bf16, Operand::imm(Type::bf16, 0x3fc0), Operand::imm(Type::bf16, 0x3fc0))), 0x4010,
       "mul.bf16 (1.5 * 1.5)"},
      {p.put(b.neg(Type::f16, Operand::imm(Type::f16, 0x3c00))), 0xbc00, "neg.f16"},
      {p.put(b.max(Type::f16, Operand::imm(Type::f16, 0x7e00), Operand::imm(Type::f16, 0xbc00))), 0xbc00,
       "max.f16 NaN"},
      {p.put(b.div(Type::f64, imm_f64(1.0), imm_f64(3.0))), std::bit_cast<uint64_t>(1.0 / 3.0), "div.rn.f64"},
      {p.put(b.fma(Type::f64, imm_f64(0.1), imm_f64(10.0), imm_f64(-1.0))),
       std::bit_cast<uint64_t>(std::fma(0.1, 10.0, -1.0)), "fma.rn.f64"},
      {p.put(b.min(Type::f64, imm_f64(-2.0), imm_f64(std::numeric_limits<double>::quiet_NaN()))),
       std::bit_cast<uint64_t>(-2.0), "min.f64 NaN"},
      // Floats: min/max return the non-NaN operand; setp is ordered except ne.
      {p.put(b.min(Type::f32, imm_f32(nan), imm_f32(2.0f))), bits(2.0f), "min.f32 NaN"},
      {p.put(b.max(Type::f32, imm_f32(-1.0f), imm_f32(nan))), bits(-1.0f), "max.f32 NaN"},
      {p.put(b.min(Type::f32, imm_f32(0.0f), imm_f32(-0.0f))), bits(-0.0f), "min.f32 -0 < +0"},
      {p.put_pred(b.setp(Cmp::ne, imm_f32(nan), imm_f32(nan))), 1, "setp.ne.f32 NaN is unordered"},
      {p.put_pred(b.setp(Cmp::eq, imm_f32(nan), imm_f32(nan))), 0, "setp.eq.f32 NaN"},
      {p.put_pred(b.setp(Cmp::lt, imm_f32(nan), imm_f32(1.0f))), 0, "setp.lt.f32 NaN"},
      {p.put_pred(b.setp(Cmp::ge, imm_f32(nan), imm_f32(1.0f))), 0, "setp.ge.f32 NaN"},
      {p.put_pred(b.setp(Cmp::lt, kir::imm_s32(-1), kir::imm_s32(0))), 1, "setp.lt.s32"},
      {p.put_pred(b.setp(Cmp::lt, imm_u32(0xffffffffu), imm_u32(0))), 0, "setp.lt.u32"},
      {p.put(b.div(Type::f32, imm_f32(1.0f), imm_f32(3.0f))), bits(1.0f / 3.0f), "div.rn.f32"},
      {p.put(b.unary(Opc::Sqrt, Type::f32, imm_f32(2.0f))), bits(std::sqrt(2.0f)), "sqrt.rn.f32"},
      {p.put(b.fma(Type::f32, imm_f32(1.0f + 0x1p-23f), imm_f32(1.0f - 0x1p-23f), imm_f32(-1.0f))),
       bits(std::fma(1.0f + 0x1p-23f, 1.0f - 0x1p-23f, -1.0f)), "fma.rn.f32 single rounding"},
  };
  const auto out = p.run();
  for (const auto& c : cases) {
    // 32-bit and narrower results fill only the low bytes of their (zeroed) slot.
    EXPECT_EQ(out[c.slot], c.expected) << c.what << std::hex << ": got 0x" << out[c.slot] << ", want 0x" << c.expected;
  }
}

// PTX's add.f32 keeps subnormals even where the host thread flushes them (the CPU executor sets
// FTZ and DAZ on its threads); the host's setting survives the simulation.
// div/rem.u64 by a constant are lowered to shifts or a multiply-high (kir.cpp): exact for
// dividends across the whole range, and no div.u64/rem.u64 (a slow call in ptxas's output) is left.
TEST(SimulatorArith, U64DivisionByConstantsIsExact) {
  const std::vector<uint64_t> divisors = {
      1,           2, 3, 6, 7, 10, 12, 64, 100, 384, 50257, 1000003, (uint64_t{1} << 32) + 1, (uint64_t{1} << 63) + 5,
      ~uint64_t{0}};
  std::vector<uint64_t> n = {0,
                             1,
                             2,
                             5,
                             99,
                             100,
                             101,
                             uint64_t{1} << 31,
                             (uint64_t{1} << 32) - 1,
                             uint64_t{1} << 32,
                             (uint64_t{1} << 63) - 1,
                             uint64_t{1} << 63,
                             ~uint64_t{0} - 1,
                             ~uint64_t{0}};
  uint64_t x = 88172645463325252ULL;  // xorshift64: dividends spread over the whole range
  for (int i = 0; i < 18; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    n.push_back(x);
  }
  for (uint64_t d : divisors) {
    KernelBuilder b("div_u64");
    Reg in = b.param("in", Type::u64), out = b.param("out", Type::u64);
    Reg tid = b.sreg(SReg::tid_x);
    Reg v = b.ld(Space::global, Type::u64, b.address(in, tid, 8));
    b.st(Space::global, Type::u64, b.address(out, b.mul(Type::u32, tid, imm_u32(2)), 8),
         b.div(Type::u64, v, imm_u64(d)));
    b.st(Space::global, Type::u64, b.address(out, b.mad(Type::u32, tid, imm_u32(2), imm_u32(1)), 8),
         b.rem(Type::u64, v, imm_u64(d)));
    const Kernel k = b.finish();
    const std::string ptx = print_ptx(k, 90);
    EXPECT_EQ(ptx.find("div.u64"), std::string::npos) << d;
    EXPECT_EQ(ptx.find("rem.u64"), std::string::npos) << d;
    DeviceMemory mem;
    const uint64_t ia = upload(mem, n), oa = mem.alloc(n.size() * 16);
    simulate(k, {1}, {static_cast<uint32_t>(n.size())}, {ia, oa}, mem);
    const auto r = download<uint64_t>(mem, oa, 2 * n.size());
    for (size_t i = 0; i < n.size(); ++i) {
      ASSERT_EQ(r[2 * i], n[i] / d) << n[i] << " / " << d;
      ASSERT_EQ(r[2 * i + 1], n[i] % d) << n[i] << " % " << d;
    }
  }
}

TEST(SimulatorArith, SubnormalsSurviveAHostThatFlushesThem) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);
  ScalarProgram p;
  const size_t sum = p.put(p.b().add(Type::f32, imm_f32(0x1p-140f), imm_f32(0x1p-141f)));
  const size_t product = p.put(p.b().mul(Type::f32, imm_f32(0x1p-100f), imm_f32(0x1p-30f)));
  const auto out = p.run();
  const unsigned after = _mm_getcsr();
  _mm_setcsr(saved);
  EXPECT_EQ(out[sum], bits(0x1p-140f) + bits(0x1p-141f));  // subnormal bit patterns add exactly
  EXPECT_EQ(out[product], 1u << 19);                       // 2^-130 = 2^19 * 2^-149
  EXPECT_EQ(after, saved | 0x8040);
}

// ---------------------------------------------------------------------------------------------
// Reductions

// out[block] = sum over the block's threads of their grid-stride sums: shared-memory tree with
// a barrier per level (any block size: levels from the next power of two).
Kernel block_reduce_kernel(uint32_t threads) {
  KernelBuilder b("block_reduce_" + std::to_string(threads));
  Reg x = b.param("x", Type::u64), out = b.param("out", Type::u64), n = b.param("n", Type::u32);
  const int sh = b.shared_array("partial", threads * 4);
  Reg acc = thread_sum(b, x, n);
  Reg tid = b.sreg(SReg::tid_x);
  Reg my = b.add(Type::u32, b.shared_addr(sh), b.mul(Type::u32, tid, imm_u32(4)));
  b.st(Space::shared, Type::f32, my, acc);
  b.bar();
  for (uint32_t s = std::bit_ceil(threads) / 2; s > 0; s /= 2) {
    Reg active = b.and_(Type::pred, b.setp(Cmp::lt, tid, imm_u32(s)), b.setp(Cmp::lt, tid, imm_u32(threads - s)));
    b.if_(active, [&] {
      Reg other = b.ld(Space::shared, Type::f32, my, 4 * s);
      b.st(Space::shared, Type::f32, my, b.add(Type::f32, b.ld(Space::shared, Type::f32, my), other));
    });
    b.bar();
  }
  b.if_(b.setp(Cmp::eq, tid, imm_u32(0)), [&] {
    b.st(Space::global, Type::f32, b.address(out, b.sreg(SReg::ctaid_x), 4), b.ld(Space::shared, Type::f32, my));
  });
  return b.finish();
}

// Small integers: every partial sum is exact in f32, so any order of summation gives the total.
std::vector<float> integer_inputs(uint32_t n) {
  std::vector<float> x(n);
  for (uint32_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7) - 2.0f;
  return x;
}

double total(const std::vector<float>& v) {
  double s = 0;
  for (float f : v) s += f;
  return s;
}

TEST(SimulatorReduce, BlockReductionWithSharedMemory) {
  for (uint32_t threads : {32u, 64u, 96u, 256u, 1000u, 1024u}) {
    const auto prepared = prepare(block_reduce_kernel(threads));
    for (uint32_t n : {1u, 31u, 1000u, 4097u}) {
      DeviceMemory mem;
      const auto x = integer_inputs(n);
      const uint32_t blocks = 3;
      const uint64_t xa = upload(mem, x), out = mem.alloc(blocks * 4);
      const SimStats stats = simulate(*prepared, {blocks}, {threads}, {xa, out, n}, mem);
      EXPECT_EQ(total(download<float>(mem, out, blocks)), total(x)) << threads << " threads, n = " << n;
      EXPECT_EQ(stats.barriers, blocks * (1 + std::bit_width(std::bit_ceil(threads) / 2)));
    }
  }
}

// Lane 0 of each warp adds the warp's sum (reduced with shfl.down) into *out.
Kernel warp_reduce_kernel() {
  KernelBuilder b("warp_reduce");
  Reg x = b.param("x", Type::u64), out = b.param("out", Type::u64), n = b.param("n", Type::u32);
  Reg v = thread_sum(b, x, n);
  for (uint32_t d = 16; d > 0; d /= 2) v = b.add(Type::f32, v, b.shfl(ShflMode::down, v, imm_u32(d)));
  b.if_(b.setp(Cmp::eq, b.sreg(SReg::laneid), imm_u32(0)), [&] { b.atom_add(Space::global, Type::f32, out, v); });
  return b.finish();
}

TEST(SimulatorReduce, WarpReductionWithShuffles) {
  const auto down = prepare(warp_reduce_kernel()), bfly = prepare(butterfly_kernel());
  for (uint32_t threads : {32u, 64u, 256u, 1024u}) {
    for (uint32_t n : {1u, 31u, 1000u, 4097u}) {
      DeviceMemory mem;
      const auto x = integer_inputs(n);
      const uint32_t blocks = 2, total_threads = blocks * threads;
      const uint64_t xa = upload(mem, x), out = upload(mem, std::vector<float>{0.0f}),
                     all = mem.alloc(total_threads * 4);
      simulate(*down, {blocks}, {threads}, {xa, out, n}, mem);
      EXPECT_EQ(download<float>(mem, out, 1)[0], total(x)) << threads << " threads, n = " << n;
      simulate(*bfly, {blocks}, {threads}, {xa, all, n}, mem);
      const auto sums = download<float>(mem, all, total_threads);
      double warps_total = 0;
      for (uint32_t w = 0; w < total_threads / 32; ++w) {
        for (uint32_t l = 1; l < 32; ++l) ASSERT_EQ(sums[w * 32 + l], sums[w * 32]) << "warp " << w << " lane " << l;
        warps_total += sums[w * 32];
      }
      EXPECT_EQ(warps_total, total(x)) << threads << " threads, n = " << n;
    }
  }
}

// out[lane] = inclusive prefix sum of lane + 1 through shfl.up (clamp 0, as CUDA's
// __shfl_up_sync passes), then the warp total broadcast from lane 31 through shfl.idx, and
// shfl.up with clamp 31, which (as in PTX) leaves every lane with its own value.
TEST(SimulatorReduce, ShuffleUpAndIndex) {
  KernelBuilder b("scan");
  Reg out = b.param("out", Type::u64);
  Reg lane = b.sreg(SReg::laneid);
  Reg v = b.add(Type::u32, lane, imm_u32(1));
  for (uint32_t d = 1; d < 32; d *= 2) {
    Reg up = b.shfl(ShflMode::up, v, imm_u32(d), imm_u32(0));
    v = b.add(Type::u32, v, b.selp(Type::u32, up, imm_u32(0), b.setp(Cmp::ge, lane, imm_u32(d))));
  }
  Reg all = b.shfl(ShflMode::idx, v, imm_u32(31));
  Reg own = b.shfl(ShflMode::up, lane, imm_u32(1), imm_u32(31));
  b.st(Space::global, Type::u32, b.address(out, lane, 12), v);
  b.st(Space::global, Type::u32, b.address(out, lane, 12), all, 4);
  b.st(Space::global, Type::u32, b.address(out, lane, 12), own, 8);
  DeviceMemory mem;
  const uint64_t o = mem.alloc(32 * 12);
  simulate(b.finish(), {1}, {32}, {o}, mem);
  const auto r = download<uint32_t>(mem, o, 32 * 3);
  for (uint32_t l = 0; l < 32; ++l) {
    EXPECT_EQ(r[3 * l], (l + 1) * (l + 2) / 2) << "lane " << l;
    EXPECT_EQ(r[3 * l + 1], 32u * 33u / 2) << "lane " << l;
    EXPECT_EQ(r[3 * l + 2], l) << "lane " << l;
  }
}

// ---------------------------------------------------------------------------------------------
// Atomics and schedules

TEST(SimulatorAtomics, ManyThreadsAddIntoOneAddress) {
  KernelBuilder b("atomics");
  Reg counter = b.param("counter", Type::u64), sum = b.param("sum", Type::u64), hist = b.param("hist", Type::u64);
  b.atom_add(Space::global, Type::u32, counter, imm_u32(1));
  b.atom_add(Space::global, Type::f32, sum, imm_f32(0.5f));
  // A shared histogram: atomic adds from every thread to the same bins do not race.
  const int sh = b.shared_array("bins", 8 * 4);
  Reg tid = b.sreg(SReg::tid_x);
  Reg in_bins = b.setp(Cmp::lt, tid, imm_u32(8));
  Reg bin = b.add(Type::u32, b.shared_addr(sh), b.mul(Type::u32, tid, imm_u32(4)));
  b.if_(in_bins, [&] { b.st(Space::shared, Type::u32, bin, imm_u32(0)); });
  b.bar();
  Reg mine = b.add(Type::u32, b.shared_addr(sh), b.mul(Type::u32, b.and_(Type::u32, tid, imm_u32(7)), imm_u32(4)));
  b.atom_add(Space::shared, Type::u32, mine, imm_u32(1));
  b.bar();
  b.if_(in_bins,
        [&] { b.atom_add(Space::global, Type::u32, b.address(hist, tid, 4), b.ld(Space::shared, Type::u32, bin)); });
  const Kernel k = b.finish();
  DeviceMemory mem;
  const uint64_t counter_a = upload(mem, std::vector<uint32_t>{0}), sum_a = upload(mem, std::vector<float>{0});
  const uint64_t hist_a = upload(mem, std::vector<uint32_t>(8, 0));
  simulate(k, {4}, {250}, {counter_a, sum_a, hist_a}, mem);
  EXPECT_EQ(download<uint32_t>(mem, counter_a, 1)[0], 1000u);
  EXPECT_EQ(download<float>(mem, sum_a, 1)[0], 500.0f);
  uint32_t hist_total = 0;
  for (uint32_t h : download<uint32_t>(mem, hist_a, 8)) hist_total += h;
  EXPECT_EQ(hist_total, 1000u);
  EXPECT_EQ(download<uint32_t>(mem, hist_a, 8)[0], 4u * 32u);  // 250 threads: bin 0 gets 32 per block
}

// Each thread takes a ticket from a counter: the tickets are the order in which threads ran.
std::vector<uint32_t> tickets(uint64_t seed, uint32_t threads) {
  KernelBuilder b("tickets");
  Reg counter = b.param("counter", Type::u64), out = b.param("out", Type::u64);
  Reg t = b.atom_add(Space::global, Type::u32, counter, imm_u32(1));
  b.st(Space::global, Type::u32, b.address(out, b.sreg(SReg::tid_x), 4), t);
  DeviceMemory mem;
  const uint64_t c = upload(mem, std::vector<uint32_t>{0}), o = mem.alloc(threads * 4);
  simulate(b.finish(), {1}, {threads}, {c, o}, mem, SimOptions{.schedule_seed = seed});
  return download<uint32_t>(mem, o, threads);
}

TEST(SimulatorSchedule, SeedsVaryTheThreadOrder) {
  const uint32_t threads = 256;
  const auto a = tickets(1, threads), a2 = tickets(1, threads), b = tickets(2, threads);
  EXPECT_EQ(a, a2) << "a seed gives one schedule";
  EXPECT_NE(a, b) << "different seeds give different schedules";
  EXPECT_EQ(std::set<uint32_t>(a.begin(), a.end()).size(), threads);
  // Not lockstep, not in lane order: the lanes of warp 0 did not run in order.
  EXPECT_FALSE(std::is_sorted(a.begin(), a.begin() + 32));
}

// Tickets over a grid: with several blocks resident their threads interleave (a block's tickets
// are not one run), with one they do not.
TEST(SimulatorSchedule, ResidentBlocksInterleave) {
  KernelBuilder b("grid_tickets");
  Reg counter = b.param("counter", Type::u64), out = b.param("out", Type::u64);
  Reg t = b.atom_add(Space::global, Type::u32, counter, imm_u32(1));
  Reg id = b.mad(Type::u32, b.sreg(SReg::ctaid_x), imm_u32(64), b.sreg(SReg::tid_x));
  b.st(Space::global, Type::u32, b.address(out, id, 4), t);
  const Kernel k = b.finish();
  for (uint32_t resident : {1u, 4u}) {
    DeviceMemory mem;
    const uint64_t c = upload(mem, std::vector<uint32_t>{0}), o = mem.alloc(4 * 64 * 4);
    simulate(k, {4}, {64}, {c, o}, mem, SimOptions{.resident_blocks = resident});
    const auto tickets = download<uint32_t>(mem, o, 4 * 64);
    // Block 0's tickets are 0..63 exactly when it ran alone.
    const uint32_t block0_max = *std::max_element(tickets.begin(), tickets.begin() + 64);
    if (resident == 1)
      EXPECT_EQ(block0_max, 63u);
    else
      EXPECT_GT(block0_max, 63u) << "block 0 ran to its end before any other block started";
  }
}

// Shared-memory bank conflicts as a GPU serves a warp's request: 32 banks of 4 bytes, a word
// read by several lanes broadcast, 16-byte accesses a quarter warp at a time.
TEST(SimulatorBanks, ConflictsAreCountedPerWarpRequest) {
  struct Pattern {
    const char* name;
    uint32_t stride_bytes, vec;  // lane l accesses l * stride, vec floats
    int64_t wavefronts, conflicts;
  };
  for (const Pattern& p : {Pattern{"consecutive", 4, 1, 1, 0}, Pattern{"stride 2 words", 8, 1, 2, 1},
                           Pattern{"stride 32 words", 128, 1, 32, 31}, Pattern{"one word", 0, 1, 1, 0},
                           Pattern{"v4 consecutive", 16, 4, 4, 0}, Pattern{"v4 stride 8 words", 32, 4, 8, 4}}) {
    KernelBuilder b("banks");
    Reg out = b.param("out", Type::u64);
    const int sh = b.shared_array("tile", 32 * 128 + 16, 16);
    Reg lane = b.sreg(SReg::tid_x);
    Reg at = b.mad(Type::u32, lane, imm_u32(p.stride_bytes), b.shared_addr(sh));
    if (p.vec == 4) {
      const std::vector<Reg> v = b.ld_vec(Space::shared, Type::f32, at, 4);
      b.st(Space::global, Type::f32, b.address(out, lane, 4), v[0]);
    } else {
      b.st(Space::global, Type::f32, b.address(out, lane, 4), b.ld(Space::shared, Type::f32, at));
    }
    DeviceMemory mem;
    const uint64_t o = mem.alloc(32 * 4);
    const SimStats st =
        simulate(b.finish(), {1}, {32}, {o}, mem, SimOptions{.check_races = false, .count_requests = true});
    EXPECT_EQ(st.shared_requests, 1) << p.name;
    EXPECT_EQ(st.shared_wavefronts, p.wavefronts) << p.name;
    EXPECT_EQ(st.bank_conflicts, p.conflicts) << p.name;
  }
}

TEST(SimulatorSchedule, CorrectKernelsAgreeAcrossSeeds) {
  const auto prepared = prepare(block_reduce_kernel(256));
  const auto x = test_inputs(5000);  // not integers: the result depends on the order of the tree only
  std::vector<uint32_t> results;
  for (uint64_t seed : {1, 2, 3, 99}) {
    DeviceMemory mem;
    const uint64_t xa = upload(mem, x), out = mem.alloc(8);
    simulate(*prepared, {2}, {256}, {xa, out, 5000}, mem, SimOptions{.schedule_seed = seed});
    const auto r = download<float>(mem, out, 2);
    results.push_back(bits(r[0]));
    results.push_back(bits(r[1]));
  }
  for (size_t i = 2; i < results.size(); ++i) EXPECT_EQ(results[i], results[i % 2]);
}

// ---------------------------------------------------------------------------------------------
// Approximate instructions

struct ApproxCase {
  Opc op;
  double (*exact)(double);
  bool relative;
  double bound;   // the PTX ISA's maximum error
  double lo, hi;  // input range
};

TEST(SimulatorApprox, WithinDocumentedErrorButNotExact) {
  const ApproxCase cases[] = {
      {Opc::Ex2, [](double x) { return std::exp2(x); }, true, std::exp2(-22.5), -30, 30},
      {Opc::Lg2, [](double x) { return std::log2(x); }, false, std::exp2(-22.6), 0.5, 2},
      {Opc::Rcp, [](double x) { return 1 / x; }, true, std::exp2(-23), -100, 100},
      {Opc::Rsqrt, [](double x) { return 1 / std::sqrt(x); }, true, std::exp2(-22.9), 1e-6, 1e6},
      {Opc::Tanh, [](double x) { return std::tanh(x); }, true, std::exp2(-10.987), -6, 6},
      {Opc::Sin, [](double x) { return std::sin(x); }, false, std::exp2(-20.5), -std::numbers::pi, std::numbers::pi},
      {Opc::Cos, [](double x) { return std::cos(x); }, false, std::exp2(-20.5), -std::numbers::pi, std::numbers::pi},
  };
  const uint32_t n = 2000;
  for (const auto& c : cases) {
    KernelBuilder b(std::string("approx_") + kir::opc_name(c.op));
    Reg x = b.param("x", Type::u64), y = b.param("y", Type::u64);
    Reg i = b.sreg(SReg::tid_x);
    b.st(Space::global, Type::f32, b.address(y, i, 4),
         b.unary(c.op, Type::f32, b.ld(Space::global, Type::f32, b.address(x, i, 4))));
    std::vector<float> xs(n);
    for (uint32_t k = 0; k < n; ++k) {
      const double t = static_cast<double>(k) / (n - 1);
      xs[k] = static_cast<float>(c.op == Opc::Rsqrt ? c.lo * std::pow(c.hi / c.lo, t) : c.lo + (c.hi - c.lo) * t);
    }
    DeviceMemory mem;
    const uint64_t xa = upload(mem, xs), ya = mem.alloc(n * 4);
    const auto k = prepare(b.finish());
    simulate(*k, {1}, {n / 2}, {xa, ya}, mem);  // the first half of the inputs, then the second
    simulate(*k, {1}, {n / 2}, {xa + n * 2, ya + n * 2}, mem);
    const auto ys = download<float>(mem, ya, n);
    int inexact = 0;
    for (uint32_t k = 0; k < n; ++k) {
      if (xs[k] == 0 && c.op == Opc::Rcp) continue;
      const double e = c.exact(xs[k]);
      const double allowed = c.relative ? c.bound * std::fabs(e) : c.bound;
      ASSERT_LE(std::fabs(ys[k] - e), allowed) << kir::opc_name(c.op) << "(" << xs[k] << ")";
      if (c.op == Opc::Tanh || c.op == Opc::Sin || c.op == Opc::Cos) {
        ASSERT_LE(std::fabs(ys[k]), 1.0f);
      }
      inexact += ys[k] != static_cast<float>(e);
    }
    EXPECT_GT(inexact, static_cast<int>(n / 4))
        << kir::opc_name(c.op) << " is (nearly) exact: the perturbation is missing";
  }
}

TEST(SimulatorApprox, SpecialValuesAndFlushToZero) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    Opc op;
    float x, expected;
  };
  const Case cases[] = {
      {Opc::Ex2, -inf, 0.0f},
      {Opc::Ex2, inf, inf},
      {Opc::Ex2, -200.0f, 0.0f},
      {Opc::Ex2, 200.0f, inf},
      {Opc::Ex2, -130.0f, 0.0f},  // the result is subnormal: flushed
      {Opc::Lg2, 0.0f, -inf},
      {Opc::Lg2, -0.0f, -inf},
      {Opc::Lg2, -1.0f, nan},
      {Opc::Lg2, inf, inf},
      {Opc::Lg2, 1e-40f, -inf},  // subnormal input flushed to zero
      {Opc::Rcp, 0.0f, inf},
      {Opc::Rcp, -0.0f, -inf},
      {Opc::Rcp, inf, 0.0f},
      {Opc::Rcp, 1e-40f, inf},
      {Opc::Rsqrt, 0.0f, inf},
      {Opc::Rsqrt, -0.0f, -inf},
      {Opc::Rsqrt, -1.0f, nan},
      {Opc::Rsqrt, inf, 0.0f},
      {Opc::Tanh, inf, 1.0f},
      {Opc::Tanh, -inf, -1.0f},
      {Opc::Tanh, 0.0f, 0.0f},
      {Opc::Tanh, -0.0f, -0.0f},
      {Opc::Sin, inf, nan},
      {Opc::Cos, -inf, nan},
      {Opc::Sin, 0.0f, 0.0f},
      {Opc::Sqrt, -1.0f, nan},
      {Opc::Sqrt, 0x1p-140f, 0x1p-70f},
      {Opc::Ex2, nan, nan},
      {Opc::Sin, nan, nan},
  };
  for (const auto& c : cases) {
    ScalarProgram p;
    p.put(p.b().unary(c.op, Type::f32, imm_f32(c.x)));
    const float y = std::bit_cast<float>(static_cast<uint32_t>(p.run()[0]));
    if (std::isnan(c.expected)) {
      EXPECT_TRUE(std::isnan(y)) << kir::opc_name(c.op) << "(" << c.x << ") = " << y;
    } else {
      EXPECT_EQ(bits(y), bits(c.expected)) << kir::opc_name(c.op) << "(" << c.x << ") = " << y;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Speed (reported, never asserted)

// Runs a 64x64x64 product kernel (params a, b, c; 16x16 threads per block, 16x16 tiles) on
// fixed inputs, prints the simulated instruction rate under `label`, and checks every output
// bit for bit against fma in the same order. Returns the run's stats.
SimStats run_matmul64(const kir::Kernel& kernel, const char* label) {
  const uint32_t n = 64, tile = 16;
  const auto k = prepare(kernel);
  std::vector<float> av(n * n), bv(n * n);
  for (uint32_t i = 0; i < n * n; ++i) {
    av[i] = static_cast<float>(i % 17) * 0.25f - 1.0f;
    bv[i] = static_cast<float>(i % 11) * 0.5f - 2.0f;
  }
  DeviceMemory mem;
  const uint64_t aa = upload(mem, av), ba = upload(mem, bv), ca = mem.alloc(n * n * 4);
  const auto start = std::chrono::steady_clock::now();
  const SimStats stats = simulate(*k, {n / tile, n / tile}, {tile, tile}, {aa, ba, ca}, mem);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ %s ] %lld simulated instructions, %lld barriers in %.3f s: %.1f million instructions/s\n", label,
              static_cast<long long>(stats.instructions), static_cast<long long>(stats.barriers), seconds,
              static_cast<double>(stats.instructions) / seconds / 1e6);
  const auto cv = download<float>(mem, ca, n * n);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t j = 0; j < n; ++j) {
      float s = 0;
      for (uint32_t kk = 0; kk < n; ++kk) s = std::fma(av[i * n + kk], bv[kk * n + j], s);
      if (bits(cv[i * n + j]) != bits(s)) {
        ADD_FAILURE() << label << ": element " << i << "," << j << " differs";
        return stats;
      }
    }
  return stats;
}

TEST(SimulatorSpeed, NaiveMatmul64) {
  const uint32_t n = 64, tile = 16;
  KernelBuilder b("matmul");
  Reg a = b.param("a", Type::u64), bm = b.param("b", Type::u64), c = b.param("c", Type::u64);
  Reg row = b.mad(Type::u32, b.sreg(SReg::ctaid_y), imm_u32(tile), b.sreg(SReg::tid_y));
  Reg col = b.mad(Type::u32, b.sreg(SReg::ctaid_x), imm_u32(tile), b.sreg(SReg::tid_x));
  Reg acc = b.mov(Type::f32, imm_f32(0));
  Reg arow = b.mul(Type::u32, row, imm_u32(n));
  b.for_(imm_u32(0), imm_u32(n), imm_u32(1), [&](Reg k) {
    Reg x = b.ld(Space::global, Type::f32, b.address(a, b.add(Type::u32, arow, k), 4));
    Reg y = b.ld(Space::global, Type::f32, b.address(bm, b.mad(Type::u32, k, imm_u32(n), col), 4));
    b.assign(Opc::Fma, acc, {x, y, acc});
  });
  b.st(Space::global, Type::f32, b.address(c, b.mad(Type::u32, row, imm_u32(n), col), 4), acc);
  run_matmul64(b.finish(), "matmul 64^3");
}

// The same product through 16x16 tiles in shared memory: two barriers per tile step, every
// shared access race-checked.
TEST(SimulatorSpeed, TiledMatmul64) {
  const uint32_t n = 64, tile = 16;
  KernelBuilder b("tiled_matmul");
  Reg a = b.param("a", Type::u64), bm = b.param("b", Type::u64), c = b.param("c", Type::u64);
  const int as = b.shared_array("as", tile * tile * 4), bs = b.shared_array("bs", tile * tile * 4);
  Reg tx = b.sreg(SReg::tid_x), ty = b.sreg(SReg::tid_y);
  Reg row = b.mad(Type::u32, b.sreg(SReg::ctaid_y), imm_u32(tile), ty);
  Reg col = b.mad(Type::u32, b.sreg(SReg::ctaid_x), imm_u32(tile), tx);
  Reg mine = b.mul(Type::u32, b.mad(Type::u32, ty, imm_u32(tile), tx), imm_u32(4));
  Reg a_mine = b.add(Type::u32, b.shared_addr(as), mine), b_mine = b.add(Type::u32, b.shared_addr(bs), mine);
  Reg a_row = b.add(Type::u32, b.shared_addr(as), b.mul(Type::u32, ty, imm_u32(tile * 4)));
  Reg b_col = b.add(Type::u32, b.shared_addr(bs), b.mul(Type::u32, tx, imm_u32(4)));
  Reg acc = b.mov(Type::f32, imm_f32(0));
  b.for_(imm_u32(0), imm_u32(n), imm_u32(tile), [&](Reg k0) {
    Reg ai = b.mad(Type::u32, row, imm_u32(n), b.add(Type::u32, k0, tx));
    Reg bi = b.mad(Type::u32, b.add(Type::u32, k0, ty), imm_u32(n), col);
    b.st(Space::shared, Type::f32, a_mine, b.ld(Space::global, Type::f32, b.address(a, ai, 4)));
    b.st(Space::shared, Type::f32, b_mine, b.ld(Space::global, Type::f32, b.address(bm, bi, 4)));
    b.bar();
    b.for_(imm_u32(0), imm_u32(tile), imm_u32(1), [&](Reg k) {
      Reg x = b.ld(Space::shared, Type::f32, b.add(Type::u32, a_row, b.mul(Type::u32, k, imm_u32(4))));
      Reg y = b.ld(Space::shared, Type::f32, b.add(Type::u32, b_col, b.mul(Type::u32, k, imm_u32(tile * 4))));
      b.assign(Opc::Fma, acc, {x, y, acc});
    });
    b.bar();
  });
  b.st(Space::global, Type::f32, b.address(c, b.mad(Type::u32, row, imm_u32(n), col), 4), acc);
  EXPECT_EQ(run_matmul64(b.finish(), "tiled matmul 64^3").barriers, 16 * 2 * (n / tile));
}

}  // namespace
}  // namespace kiln::sim
