// Known-answer tests of sm_90a's wgmma (kir::Opc::Wgmma and its fence and group operations) in the
// SIMT simulator, on a GPU (T5, an H100 or H200) and in ptxas, and the misuses the simulator must
// report. The shared-memory images are written here from the PTX ISA's words for the 128-byte
// swizzled canonical layouts, not from the simulator's or the lowering's formulas:
//  - K-major: atoms of 8 rows of 128 bytes (64 bf16 along k), atom i at i * SBO; in row j of an
//    atom, the 16-byte chunk c (k 8c .. 8c + 7) sits at chunk position c XOR j;
//  - MN-major: atoms of 8 k-rows of 64 elements along m (or n), atom (p along MN, q along K) at
//    p * LBO + q * SBO; in k-row j, chunk c (elements 8c .. 8c + 7 of the 64) at position c XOR j.
// A k tile of 64 is four wgmma k16 slices: K-major slices start 32 bytes apart, MN-major ones
// two atoms along K (2 SBO) apart. D's fragment is the PTX ISA's figure for m64nNk16 (CuTe's
// CLayout_64xN): thread l of the warpgroup holds rows 16 (l / 32) + (l % 32) / 4 and + 8, register
// 4 j + i at column 8 j + 2 (l % 4) + i % 2, row + 8 for i >= 2.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <kiln/cuda/driver/driver_api.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

#include "device_test_util.hpp"
#include "ptxas_skip.hpp"
#include "sim_test_util.hpp"

namespace kiln::cuda {
namespace {

using kir::imm_u32;
using kir::imm_u64;
using kir::Reg;
using kir::Space;
using kir::Type;

constexpr uint32_t kTileK = 64;                      // one 128-byte swizzle row of bf16
constexpr uint64_t kSwizzle128 = uint64_t{1} << 62;  // the descriptor's swizzle field: 128 bytes

uint16_t bf16_of(int v) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16); }
int a_value(uint32_t r, uint32_t k) { return static_cast<int>((r * 7 + k * 3) % 9) - 4; }
int b_value(uint32_t k, uint32_t c) { return static_cast<int>((k * 5 + c * 11) % 7) - 3; }
int c_value(uint32_t t, uint32_t i) { return static_cast<int>((t + 3 * i) % 5) - 2; }

struct Case {
  uint32_t n = 64;      // wgmma's N
  uint32_t groups = 1;  // warpgroups, each with its own 64 rows of A
  bool a_mn = false;    // A stored MN-major (trans-a)
  bool b_mn = false;    // B stored MN-major (trans-b)
  // Planted misuses, each of which the simulator must report.
  bool no_proxy_fence = false, no_wgmma_fence = false, no_wait = false;
  bool overwrite_in_flight = false;  // A's first bytes stored to after the issue, before the wait
  bool write_acc_in_flight = false;  // an accumulator set after the issue, before the wait
  // Not a misuse: warp 0 runs a shuffle the others do not before the wgmma (they wait for it).
  bool shuffle_first = false;
  uint32_t rows_a() const { return 64 * groups; }
  std::string name() const {
    return "wgmma_known_answer_n" + std::to_string(n) + "_g" + std::to_string(groups) + (a_mn ? "_amn" : "_ak") +
           (b_mn ? "_bmn" : "_bk") + (no_proxy_fence ? "_no_proxy_fence" : "") +
           (no_wgmma_fence ? "_no_wgmma_fence" : "") + (no_wait ? "_no_wait" : "") +
           (overwrite_in_flight ? "_overwrite_in_flight" : "") + (write_acc_in_flight ? "_write_acc_in_flight" : "") +
           (shuffle_first ? "_shuffle_first" : "");
  }
};

// Byte offsets of element (row, k) of an operand of `rows` rows x kTileK in the two layouts,
// with the strides the kernel's descriptors give (K-major: SBO 1024; MN-major: LBO 1024 between
// 64-element atoms along rows, SBO = rows / 64 * 1024 between 8-row atoms along k).
uint32_t k_major_at(uint32_t row, uint32_t k) {
  const uint32_t atom = row / 8, j = row % 8, chunk = k / 8;
  return atom * 1024 + j * 128 + ((chunk ^ j) * 16) + 2 * (k % 8);
}
uint32_t mn_major_at(uint32_t rows, uint32_t row, uint32_t k) {
  const uint32_t p = row / 64, q = k / 8, j = k % 8, chunk = (row % 64) / 8;
  return p * 1024 + q * (rows / 64 * 1024) + j * 128 + ((chunk ^ j) * 16) + 2 * (row % 8);
}

// The shared image of an operand: rows x kTileK bf16 values value(row, k), as u32 words.
std::vector<uint32_t> image(uint32_t rows, bool mn, int (*value)(uint32_t, uint32_t), bool transposed_value) {
  std::vector<uint16_t> half(rows * kTileK);
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t k = 0; k < kTileK; ++k)
      half[(mn ? mn_major_at(rows, r, k) : k_major_at(r, k)) / 2] =
          bf16_of(transposed_value ? value(k, r) : value(r, k));
  std::vector<uint32_t> words(half.size() / 2);
  for (size_t w = 0; w < words.size(); ++w) words[w] = half[2 * w] | uint32_t{half[2 * w + 1]} << 16;
  return words;
}

// Copies the images (words) into 1024-aligned shared arrays, runs the four k16 slices as one
// group on accumulators loaded from c, and stores them to d[t * n / 2 + i].
kir::Kernel wgmma_kernel(const Case& c) {
  kir::KernelBuilder b(c.name());
  Reg pa = b.param("a", Type::u64), pb = b.param("b", Type::u64), pc = b.param("c", Type::u64),
      pd = b.param("d", Type::u64);
  Reg tid = b.sreg(kir::SReg::tid_x);
  const uint32_t threads = 128 * c.groups, a_bytes = c.rows_a() * kTileK * 2, b_bytes = c.n * kTileK * 2;
  Reg sa = b.shared_addr(b.shared_array("a", a_bytes, 1024));
  Reg sb = b.shared_addr(b.shared_array("b", b_bytes, 1024));
  for (const auto& copy : {std::tuple{pa, sa, a_bytes}, std::tuple{pb, sb, b_bytes}}) {
    const Reg src = std::get<0>(copy), dst = std::get<1>(copy);  // plain variables: the lambda captures them (clang 14)
    b.for_(tid, imm_u32(std::get<2>(copy) / 4), imm_u32(threads), [&](Reg w) {
      b.st(Space::shared, Type::u32, b.mad(Type::u32, w, imm_u32(4), dst),
           b.ld(Space::global, Type::u32, b.address(src, w, 4)));
    });
  }
  if (!c.no_proxy_fence) b.fence_proxy_async();
  b.bar();
  const uint32_t n_acc = c.n / 2;
  Reg at = b.address(pc, b.mul(Type::u32, tid, imm_u32(n_acc)), 4);
  std::vector<Reg> acc;
  for (uint32_t i = 0; i < n_acc; ++i) acc.push_back(b.ld(Space::global, Type::f32, at, 4 * i));
  // Descriptor: start >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, 128-byte swizzle.
  auto descriptor = [&](Reg start, uint32_t lbo, uint32_t sbo) {
    Reg field = b.cvt(Type::u64, b.and_(Type::u32, b.shr(Type::u32, start, imm_u32(4)), imm_u32(0x3fff)));
    return b.or_(Type::u64, field, imm_u64(kSwizzle128 | uint64_t{sbo >> 4} << 32 | uint64_t{lbo >> 4} << 16));
  };
  // Warpgroup g's 64 rows of A: 8 K-major atoms (8 KiB) or one MN-major atom along rows further on.
  Reg group = b.div(Type::u32, tid, imm_u32(128));
  Reg a_start = b.mad(Type::u32, group, imm_u32(c.a_mn ? 1024 : 8192), sa);
  if (c.shuffle_first)
    b.if_(b.setp(kir::Cmp::lt, tid, imm_u32(32)), [&] { acc[0] = b.shfl(kir::ShflMode::bfly, acc[0], imm_u32(0)); });
  if (!c.no_wgmma_fence) b.wgmma_fence();
  for (uint32_t s = 0; s < kTileK / 16; ++s) {
    const uint32_t a_sbo = c.a_mn ? c.rows_a() / 64 * 1024 : 1024, b_sbo = c.b_mn ? c.n / 64 * 1024 : 1024;
    // (MN-major operands here have 64 or more rows. K-major ones take no LBO: 16, encoded 1, as CUTLASS.)
    Reg da = descriptor(b.add(Type::u32, a_start, imm_u32(c.a_mn ? 2 * a_sbo * s : 32 * s)), c.a_mn ? 1024 : 16, a_sbo);
    Reg db = descriptor(b.add(Type::u32, sb, imm_u32(c.b_mn ? 2 * b_sbo * s : 32 * s)), c.b_mn ? 1024 : 16, b_sbo);
    b.wgmma(static_cast<int>(c.n), da, c.a_mn, db, c.b_mn, acc);
  }
  b.wgmma_commit();
  if (c.overwrite_in_flight) {
    b.bar();
    b.if_(b.setp(kir::Cmp::eq, tid, imm_u32(0)), [&] { b.st(Space::shared, Type::u32, sa, imm_u32(0), 0); });
  }
  if (c.write_acc_in_flight) b.set(acc[0], kir::imm_f32(0.5f));
  if (!c.no_wait) b.wgmma_wait(0);
  Reg out = b.address(pd, b.mul(Type::u32, tid, imm_u32(n_acc)), 4);
  for (uint32_t i = 0; i < n_acc; ++i) b.st(Space::global, Type::f32, out, acc[i], 4 * i);
  return b.finish();
}

std::vector<float> run_wgmma(Runtime& rt, const Case& c) {
  const std::vector<uint32_t> a = image(c.rows_a(), c.a_mn, a_value, false);
  const std::vector<uint32_t> bm = image(c.n, c.b_mn, b_value, true);  // row = column of B, value b(k, col)
  const uint32_t threads = 128 * c.groups, n_acc = c.n / 2;
  std::vector<float> cin(threads * n_acc);
  for (uint32_t t = 0; t < threads; ++t)
    for (uint32_t i = 0; i < n_acc; ++i) cin[t * n_acc + i] = static_cast<float>(c_value(t, i));
  const kir::Kernel k = wgmma_kernel(c);
  LoadedKernel lk = rt.load(k);
  CUdeviceptr da = rt.alloc(a.size() * 4), db = rt.alloc(bm.size() * 4), dc = rt.alloc(cin.size() * 4),
              dd = rt.alloc(cin.size() * 4);
  rt.upload(da, a.data(), a.size() * 4);
  rt.upload(db, bm.data(), bm.size() * 4);
  rt.upload(dc, cin.data(), cin.size() * 4);
  rt.launch(lk, Dim3{1, 1, 1}, Dim3{threads, 1, 1}, {da, db, dc, dd});
  rt.synchronize();
  std::vector<float> d(cin.size());
  rt.download(d.data(), dd, d.size() * 4);
  for (CUdeviceptr x : {da, db, dc, dd}) rt.free(x);
  return d;
}

const std::vector<Case>& known_answer_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> v;
    for (bool a_mn : {false, true})
      for (bool b_mn : {false, true}) v.push_back(Case{.n = 128, .groups = 2, .a_mn = a_mn, .b_mn = b_mn});
    v.push_back(Case{.n = 8, .groups = 1});
    v.push_back(Case{.n = 256, .groups = 1, .a_mn = true, .b_mn = true});
    v.push_back(Case{.n = 64, .groups = 1, .a_mn = false, .b_mn = true});
    return v;
  }();
  return cases;
}

void expect_wgmma_known_answers(Runtime& rt) {
  for (const Case& c : known_answer_cases()) {
    SCOPED_TRACE(c.name());
    const std::vector<float> d = run_wgmma(rt, c);
    const uint32_t n_acc = c.n / 2;
    for (uint32_t t = 0; t < 128 * c.groups; ++t)
      for (uint32_t i = 0; i < n_acc; ++i) {
        const uint32_t l = t % 128, row = 64 * (t / 128) + 16 * (l / 32) + (l % 32) / 4 + 8 * ((i / 2) % 2),
                       col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
        int want = c_value(t, i);
        for (uint32_t k = 0; k < kTileK; ++k) want += a_value(row, k) * b_value(k, col);
        ASSERT_EQ(d[t * n_acc + i], static_cast<float>(want))
            << "thread " << t << " register " << i << ": D[" << row << "][" << col << "]";
      }
  }
}

TEST(Wgmma, KnownAnswersInTheSimulator) { expect_wgmma_known_answers(testing::fake_runtime()); }

TEST(Wgmma, GpuKnownAnswers) {
  KILN_GPU_OR_SKIP(rt);
  if (rt->sm() != 90) GTEST_SKIP() << "wgmma needs sm_90a; this GPU is sm_" << rt->sm();
  expect_wgmma_known_answers(*rt);
}

TEST(Wgmma, KernelsPassPtxasForSm90aOnly) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (const Case& c : known_answer_cases()) {
    const kir::Kernel k = wgmma_kernel(c);
    const PtxasResult r = run_ptxas(kir::print_ptx(k, 90), 90);
    EXPECT_TRUE(r.ok) << k.name << ":\n" << r.log;
    EXPECT_NE(kir::print_ptx(k, 90).find(".target sm_90a"), std::string::npos);
    EXPECT_THROW(kir::print_ptx(k, 80), Error) << k.name << " printed for sm_80";
  }
}

// The misuses: shared bytes written by st.shared with no fence.proxy.async before the wgmma
// reads them; a wgmma with no wgmma.fence before it; the accumulators stored (and the threads
// gone) with the group never waited for; an operand's bytes overwritten, or an accumulator
// written, between the issue and the wait.
TEST(Wgmma, SimulatorReportsMissingFencesAndWaits) {
  sim::DeviceMemory mem;
  const Case base{.n = 64, .groups = 1};
  const uint64_t a = mem.alloc(base.rows_a() * kTileK * 2), bm = mem.alloc(base.n * kTileK * 2),
                 cd = mem.alloc(128 * base.n / 2 * 4), d = mem.alloc(128 * base.n / 2 * 4);
  auto run = [&](Case c) { sim::simulate(wgmma_kernel(c), {1}, {128}, {a, bm, cd, d}, mem); };
  Case c = base;
  c.no_proxy_fence = true;
  sim::testing::expect_error([&] { run(c); }, {"wgmma reads shared byte", "no fence.proxy.async.shared::cta"});
  c = base;
  c.no_wgmma_fence = true;
  sim::testing::expect_error([&] { run(c); }, {"wgmma with no wgmma.fence"});
  c = base;
  c.no_wait = true;
  sim::testing::expect_error([&] { run(c); }, {"exits with wgmma products its warpgroup never waited for"});
  c = base;
  c.overwrite_in_flight = true;
  sim::testing::expect_error([&] { run(c); }, {"changed between its issue and the wgmma.wait_group"});
  c = base;
  c.write_acc_in_flight = true;
  sim::testing::expect_error([&] { run(c); }, {"accumulators of this wgmma were written between its issue"});
  run(base);  // and the kernel as written runs
  c = base;
  c.shuffle_first = true;
  run(c);  // the warpgroup waits for its warp 0's shuffle: no divergence
}

}  // namespace
}  // namespace kiln::cuda
