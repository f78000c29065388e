// Known-answer tests of cp.async (kir::Opc::CpAsync, CpAsyncCommit, CpAsyncWait) in the SIMT
// simulator, on a GPU (T5) and in ptxas: copies of 16 and 8 bytes in two groups into scrambled
// shared slots, with source sizes from 0 to the copy's size (the rest zero-filled), the first
// group read after cp.async.wait_group 1 and a barrier, the second after wait_group 0. The
// simulator's checks of cp.async use (reads before the wait, exits with copies pending) are in
// test_simulator_faults.cpp.
#include <gtest/gtest.h>

#include <cstdint>
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

constexpr int kThreads = 32;
int slot_of(int t) { return (t * 7 + 5) % kThreads; }  // where thread t's copies land
int src16(int t) { return t % 17; }                    // bytes of the 16-byte copy read from the source
int src8(int t) { return (t * 3) % 9; }                // of the 8-byte copy

// in: kThreads x 4 u32 (16 bytes a thread) then kThreads x 2 u32; out: per thread the 4 + 2 words
// of slot t of both areas.
kir::Kernel cp_async_kernel() {
  kir::KernelBuilder b("cp_async_known_answer");
  Reg pin = b.param("in", Type::u64), pout = b.param("out", Type::u64);
  Reg t = b.sreg(kir::SReg::tid_x);
  Reg a16 = b.shared_addr(b.shared_array("area16", kThreads * 16));
  Reg a8 = b.shared_addr(b.shared_array("area8", kThreads * 8));
  Reg slot = b.rem(Type::u32, b.add(Type::u32, b.mul(Type::u32, t, imm_u32(7)), imm_u32(5)), imm_u32(kThreads));
  Reg n16 = b.rem(Type::u32, t, imm_u32(17));
  Reg n8 = b.rem(Type::u32, b.mul(Type::u32, t, imm_u32(3)), imm_u32(9));
  b.cp_async(b.mad(Type::u32, slot, imm_u32(16), a16), b.address(pin, b.mul(Type::u32, t, imm_u32(4)), 4), 16, n16);
  b.cp_async_commit();
  Reg src8_at = b.address(pin, b.add(Type::u32, b.mul(Type::u32, t, imm_u32(2)), imm_u32(kThreads * 4)), 4);
  b.cp_async(b.mad(Type::u32, slot, imm_u32(8), a8), src8_at, 8, n8);
  b.cp_async_commit();
  Reg out = b.address(pout, b.mul(Type::u32, t, imm_u32(6)), 4);
  b.cp_async_wait(1);  // the 16-byte group has landed; the 8-byte one may not have
  b.bar();
  Reg mine16 = b.mad(Type::u32, t, imm_u32(16), a16);
  for (int w = 0; w < 4; ++w) b.st(Space::global, Type::u32, out, b.ld(Space::shared, Type::u32, mine16, 4 * w), 4 * w);
  b.cp_async_wait(0);
  b.bar();
  Reg mine8 = b.mad(Type::u32, t, imm_u32(8), a8);
  for (int w = 0; w < 2; ++w)
    b.st(Space::global, Type::u32, out, b.ld(Space::shared, Type::u32, mine8, 4 * w), 16 + 4 * w);
  return b.finish();
}

void expect_cp_async_known_answers(Runtime& rt) {
  std::vector<uint32_t> in;
  for (int i = 0; i < kThreads * 6; ++i) in.push_back(0xA0000000u + static_cast<uint32_t>(i) * 0x01010101u);
  const kir::Kernel k = cp_async_kernel();
  LoadedKernel lk = rt.load(k);
  CUdeviceptr din = rt.alloc(in.size() * 4), dout = rt.alloc(kThreads * 6 * 4);
  rt.upload(din, in.data(), in.size() * 4);
  rt.launch(lk, Dim3{1, 1, 1}, Dim3{kThreads, 1, 1}, {din, dout});
  rt.synchronize();
  std::vector<uint32_t> out(kThreads * 6);
  rt.download(out.data(), dout, out.size() * 4);
  rt.free(din);
  rt.free(dout);
  // The byte at offset j of a copy whose source holds `n` bytes: the source's, or 0 past n.
  auto byte_of = [&](size_t word_base, int n, int j) -> uint32_t {
    if (j >= n) return 0;
    return (in[word_base + static_cast<size_t>(j / 4)] >> (8 * (j % 4))) & 0xffu;
  };
  for (int t = 0; t < kThreads; ++t) {
    int writer = 0;  // the thread whose copies land in slot t
    while (slot_of(writer) != t) ++writer;
    for (int w = 0; w < 6; ++w) {
      const bool first = w < 4;
      const int bytes_read = first ? src16(writer) : src8(writer);
      const size_t base = first ? static_cast<size_t>(writer) * 4 : static_cast<size_t>(kThreads * 4 + writer * 2);
      uint32_t want = 0;
      for (int j = 0; j < 4; ++j) want |= byte_of(base, bytes_read, (first ? w : w - 4) * 4 + j) << (8 * j);
      ASSERT_EQ(out[static_cast<size_t>(t * 6 + w)], want)
          << "thread " << t << " word " << w << " (writer " << writer << ")";
    }
  }
}

TEST(CpAsync, KnownAnswersInTheSimulator) { expect_cp_async_known_answers(testing::fake_runtime()); }

TEST(CpAsync, GpuKnownAnswers) {
  KILN_GPU_OR_SKIP(rt);
  expect_cp_async_known_answers(*rt);
}

TEST(CpAsync, KernelPassesPtxas) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  const kir::Kernel k = cp_async_kernel();
  testing::expect_ptxas_accepts({&k});
}

}  // namespace
}  // namespace kiln::cuda
