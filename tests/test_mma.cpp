// Known-answer tests of mma.sync (kir::Opc::Mma) in the SIMT simulator, on a GPU (T5) and in
// ptxas. The fragments are built here from the PTX ISA's layout tables ("Matrix Fragments for
// mma.m16n8k8" and "for mma.m16n8k16 with floating point type"), written out element by element
// as the ISA states them and sharing no code with the simulator: the kernel only loads each
// lane's registers from arrays this file fills and stores its D registers back, so a fragment
// the simulator (or this file) maps wrongly gives a wrong product. Matrices of small integers
// are exact in tf32, bf16 and f16 and their products exact in f32: results compare exactly.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <kiln/cuda/driver/driver_api.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

#include "device_test_util.hpp"
#include "ptxas_skip.hpp"

namespace kiln::cuda {
namespace {

using kir::MmaShape;
using kir::Reg;
using kir::Space;
using kir::Type;

struct RowCol {
  int row, col;
};

// --- the ISA's tables: where each lane's fragment elements sit ------------------------------
// groupID = laneid >> 2, threadID_in_group = laneid % 4.
int group_id(int lane) { return lane >> 2; }
int thread_in_group(int lane) { return lane % 4; }

// m16n8k8 .tf32, A (16 x 8): a0..a3.
// row = groupID for a0 and a2, groupID + 8 for a1 and a3;
// col = threadID_in_group for a0 and a1, threadID_in_group + 4 for a2 and a3.
RowCol tf32_a(int lane, int i) {
  const int row = (i == 0 || i == 2) ? group_id(lane) : group_id(lane) + 8;
  const int col = (i == 0 || i == 1) ? thread_in_group(lane) : thread_in_group(lane) + 4;
  return {row, col};
}
// m16n8k8 .tf32, B (8 x 8): b0, b1. row = threadID_in_group for b0, + 4 for b1; col = groupID.
RowCol tf32_b(int lane, int i) { return {i == 0 ? thread_in_group(lane) : thread_in_group(lane) + 4, group_id(lane)}; }
// m16n8k16 .bf16/.f16, A (16 x 16): elements a0..a7, two to a register (a0 a1 in the first).
// row = groupID for ai with 0 <= i < 2 or 4 <= i < 6, else groupID + 8;
// col = threadID_in_group * 2 + (i & 1) for ai with i < 4, else that + 8.
RowCol half_a(int lane, int i) {
  const int row = (i < 2 || (i >= 4 && i < 6)) ? group_id(lane) : group_id(lane) + 8;
  const int col = thread_in_group(lane) * 2 + (i & 1) + (i < 4 ? 0 : 8);
  return {row, col};
}
// m16n8k16 .bf16/.f16, B (16 x 8): elements b0..b3, two to a register.
// row = threadID_in_group * 2 + (i & 1) for bi with i < 2, else that + 8; col = groupID.
RowCol half_b(int lane, int i) { return {thread_in_group(lane) * 2 + (i & 1) + (i < 2 ? 0 : 8), group_id(lane)}; }
// C and D (16 x 8, f32): c0..c3. row = groupID for c0 and c1, groupID + 8 for c2 and c3;
// col = threadID_in_group * 2 + (i & 1).
RowCol acc(int lane, int i) {
  return {i < 2 ? group_id(lane) : group_id(lane) + 8, thread_in_group(lane) * 2 + (i & 1)};
}

// --- element encodings -----------------------------------------------------------------------
uint16_t bf16_bits(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }  // exact for small ints
uint16_t f16_bits(float f) {  // small integers only: exact
  if (f == 0) return 0;
  const uint16_t sign = f < 0 ? 0x8000 : 0;
  float m = f < 0 ? -f : f;
  int e = 0;
  while (m >= 2) m /= 2, ++e;
  const auto mant = static_cast<uint16_t>((m - 1) * 1024);
  return static_cast<uint16_t>(sign | (e + 15) << 10 | mant);
}

struct Problem {
  MmaShape shape;
  int k;                             // 8 (tf32) or 16
  std::vector<float> a, b, c;        // A (16 x k), B (k x 8), C (16 x 8), row-major
  std::vector<uint32_t> fa, fb, fc;  // per lane: 4, 2 and 4 registers
};

Problem make_problem(MmaShape shape, uint32_t seed) {
  Problem p{shape, shape == MmaShape::m16n8k8_tf32 ? 8 : 16, {}, {}, {}, {}, {}, {}};
  auto value = [&](uint32_t i) { return static_cast<float>(static_cast<int>((i * 2654435761u + seed) >> 28) - 8); };
  for (int i = 0; i < 16 * p.k; ++i) p.a.push_back(value(static_cast<uint32_t>(i)));
  for (int i = 0; i < p.k * 8; ++i) p.b.push_back(value(static_cast<uint32_t>(1000 + i)));
  for (int i = 0; i < 16 * 8; ++i) p.c.push_back(value(static_cast<uint32_t>(2000 + i)));
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const RowCol rc = acc(lane, i);
      p.fc.push_back(std::bit_cast<uint32_t>(p.c[static_cast<size_t>(rc.row * 8 + rc.col)]));
    }
    if (shape == MmaShape::m16n8k8_tf32) {
      for (int i = 0; i < 4; ++i) {
        const RowCol rc = tf32_a(lane, i);
        p.fa.push_back(std::bit_cast<uint32_t>(p.a[static_cast<size_t>(rc.row * p.k + rc.col)]));
      }
      for (int i = 0; i < 2; ++i) {
        const RowCol rc = tf32_b(lane, i);
        p.fb.push_back(std::bit_cast<uint32_t>(p.b[static_cast<size_t>(rc.row * 8 + rc.col)]));
      }
      continue;
    }
    auto bits = [&](float f) -> uint32_t { return shape == MmaShape::m16n8k16_bf16 ? bf16_bits(f) : f16_bits(f); };
    for (int r = 0; r < 4; ++r) {  // register r: elements 2r (low half) and 2r + 1 (high half)
      const RowCol lo = half_a(lane, 2 * r), hi = half_a(lane, 2 * r + 1);
      p.fa.push_back(bits(p.a[static_cast<size_t>(lo.row * p.k + lo.col)]) |
                     bits(p.a[static_cast<size_t>(hi.row * p.k + hi.col)]) << 16);
    }
    for (int r = 0; r < 2; ++r) {
      const RowCol lo = half_b(lane, 2 * r), hi = half_b(lane, 2 * r + 1);
      p.fb.push_back(bits(p.b[static_cast<size_t>(lo.row * 8 + lo.col)]) |
                     bits(p.b[static_cast<size_t>(hi.row * 8 + hi.col)]) << 16);
    }
  }
  return p;
}

// One warp: loads its registers (lane l: fa[4l..], fb[2l..], fc[4l..]), runs mma.sync, stores D.
kir::Kernel mma_kernel(MmaShape shape) {
  kir::KernelBuilder b(std::string("mma_known_answer_") + std::to_string(static_cast<int>(shape)));
  Reg pa = b.param("fa", Type::u64), pb = b.param("fb", Type::u64), pc = b.param("fc", Type::u64),
      pd = b.param("d", Type::u64);
  Reg lane = b.sreg(kir::SReg::tid_x);
  const Type ab = shape == MmaShape::m16n8k8_tf32 ? Type::f32 : Type::u32;
  auto load = [&](Reg base, int per_lane, Type t) {
    std::vector<kir::Operand> regs;
    Reg at = b.address(base, b.mul(Type::u32, lane, kir::imm_u32(static_cast<uint32_t>(per_lane))), 4);
    for (int i = 0; i < per_lane; ++i) regs.push_back(b.ld(Space::global, t, at, 4 * i));
    return regs;
  };
  const std::vector<Reg> d = b.mma(shape, load(pa, 4, ab), load(pb, 2, ab), load(pc, 4, Type::f32));
  Reg at = b.address(pd, b.mul(Type::u32, lane, kir::imm_u32(4)), 4);
  for (int i = 0; i < 4; ++i) b.st(Space::global, Type::f32, at, d[static_cast<size_t>(i)], 4 * i);
  return b.finish();
}

// D (16 x 8, row-major) as the device computed it, read back through the ISA's C/D table.
std::vector<float> run_mma(Runtime& rt, const Problem& p) {
  const kir::Kernel k = mma_kernel(p.shape);
  LoadedKernel lk = rt.load(k);
  auto put = [&](const std::vector<uint32_t>& v) {
    CUdeviceptr at = rt.alloc(v.size() * 4);
    rt.upload(at, v.data(), v.size() * 4);
    return at;
  };
  CUdeviceptr fa = put(p.fa), fb = put(p.fb), fc = put(p.fc), fd = rt.alloc(32 * 4 * 4);
  rt.launch(lk, Dim3{1, 1, 1}, Dim3{32, 1, 1}, {fa, fb, fc, fd});
  rt.synchronize();
  std::vector<float> regs(32 * 4), d(16 * 8, -1.0f);
  rt.download(regs.data(), fd, regs.size() * 4);
  for (CUdeviceptr x : {fa, fb, fc, fd}) rt.free(x);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const RowCol rc = acc(lane, i);
      d[static_cast<size_t>(rc.row * 8 + rc.col)] = regs[static_cast<size_t>(lane * 4 + i)];
    }
  return d;
}

void expect_known_answers(Runtime& rt) {
  for (MmaShape shape : {MmaShape::m16n8k8_tf32, MmaShape::m16n8k16_bf16, MmaShape::m16n8k16_f16})
    for (uint32_t seed : {1u, 77u}) {
      const Problem p = make_problem(shape, seed);
      const std::vector<float> d = run_mma(rt, p);
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c) {
          double want = p.c[static_cast<size_t>(r * 8 + c)];
          for (int kk = 0; kk < p.k; ++kk)
            want += static_cast<double>(p.a[static_cast<size_t>(r * p.k + kk)]) * p.b[static_cast<size_t>(kk * 8 + c)];
          ASSERT_EQ(d[static_cast<size_t>(r * 8 + c)], static_cast<float>(want))
              << kir::mma_shape_name(shape) << " seed " << seed << " D[" << r << "][" << c << "]";
        }
    }
}

TEST(Mma, KnownAnswersInTheSimulator) { expect_known_answers(testing::fake_runtime()); }

TEST(Mma, GpuKnownAnswers) {
  KILN_GPU_OR_SKIP(rt);
  expect_known_answers(*rt);
}

// cvt.rna.tf32.f32 (kir::Opc::RoundTf32): to nearest on the 13 dropped bits, ties away from zero.
std::vector<float> run_round_tf32(Runtime& rt, const std::vector<float>& x) {
  kir::KernelBuilder b("round_tf32");
  Reg px = b.param("x", Type::u64), py = b.param("y", Type::u64);
  Reg i = b.sreg(kir::SReg::tid_x);
  Reg v = b.ld(Space::global, Type::f32, b.address(px, i, 4));
  b.st(Space::global, Type::f32, b.address(py, i, 4), b.unary(kir::Opc::RoundTf32, Type::f32, v));
  const kir::Kernel k = b.finish();
  LoadedKernel lk = rt.load(k);
  CUdeviceptr dx = rt.alloc(x.size() * 4), dy = rt.alloc(x.size() * 4);
  rt.upload(dx, x.data(), x.size() * 4);
  rt.launch(lk, Dim3{1, 1, 1}, Dim3{static_cast<uint32_t>(x.size()), 1, 1}, {dx, dy});
  rt.synchronize();
  std::vector<float> y(x.size());
  rt.download(y.data(), dy, y.size() * 4);
  rt.free(dx);
  rt.free(dy);
  return y;
}

void expect_tf32_rounding(Runtime& rt) {
  const float ulp = 1.0f / 1024;  // tf32's unit in the last place at 1
  const std::vector<float> x = {
      1.0f + ulp / 2, 1.0f + ulp / 4, 1.0f + 3 * ulp / 4, -(1.0f + ulp / 2), 1.0f + 1.5f * ulp,
      0.0f,           -0.0f,          INFINITY,           -INFINITY,         3.0f};
  const std::vector<float> want = {1.0f + ulp, 1.0f,  1.0f + ulp, -(1.0f + ulp), 1.0f + 2 * ulp,
                                   0.0f,       -0.0f, INFINITY,   -INFINITY,     3.0f};
  const std::vector<float> y = run_round_tf32(rt, x);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want[i])) << "x = " << x[i];
  EXPECT_TRUE(std::isnan(run_round_tf32(rt, {NAN})[0]));
}

TEST(Mma, RoundTf32KnownAnswersInTheSimulator) { expect_tf32_rounding(testing::fake_runtime()); }

TEST(Mma, GpuRoundTf32KnownAnswers) {
  KILN_GPU_OR_SKIP(rt);
  expect_tf32_rounding(*rt);
}

// cvt.rn.bf16x2.f32 (kir::Opc::PackBf16x2): y[i] = bf16(x[2i]) in the low half, bf16(x[2i + 1])
// in the high half, to nearest with ties to even.
kir::Kernel pack_bf16x2_kernel() {
  kir::KernelBuilder b("pack_bf16x2");
  Reg px = b.param("x", Type::u64), py = b.param("y", Type::u64);
  Reg i = b.sreg(kir::SReg::tid_x);
  Reg lo = b.ld(Space::global, Type::f32, b.address(px, b.mul(Type::u32, i, kir::imm_u32(2)), 4));
  Reg hi = b.ld(Space::global, Type::f32, b.address(px, b.mul(Type::u32, i, kir::imm_u32(2)), 4), 4);
  b.st(Space::global, Type::u32, b.address(py, i, 4), b.pack_bf16x2(lo, hi));
  return b.finish();
}

void expect_bf16x2_packing(Runtime& rt) {
  const float e7 = 1.0f / 128;  // bf16's unit in the last place at 1
  const std::vector<float> x = {1.0f,
                                2.0f,
                                1.0f + e7 / 2,
                                1.0f + 3 * e7 / 2,
                                -0.0f,
                                -(1.0f + e7 / 4),
                                std::numeric_limits<float>::max(),
                                INFINITY,
                                1.0f + 5 * e7 / 8,
                                -3.5f,
                                NAN,
                                0.5f};
  // 1 + e7/2 is a tie: to the even 1.0; 1 + 3 e7/2 a tie: to the even 1 + 2 e7; FLT_MAX past the
  // largest bf16 (3.39e38): infinity.
  const std::vector<uint32_t> want = {0x40003f80u, 0x3f823f80u, 0xbf808000u, 0x7f807f80u, 0xc0603f81u};
  const kir::Kernel k = pack_bf16x2_kernel();
  LoadedKernel lk = rt.load(k);
  CUdeviceptr dx = rt.alloc(x.size() * 4), dy = rt.alloc(x.size() * 2);
  rt.upload(dx, x.data(), x.size() * 4);
  rt.launch(lk, Dim3{1, 1, 1}, Dim3{static_cast<uint32_t>(x.size() / 2), 1, 1}, {dx, dy});
  rt.synchronize();
  std::vector<uint32_t> y(x.size() / 2);
  rt.download(y.data(), dy, y.size() * 4);
  rt.free(dx);
  rt.free(dy);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(y[i], want[i]) << std::hex << "pair " << i << ": " << x[2 * i] << ", " << x[2 * i + 1];
  EXPECT_EQ(y[5] & 0x7f80u, 0x7f80u) << "NaN keeps an all-ones exponent";
  EXPECT_NE(y[5] & 0x7fu, 0u) << "NaN keeps a non-zero mantissa";
  EXPECT_EQ(y[5] >> 16, 0x3f00u) << "0.5 beside a NaN";
}

TEST(Mma, PackBf16x2KnownAnswersInTheSimulator) { expect_bf16x2_packing(testing::fake_runtime()); }

TEST(Mma, GpuPackBf16x2KnownAnswers) {
  KILN_GPU_OR_SKIP(rt);
  expect_bf16x2_packing(*rt);
}

TEST(Mma, KernelsPassPtxas) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (MmaShape shape : {MmaShape::m16n8k8_tf32, MmaShape::m16n8k16_bf16, MmaShape::m16n8k16_f16}) {
    const kir::Kernel k = mma_kernel(shape);
    testing::expect_ptxas_accepts({&k});
  }
  const kir::Kernel pack = pack_bf16x2_kernel();
  testing::expect_ptxas_accepts({&pack});
}

}  // namespace
}  // namespace kiln::cuda
