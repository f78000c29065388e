// The GPU performance model (cuda/perf/estimate.hpp): each limit binds where it should, waves and
// occupancy, the published limits, and estimates from simulator counts (cuda/perf/kernel_work.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/perf/estimate.hpp>
#include <kiln/cuda/perf/kernel_work.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

using perf::Limit;

// The model's limits at 100% (no calibration), so that the expected times are the data sheet's.
perf::DeviceLimits whole_h100() {
  perf::DeviceLimits d = perf::h100_sxm();
  d.reached.fill(1.0);
  d.launch_s = 1e-9;
  return d;
}

perf::KernelWork streaming(double bytes) {
  perf::KernelWork w;
  w.blocks = 132 * 8;
  w.threads = 256;
  w.instructions = 1e3 * w.blocks;
  w.global_bytes = bytes;
  w.compulsory_bytes = bytes;
  return w;
}

TEST(PerfModel, AStreamingKernelIsBoundByDram) {
  const perf::DeviceLimits d = whole_h100();
  const perf::KernelEstimate e = perf::estimate(streaming(1e9), d);
  EXPECT_EQ(e.binding, Limit::dram);
  EXPECT_NEAR(e.seconds, 1e9 / 3.35e12, 1e-9);
  // Calibrated: the fraction of DRAM bandwidth kiln's kernels reach slows it.
  perf::DeviceLimits half = d;
  half.reached[static_cast<int>(Limit::dram)] = 0.5;
  EXPECT_NEAR(perf::estimate(streaming(1e9), half).seconds, 2 * e.seconds, 1e-9);
  // A gather reads a few rows of a large table: DRAM moves what the threads touch, not the table.
  perf::KernelWork gather = streaming(1e9);
  gather.global_bytes = 1e6;
  EXPECT_NEAR(perf::estimate(gather, d).bound_s[static_cast<int>(Limit::dram)], 1e6 / 3.35e12, 1e-12);
}

TEST(PerfModel, AProductIsBoundByTensorCoresAndPaysForItsLastWave) {
  const perf::DeviceLimits d = whole_h100();
  perf::KernelWork w;
  w.blocks = 132;  // one block an SM
  w.threads = 256;
  w.registers = 128;
  w.shared_bytes = 150 * 1024;  // one resident at a time
  w.tensor_flops = 132 * 2.0 * 128 * 256 * 4096;
  w.compulsory_bytes = 1e6;
  w.global_bytes = 1e8;
  const perf::KernelEstimate one = perf::estimate(w, d);
  EXPECT_EQ(one.binding, Limit::tensor);
  EXPECT_NEAR(one.seconds, w.tensor_flops / 989.4e12, 1e-9);
  EXPECT_EQ(one.blocks_per_sm, 1);
  // One block more: the busiest SM runs two, and the product takes twice as long.
  perf::KernelWork more = w;
  more.blocks = 133;
  more.tensor_flops = w.tensor_flops / 132 * 133;
  EXPECT_NEAR(perf::estimate(more, d).seconds, 2 * one.seconds, 1e-9);
  // tf32 runs at half bf16's rate.
  perf::KernelWork tf32 = w;
  tf32.tf32_tensor_flops = tf32.tensor_flops;
  tf32.tensor_flops = 0;
  EXPECT_NEAR(perf::estimate(tf32, d).seconds, 2 * one.seconds, 1e-9);
}

TEST(PerfModel, OccupancyIsLimitedByThreadsRegistersAndSharedMemory) {
  const perf::DeviceLimits d = perf::h100_sxm();
  perf::KernelWork w;
  w.threads = 256;
  w.registers = 32;
  EXPECT_EQ(perf::blocks_per_sm(w, d), 8);  // 2048 threads
  w.registers = 128;                        // 32 K registers a block
  EXPECT_EQ(perf::blocks_per_sm(w, d), 2);
  w.registers = 100;  // allocated 256 a warp: 104 -> 3328 a warp, 26624 a block
  EXPECT_EQ(perf::blocks_per_sm(w, d), 2);
  w.registers = 32;
  w.shared_bytes = 100 * 1024;  // 101 KiB with the driver's reserve
  EXPECT_EQ(perf::blocks_per_sm(w, d), 2);
  w.shared_bytes = 200 * 1024;
  EXPECT_EQ(perf::blocks_per_sm(w, d), 1);
}

TEST(PerfModel, FewInstructionsTakeTheShortestKernelsTime) {
  perf::KernelWork w;
  w.blocks = 1;
  w.threads = 32;
  w.instructions = 32 * 10;
  w.compulsory_bytes = 128;
  w.global_bytes = 128;
  const perf::KernelEstimate e = perf::estimate(w, perf::h100_sxm());
  EXPECT_EQ(e.binding, Limit::launch);
  EXPECT_EQ(e.seconds, perf::h100_sxm().launch_s);
}

TEST(PerfModel, DevicesAreNamedByTheirModel) {
  EXPECT_EQ(perf::device_limits("H100")->name, "H100 SXM");
  EXPECT_EQ(perf::device_limits("h200")->dram_bytes_per_s, 4.8e12);
  EXPECT_FALSE(perf::device_limits("a100").has_value());
}

// From the simulator's counts: an elementwise add over 1 Mi floats, its blocks sampled, is bound
// by DRAM with 12 MiB to move (two inputs, one output), and its work scales to the whole grid.
TEST(PerfModel, AnAddsEstimateComesFromItsSampledCounts) {
  const int64_t n = int64_t{1} << 20;
  Circuit c;
  const ValueId a = c.add_external({Shape{n}, DType::f32}, ValueRole::Input);
  const ValueId b = c.add_external({Shape{n}, DType::f32}, ValueRole::Input);
  const ValueId y = Builder(c).add(a, b);
  cuda::DeviceProgram program(c, {y}, testing::fake_runtime());
  std::map<std::string, cuda::FakeKernelStats> counted;
  {
    const cuda::ScopedSampledBlocks sampled(4);
    program.run({testing::random_tensor({Shape{n}, DType::f32}, 1), testing::random_tensor({Shape{n}, DType::f32}, 2)});
    counted = cuda::fake_driver_kernel_stats();
  }
  const std::vector<perf::KernelRowEstimate> rows = perf::estimate_program(program, counted, whole_h100(), 90);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].launches, 1);
  EXPECT_EQ(rows[0].work.compulsory_bytes, 12.0 * n);
  EXPECT_EQ(rows[0].work.global_bytes, 12.0 * n);  // every element loaded twice and stored once, 4 bytes each
  EXPECT_EQ(rows[0].work.fp32_flops, static_cast<double>(n));
  EXPECT_EQ(rows[0].estimate.binding, Limit::dram);
  EXPECT_NEAR(rows[0].estimate.seconds, 12.0 * n / 3.35e12, 1e-9);
}

}  // namespace
}  // namespace kiln
