// The planted bugs the SIMT simulator must catch, each reported with the kernel, the
// instruction and the threads: out-of-bounds and misaligned accesses, shared-memory races
// (across and within a warp), global-memory races (within a block, and across blocks: the
// "last block combines the partials" pattern with its barrier or its acquire missing),
// divergent shuffles and barriers, and bad launches.
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

// "The last block to arrive combines every block's partials" (cuda/lower/reduce.cpp's
// after_last_block) in three variants: every thread stores a partial; thread 0 counts the block
// in with membar.gl + atom.add; the last block's threads read every partial of their column.
enum class LastBlock {
  Correct,                 // bar.sync, membar.gl, atom.add, membar.gl, bar.sync
  NoBarrierBeforeRelease,  // kiln's first version: thread 0 releases before the others stored
  NoAcquire,               // the atomic is not followed by thread 0's membar.gl before the bar.sync
};

Kernel last_block_kernel(LastBlock variant, uint32_t threads, uint32_t blocks) {
  KernelBuilder b("last_block");
  Reg part = b.param("partials", Type::u64), counter = b.param("counter", Type::u64), out = b.param("out", Type::u64);
  Reg tid = b.sreg(SReg::tid_x), blk = b.sreg(SReg::ctaid_x);
  Reg mine = b.mad(Type::u32, blk, imm_u32(threads), tid);
  b.st(Space::global, Type::f32, b.address(part, mine, 4), b.cvt(Type::f32, mine));
  Reg flag = b.shared_addr(b.shared_array("last", 4, 4));
  if (variant != LastBlock::NoBarrierBeforeRelease) b.bar();
  b.if_(b.setp(Cmp::eq, tid, imm_u32(0)), [&] {
    b.membar();
    Reg ticket = b.atom_add(Space::global, Type::u32, counter, imm_u32(1));
    if (variant != LastBlock::NoAcquire) b.membar();
    b.st(Space::shared, Type::u32, flag,
         b.selp(Type::u32, imm_u32(1), imm_u32(0), b.setp(Cmp::eq, ticket, imm_u32(blocks - 1))));
  });
  b.bar();
  b.if_(b.setp(Cmp::ne, b.ld(Space::shared, Type::u32, flag), imm_u32(0)), [&] {
    if (variant == LastBlock::NoAcquire) b.membar();  // each thread's own fence acquires nothing
    Reg sum = b.mov(Type::f32, imm_f32(0.0f));
    b.for_(imm_u32(0), imm_u32(blocks), imm_u32(1), [&](Reg j) {
      Reg v = b.ld(Space::global, Type::f32, b.address(part, b.mad(Type::u32, j, imm_u32(threads), tid), 4));
      b.set(sum, b.add(Type::f32, sum, v));
    });
    b.st(Space::global, Type::f32, b.address(out, tid, 4), sum);
  });
  return b.finish();
}

TEST(SimulatorBugs, LastBlockWithoutABarrierBeforeTheReleaseIsACrossBlockRace) {
  const uint32_t threads = 64, blocks = 5;
  for (uint32_t resident : {1u, 8u}) {  // the ordering model does not depend on the schedule
    for (uint64_t seed : {1, 2}) {
      for (LastBlock variant : {LastBlock::NoBarrierBeforeRelease, LastBlock::NoAcquire, LastBlock::Correct}) {
        DeviceMemory mem;
        const uint64_t part = mem.alloc(threads * blocks * 4), counter = upload(mem, std::vector<uint32_t>{0}),
                       out = mem.alloc(threads * 4);
        auto run = [&] {
          simulate(last_block_kernel(variant, threads, blocks), {blocks}, {threads}, {part, counter, out}, mem,
                   {.schedule_seed = seed, .resident_blocks = resident});
        };
        if (variant != LastBlock::Correct) {
          expect_error(run, {"cross-block race", "kernel 'last_block'", "reads global word", "that block (",
                             "nothing ordering the write before the read", "reader: ld.f32", "writer: st.f32"});
          continue;
        }
        run();
        const auto v = download<float>(mem, out, threads);
        for (uint32_t t = 0; t < threads; ++t) {
          float want = 0;
          for (uint32_t j = 0; j < blocks; ++j) want += static_cast<float>(j * threads + t);
          ASSERT_EQ(v[t], want) << "thread " << t;
        }
      }
    }
  }
}

// Within a block, a thread that reads another's global store needs a bar.sync in between.
TEST(SimulatorBugs, GlobalMemoryRaceWithinABlock) {
  for (bool barrier : {false, true}) {
    KernelBuilder b(barrier ? "neighbour_global" : "neighbour_global_racy");
    Reg buf_p = b.param("buf", Type::u64), out = b.param("out", Type::u64);
    Reg tid = b.sreg(SReg::tid_x);
    b.st(Space::global, Type::u32, b.address(buf_p, tid, 4), tid);
    if (barrier) b.bar();
    Reg next = b.rem(Type::u32, b.add(Type::u32, tid, imm_u32(1)), imm_u32(64));
    b.st(Space::global, Type::u32, b.address(out, tid, 4), b.ld(Space::global, Type::u32, b.address(buf_p, next, 4)));
    const Kernel k = b.finish();
    DeviceMemory mem;
    const uint64_t buf = mem.alloc(64 * 4), o = mem.alloc(64 * 4);
    if (!barrier) {
      expect_error(
          [&] {
            simulate(k, {1}, {64}, {buf, o}, mem);
          },
          {"global-memory race", "block (0,0,0)", "with no bar.sync in between"});
      continue;
    }
    simulate(k, {1}, {64}, {buf, o}, mem);
    const auto v = download<uint32_t>(mem, o, 64);
    for (uint32_t t = 0; t < 64; ++t) ASSERT_EQ(v[t], (t + 1) % 64);
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

// mma.sync, like shfl.sync, takes the whole warp: half of it exiting is an error naming both
// halves. (A fault in a runtime's launch would lose the shared fake context for the tests after
// it; the simulator alone has no such state.)
TEST(SimulatorBugs, DivergentMma) {
  KernelBuilder b("half_warp_mma");
  Reg out = b.param("out", Type::u64);
  Reg lane = b.sreg(SReg::laneid);
  b.if_(b.setp(Cmp::lt, lane, imm_u32(16)), [&] {
    const Operand z = imm_f32(0.0f);
    const std::vector<Reg> d = b.mma(kir::MmaShape::m16n8k8_tf32, {z, z, z, z}, {z, z}, {z, z, z, z});
    b.st(Space::global, Type::f32, b.address(out, lane, 4), d[0]);
  });
  DeviceMemory mem;
  const uint64_t o = mem.alloc(32 * 4);
  expect_error([&] { simulate(b.finish(), {1}, {32}, {o}, mem); },
               {"kernel 'half_warp_mma'", "mma.sync", "threads (0,0,0)..(15,0,0) wait at mma.sync",
                "threads (16,0,0)..(31,0,0) exited"});
}

TEST(SimulatorBugs, DivergentLdmatrix) {
  KernelBuilder b("half_warp_ldmatrix");
  Reg out = b.param("out", Type::u64);
  Reg lane = b.sreg(SReg::laneid);
  Reg tile = b.shared_addr(b.shared_array("tile", 256));
  b.if_(b.setp(Cmp::lt, lane, imm_u32(16)), [&] {
    const std::vector<Reg> d = b.ldmatrix(1, false, tile);
    b.st(Space::global, Type::u32, b.address(out, lane, 4), d[0]);
  });
  DeviceMemory mem;
  const uint64_t o = mem.alloc(32 * 4);
  expect_error([&] { simulate(b.finish(), {1}, {32}, {o}, mem); },
               {"kernel 'half_warp_ldmatrix'", "threads (0,0,0)..(15,0,0) wait at ldmatrix",
                "threads (16,0,0)..(31,0,0) exited"});
}

// A row address past the block's shared memory is reported as the lane's out-of-bounds read.
TEST(SimulatorBugs, LdmatrixRowOutOfBounds) {
  KernelBuilder b("ldmatrix_past_the_tile");
  Reg lane = b.sreg(SReg::laneid);
  Reg tile = b.shared_addr(b.shared_array("tile", 128));
  b.ldmatrix(1, false, b.mad(Type::u32, lane, imm_u32(16), tile));  // lane 7's row ends at 128: in; x1 reads lanes 0-7
  b.ldmatrix(2, false, b.mad(Type::u32, lane, imm_u32(16), tile));  // lane 8's row starts at 128: out
  DeviceMemory mem;
  expect_error([&] { simulate(b.finish(), {1}, {32}, {}, mem); },
               {"kernel 'ldmatrix_past_the_tile'", "out-of-bounds shared ldmatrix row of 16 bytes at offset 0x80"});
}

// cp.async misuse. Each thread copies 16 bytes into its own shared slot, commits, then:
enum class AsyncMisuse {
  ReadBeforeWait,      // reads its slot with no cp.async.wait_group
  ReadNewestGroup,     // copies a second group, waits with 1 left pending, reads the newest
  ExitWithoutWait,     // exits with the group pending
  NeighbourNoBarrier,  // waits, then reads the next thread's slot without a barrier
  Correct,             // waits, bar.sync, reads the next thread's slot
};

kir::Kernel async_kernel(AsyncMisuse m) {
  KernelBuilder b("cp_async_misuse");
  Reg in = b.param("in", Type::u64), out = b.param("out", Type::u64);
  Reg tid = b.sreg(SReg::tid_x);
  Reg area = b.shared_addr(b.shared_array("area", 2 * 32 * 16));
  Reg mine = b.mad(Type::u32, tid, imm_u32(16), area);
  b.cp_async(mine, b.address(in, b.mul(Type::u32, tid, imm_u32(4)), 4), 16, imm_u32(16));
  b.cp_async_commit();
  Reg next = b.mad(Type::u32, b.rem(Type::u32, b.add(Type::u32, tid, imm_u32(1)), imm_u32(32)), imm_u32(16), area);
  Reg read = mine;
  switch (m) {
    case AsyncMisuse::ReadBeforeWait: break;
    case AsyncMisuse::ReadNewestGroup: {
      Reg second = b.add(Type::u32, mine, imm_u32(32 * 16));
      b.cp_async(second, b.address(in, b.mul(Type::u32, tid, imm_u32(4)), 4), 16, imm_u32(16));
      b.cp_async_commit();
      b.cp_async_wait(1);
      b.ld(Space::shared, Type::u32, mine);  // the older group has landed: fine
      read = second;
      break;
    }
    case AsyncMisuse::ExitWithoutWait: return b.finish();
    case AsyncMisuse::NeighbourNoBarrier:
      b.cp_async_wait(0);
      read = next;
      break;
    case AsyncMisuse::Correct:
      b.cp_async_wait(0);
      b.bar();
      read = next;
      break;
  }
  b.st(Space::global, Type::u32, b.address(out, tid, 4), b.ld(Space::shared, Type::u32, read));
  return b.finish();
}

TEST(SimulatorBugs, CpAsyncMisuse) {
  DeviceMemory mem;
  std::vector<uint32_t> words(32 * 4);
  for (uint32_t i = 0; i < words.size(); ++i) words[i] = i;
  const uint64_t in = upload(mem, words), out = mem.alloc(32 * 4);
  auto run = [&](AsyncMisuse m) { simulate(async_kernel(m), {1}, {32}, {in, out}, mem); };
  const std::vector<std::string> not_landed = {"kernel 'cp_async_misuse'", "that a cp.async has not written yet"};
  expect_error([&] { run(AsyncMisuse::ReadBeforeWait); }, not_landed);
  expect_error([&] { run(AsyncMisuse::ReadNewestGroup); }, not_landed);
  expect_error([&] { run(AsyncMisuse::ExitWithoutWait); }, {"exits with cp.async copies it never waited for"});
  for (uint64_t seed : {1, 2, 3})
    expect_error(
        [&] {
          simulate(async_kernel(AsyncMisuse::NeighbourNoBarrier), {1}, {32}, {in, out}, mem, {.schedule_seed = seed});
        },
        {"kernel 'cp_async_misuse'", "shared"});
  run(AsyncMisuse::Correct);
  const auto v = download<uint32_t>(mem, out, 32);
  for (uint32_t t = 0; t < 32; ++t) ASSERT_EQ(v[t], (t + 1) % 32 * 4) << t;
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
