// Known-answer tests of ldmatrix (kir::Opc::Ldmatrix) in the SIMT simulator, on a GPU (T5) and in
// ptxas. Two checks that share no code with the simulator:
//  - every form (x1, x2, x4, each plain and .trans) over rows whose addresses the lanes give in a
//    scrambled order, against the PTX ISA's ldmatrix layout written out here ("lane 8m + r gives
//    row r of matrix m; lane l receives elements 2 (l % 4) and 2 (l % 4) + 1 of row l / 4",
//    transposed: of column l / 4);
//  - ldmatrix feeding mma.sync m16n8k16 bf16: A (16 x 16) and B (16 x 8) stored row-major in
//    shared memory, A's fragments by x4 and B's by x2.trans, must give the exact product. The
//    mma's fragment tables were checked on GPUs (test_mma.cpp), so an ldmatrix layout that
//    disagreed with the hardware's would fail here even where the first check shares its error.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include <kiln/cuda/driver/driver_api.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

#include "device_test_util.hpp"
#include "ptxas_skip.hpp"

namespace kiln::cuda {
namespace {

using kir::imm_u32;
using kir::Reg;
using kir::Space;
using kir::Type;

constexpr int kRows = 32, kRowBytes = 32;  // 32 stored rows of 8 b16 elements, padded to 32 bytes

// The 16-bit value stored at element `col` of stored row `row`: unique per element.
uint16_t stored(int row, int col) { return static_cast<uint16_t>(0x1000 + row * 16 + col); }
// The row lane l's address points at: a fixed scramble of the 32 rows.
int address_row(int lane) { return (lane * 5 + 3) % kRows; }

// Fills shared memory from `rows` (kRows x 4 u32, row-major: the 8 elements of each row), then
// each lane gives the address of stored row address_row(lane) (x1/x2 ignore the upper lanes'),
// runs ldmatrix and stores its `count` registers to out[lane * 4 + i].
kir::Kernel ldmatrix_kernel(int count, bool trans) {
  kir::KernelBuilder b("ldmatrix_known_answer_x" + std::to_string(count) + (trans ? "_trans" : ""));
  Reg prows = b.param("rows", Type::u64), pout = b.param("out", Type::u64);
  Reg lane = b.sreg(kir::SReg::tid_x);
  Reg tile = b.shared_addr(b.shared_array("tile", kRows * kRowBytes));
  Reg src = b.address(prows, b.mul(Type::u32, lane, imm_u32(4)), 4);
  Reg dst = b.mad(Type::u32, lane, imm_u32(kRowBytes), tile);
  for (int w = 0; w < 4; ++w) b.st(Space::shared, Type::u32, dst, b.ld(Space::global, Type::u32, src, 4 * w), 4 * w);
  b.bar();
  Reg row = b.rem(Type::u32, b.add(Type::u32, b.mul(Type::u32, lane, imm_u32(5)), imm_u32(3)), imm_u32(kRows));
  const std::vector<Reg> d = b.ldmatrix(count, trans, b.mad(Type::u32, row, imm_u32(kRowBytes), tile));
  Reg at = b.address(pout, b.mul(Type::u32, lane, imm_u32(4)), 4);
  for (int i = 0; i < count; ++i) b.st(Space::global, Type::u32, at, d[static_cast<size_t>(i)], 4 * i);
  return b.finish();
}

std::vector<uint32_t> run_ldmatrix(Runtime& rt, int count, bool trans) {
  std::vector<uint32_t> rows;
  for (int r = 0; r < kRows; ++r)
    for (int w = 0; w < 4; ++w) rows.push_back(stored(r, 2 * w) | uint32_t{stored(r, 2 * w + 1)} << 16);
  const kir::Kernel k = ldmatrix_kernel(count, trans);
  LoadedKernel lk = rt.load(k);
  CUdeviceptr drows = rt.alloc(rows.size() * 4), dout = rt.alloc(32 * 4 * 4);
  rt.upload(drows, rows.data(), rows.size() * 4);
  rt.launch(lk, Dim3{1, 1, 1}, Dim3{32, 1, 1}, {drows, dout});
  rt.synchronize();
  std::vector<uint32_t> out(32 * 4);
  rt.download(out.data(), dout, out.size() * 4);
  rt.free(drows);
  rt.free(dout);
  return out;
}

void expect_ldmatrix_known_answers(Runtime& rt) {
  for (int count : {1, 2, 4})
    for (bool trans : {false, true}) {
      const std::vector<uint32_t> out = run_ldmatrix(rt, count, trans);
      for (int lane = 0; lane < 32; ++lane)
        for (int m = 0; m < count; ++m) {
          const int g = lane / 4, q = lane % 4;
          // Matrix m's row r is the stored row lane 8m + r points at.
          auto element = [&](int r, int c) { return stored(address_row(8 * m + r), c); };
          const uint16_t lo = trans ? element(2 * q, g) : element(g, 2 * q);
          const uint16_t hi = trans ? element(2 * q + 1, g) : element(g, 2 * q + 1);
          ASSERT_EQ(out[static_cast<size_t>(lane * 4 + m)], lo | uint32_t{hi} << 16)
              << "x" << count << (trans ? ".trans" : "") << " lane " << lane << " matrix " << m;
        }
    }
}

TEST(Ldmatrix, KnownAnswersInTheSimulator) { expect_ldmatrix_known_answers(testing::fake_runtime()); }

TEST(Ldmatrix, GpuKnownAnswers) {
  KILN_GPU_OR_SKIP(rt);
  expect_ldmatrix_known_answers(*rt);
}

// --- ldmatrix feeding mma.sync -----------------------------------------------------------------
uint16_t bf16_of(int v) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16); }
int a_value(int r, int c) { return (r * 7 + c * 3) % 9 - 4; }   // A: 16 x 16
int b_value(int r, int c) { return (r * 5 + c * 11) % 7 - 3; }  // B: 16 x 8

// Shared memory: A row-major (16 rows of 32 bytes), then B row-major (16 rows of 16 bytes). Lane
// l gives A's row (l % 8) + 8 ((l / 8) % 2), at column 8 (l / 16) (x4: matrices rows 0-7 / 8-15
// by columns 0-7 / 8-15, in the order of a0a1, a2a3, a4a5, a6a7), and B's row l % 16 (x2.trans:
// k rows 0-7, then 8-15).
kir::Kernel ldmatrix_mma_kernel() {
  kir::KernelBuilder b("ldmatrix_into_mma_bf16");
  Reg pa = b.param("a", Type::u64), pb = b.param("b", Type::u64), pd = b.param("d", Type::u64);
  Reg lane = b.sreg(kir::SReg::tid_x);
  Reg sa = b.shared_addr(b.shared_array("a", 16 * 32));
  Reg sb = b.shared_addr(b.shared_array("b", 16 * 16));
  // 32 lanes copy A (128 u32: 4 each) and B (64 u32: 2 each), word for word.
  Reg wa = b.mul(Type::u32, lane, imm_u32(4)), wb = b.mul(Type::u32, lane, imm_u32(2));
  for (int w = 0; w < 4; ++w) {
    Reg word = b.add(Type::u32, wa, imm_u32(static_cast<uint32_t>(w)));
    b.st(Space::shared, Type::u32, b.mad(Type::u32, word, imm_u32(4), sa),
         b.ld(Space::global, Type::u32, b.address(pa, word, 4)));
  }
  for (int w = 0; w < 2; ++w) {
    Reg word = b.add(Type::u32, wb, imm_u32(static_cast<uint32_t>(w)));
    b.st(Space::shared, Type::u32, b.mad(Type::u32, word, imm_u32(4), sb),
         b.ld(Space::global, Type::u32, b.address(pb, word, 4)));
  }
  b.bar();
  Reg a_row = b.add(Type::u32, b.rem(Type::u32, lane, imm_u32(8)),
                    b.mul(Type::u32, b.rem(Type::u32, b.div(Type::u32, lane, imm_u32(8)), imm_u32(2)), imm_u32(8)));
  Reg a_col = b.mul(Type::u32, b.div(Type::u32, lane, imm_u32(16)), imm_u32(8));
  Reg a_addr = b.mad(Type::u32, b.add(Type::u32, b.mul(Type::u32, a_row, imm_u32(16)), a_col), imm_u32(2), sa);
  Reg b_addr = b.mad(Type::u32, b.rem(Type::u32, lane, imm_u32(16)), imm_u32(16), sb);
  const std::vector<Reg> fa = b.ldmatrix(4, false, a_addr);
  const std::vector<Reg> fb = b.ldmatrix(2, true, b_addr);
  const kir::Operand zero = kir::imm_f32(0.0f);
  const std::vector<Reg> d =
      b.mma(kir::MmaShape::m16n8k16_bf16, {fa[0], fa[1], fa[2], fa[3]}, {fb[0], fb[1]}, {zero, zero, zero, zero});
  Reg at = b.address(pd, b.mul(Type::u32, lane, imm_u32(4)), 4);
  for (int i = 0; i < 4; ++i) b.st(Space::global, Type::f32, at, d[static_cast<size_t>(i)], 4 * i);
  return b.finish();
}

void expect_ldmatrix_feeds_mma(Runtime& rt) {
  std::vector<uint32_t> a, bm;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; c += 2) a.push_back(bf16_of(a_value(r, c)) | uint32_t{bf16_of(a_value(r, c + 1))} << 16);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; c += 2) bm.push_back(bf16_of(b_value(r, c)) | uint32_t{bf16_of(b_value(r, c + 1))} << 16);
  const kir::Kernel k = ldmatrix_mma_kernel();
  LoadedKernel lk = rt.load(k);
  CUdeviceptr da = rt.alloc(a.size() * 4), db = rt.alloc(bm.size() * 4), dd = rt.alloc(32 * 4 * 4);
  rt.upload(da, a.data(), a.size() * 4);
  rt.upload(db, bm.data(), bm.size() * 4);
  rt.launch(lk, Dim3{1, 1, 1}, Dim3{32, 1, 1}, {da, db, dd});
  rt.synchronize();
  std::vector<float> d(32 * 4);
  rt.download(d.data(), dd, d.size() * 4);
  for (CUdeviceptr x : {da, db, dd}) rt.free(x);
  // D's fragment table (test_mma.cpp's `acc`): c0 c1 at row g, c2 c3 at row g + 8; column 2q + (i & 1).
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int row = lane / 4 + (i < 2 ? 0 : 8), col = 2 * (lane % 4) + (i & 1);
      int want = 0;
      for (int kk = 0; kk < 16; ++kk) want += a_value(row, kk) * b_value(kk, col);
      ASSERT_EQ(d[static_cast<size_t>(lane * 4 + i)], static_cast<float>(want)) << "D[" << row << "][" << col << "]";
    }
}

TEST(Ldmatrix, FeedsMmaWithTheFragmentsOfRowMajorOperandsInTheSimulator) {
  expect_ldmatrix_feeds_mma(testing::fake_runtime());
}

TEST(Ldmatrix, GpuFeedsMmaWithTheFragmentsOfRowMajorOperands) {
  KILN_GPU_OR_SKIP(rt);
  expect_ldmatrix_feeds_mma(*rt);
}

TEST(Ldmatrix, KernelsPassPtxas) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  std::vector<kir::Kernel> kernels;
  for (int count : {1, 2, 4})
    for (bool trans : {false, true}) kernels.push_back(ldmatrix_kernel(count, trans));
  kernels.push_back(ldmatrix_mma_kernel());
  std::vector<const kir::Kernel*> ptrs;
  for (const kir::Kernel& k : kernels) ptrs.push_back(&k);
  testing::expect_ptxas_accepts(ptrs);
}

}  // namespace
}  // namespace kiln::cuda
