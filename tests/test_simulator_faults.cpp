// The planted bugs the SIMT simulator must catch, each reported with the kernel, the
// instruction and the threads: out-of-bounds and misaligned accesses, shared-memory races
// (across and within a warp), divergent shuffles and barriers, and bad launches.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "sim_test_util.hpp"

namespace kiln::sim {
namespace {

using namespace kiln::sim::testing;  // NOLINT: the helpers and kir names of the simulator tests

TEST(SimulatorBugs, OutOfBoundsGlobalLoad) {
  for (uint32_t n : {1000u, 1024u}) {  // 1024 floats fill whole 256-byte units: the gap catches it
    DeviceMemory mem;
    const uint64_t xa = upload(mem, test_inputs(n)), ya = mem.alloc(n * 4);
    expect_error(
        [&] {
          simulate(pointwise_kernel(true), {(n + 256) / 256}, {256}, {xa, ya, n}, mem);
        },
        {"simulator: out-of-bounds global load of 4 bytes", "kernel 'pointwise_oob'", "block (", "thread (",
         "ld.f32 global", "allocation"});
  }
}

TEST(SimulatorBugs, MisalignedAndOutOfBoundsShared) {
  KernelBuilder b("bad_shared");
  Reg out = b.param("out", Type::u64), off = b.param("off", Type::u32);
  const int sh = b.shared_array("buf", 64);
  b.st(Space::global, Type::f32, out, b.ld(Space::shared, Type::f32, b.add(Type::u32, b.shared_addr(sh), off)));
  const auto k = prepare(b.finish());
  DeviceMemory mem;
  const uint64_t o = mem.alloc(4);
  expect_error(
      [&] {
        simulate(*k, {1}, {1}, {o, 64}, mem);
      },
      {"out-of-bounds shared load of 4 bytes", "0x40", "64 bytes"});
  expect_error([&] { simulate(*k, {1}, {1}, {o, 2}, mem); }, {"misaligned shared load", "bad_shared"});
  expect_error([&] { simulate(*k, {1}, {1}, {o + 1, 0}, mem); }, {"misaligned global store"});
  // Shared memory starts poisoned: an unwritten float reads as NaN.
  simulate(*k, {1}, {1}, {o, 0}, mem);
  EXPECT_TRUE(std::isnan(download<float>(mem, o, 1)[0]));
}

// out[t] = neighbour's value written through shared memory, with or without the barrier.
Kernel neighbour_kernel(bool with_barrier, uint32_t threads) {
  KernelBuilder b(with_barrier ? "neighbour" : "neighbour_racy");
  Reg out = b.param("out", Type::u64);
  const int sh = b.shared_array("buf", threads * 4);
  Reg tid = b.sreg(SReg::tid_x);
  Reg base = b.shared_addr(sh);
  b.st(Space::shared, Type::u32, b.add(Type::u32, base, b.mul(Type::u32, tid, imm_u32(4))),
       b.mul(Type::u32, tid, imm_u32(10)));
  if (with_barrier) b.bar();
  Reg next = b.rem(Type::u32, b.add(Type::u32, tid, imm_u32(1)), imm_u32(threads));
  Reg v = b.ld(Space::shared, Type::u32, b.add(Type::u32, base, b.mul(Type::u32, next, imm_u32(4))));
  b.st(Space::global, Type::u32, b.address(out, tid, 4), v);
  return b.finish();
}

TEST(SimulatorBugs, SharedMemoryRaceWithoutBarrier) {
  for (uint32_t threads : {32u, 128u}) {  // 32: the race is within one warp
    for (uint64_t seed : {1, 2, 3}) {
      DeviceMemory mem;
      const uint64_t o = mem.alloc(threads * 4);
      expect_error(
          [&] { simulate(neighbour_kernel(false, threads), {1}, {threads}, {o}, mem, {.schedule_seed = seed}); },
          {"shared-memory race", "kernel 'neighbour_racy'", "block (0,0,0)", "thread (", "with no bar.sync", "shared"});
      simulate(neighbour_kernel(true, threads), {1}, {threads}, {o}, mem, {.schedule_seed = seed});
      const auto v = download<uint32_t>(mem, o, threads);
      for (uint32_t t = 0; t < threads; ++t) ASSERT_EQ(v[t], (t + 1) % threads * 10);
      // With race checks off, the racy kernel runs (and reads what the schedule gives).
      simulate(neighbour_kernel(false, threads), {1}, {threads}, {o}, mem,
               {.schedule_seed = seed, .check_races = false});
    }
  }
}

TEST(SimulatorBugs, DivergentShuffle) {
  KernelBuilder b("half_warp_shuffle");
  Reg out = b.param("out", Type::u64);
  Reg lane = b.sreg(SReg::laneid);
  b.if_(b.setp(Cmp::lt, lane, imm_u32(16)),
        [&] { b.st(Space::global, Type::u32, b.address(out, lane, 4), b.shfl(ShflMode::down, lane, imm_u32(1))); });
  DeviceMemory mem;
  const uint64_t o = mem.alloc(64 * 4);
  expect_error([&] { simulate(b.finish(), {1}, {64}, {o}, mem); },
               {"divergent shuffle", "kernel 'half_warp_shuffle'", "warp 0",
                "threads (0,0,0)..(15,0,0) wait at shfl.sync", "threads (16,0,0)..(31,0,0) exited"});

  // A partial warp cannot complete a full-mask shuffle.
  expect_error(
      [&] {
        simulate(butterfly_kernel(), {1}, {48}, {o, o, 0}, mem);
      },
      {"divergent shuffle", "warp 1", "lanes 16-31 do not exist", "48 threads"});
}

TEST(SimulatorBugs, DivergentBarrier) {
  KernelBuilder b("partial_barrier");
  Reg tid = b.sreg(SReg::tid_x);
  b.if_(b.setp(Cmp::lt, tid, imm_u32(10)), [&] { b.bar(); });
  DeviceMemory mem;
  expect_error([&] { simulate(b.finish(), {1}, {64}, {}, mem); },
               {"divergent barrier", "kernel 'partial_barrier'", "threads (0,0,0)..(9,0,0) wait at bar.sync",
                "threads (10,0,0)..(63,0,0) exited"});
}

TEST(SimulatorBugs, BadLaunches) {
  DeviceMemory mem;
  expect_error([&] { simulate(pointwise_kernel(), {1}, {32}, {1, 2}, mem); }, {"takes 3 parameters, 2 given"});
  expect_error([&] { simulate(pointwise_kernel(), {1}, {2048}, {1, 2, 3}, mem); }, {"at most 1024 threads"});
}

}  // namespace
}  // namespace kiln::sim
