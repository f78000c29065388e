// The simulator's work counts (sim::SimStats: f32 and tensor FLOPs, global bytes, blocks), which
// the performance model bounds kernel times with, and block sampling (SimOptions::sample_blocks)
// with the fake driver's counts scaled back to the whole grid.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"
#include "sim_test_util.hpp"

namespace kiln {
namespace {

using sim::testing::pointwise_kernel;

// pointwise_kernel per element: one 4-byte load and store; fma (2), add, sub, mul and max (1
// each) are f32 FLOPs, div, abs and sqrt are not counted.
constexpr int64_t kPointwiseFlops = 6;

TEST(SimCounts, APointwiseKernelCountsItsFlopsAndBytes) {
  sim::DeviceMemory mem;
  const uint32_t n = 1000;  // 8 blocks of 128: the last 24 threads do nothing
  const uint64_t x = sim::testing::upload(mem, sim::testing::test_inputs(n));
  const uint64_t y = mem.alloc(n * 4);
  const sim::SimStats s = sim::simulate(pointwise_kernel(), {8, 1, 1}, {128, 1, 1}, {x, y, n}, mem);
  EXPECT_EQ(s.blocks, 8);
  EXPECT_EQ(s.fp32_flops, kPointwiseFlops * n);
  EXPECT_EQ(s.global_load_bytes, 4 * n);
  EXPECT_EQ(s.global_store_bytes, 4 * n);
  EXPECT_EQ(s.tensor_flops, 0);
}

// Sampling 3 of 8 blocks runs blocks 0, 3 and 7 (spread, the first and last included) and only
// those: the other blocks' outputs keep what they held.
TEST(SimCounts, SampledBlocksAreSpreadOverTheGridAndRunAlone) {
  sim::DeviceMemory mem;
  const uint32_t n = 1024;
  const uint64_t x = sim::testing::upload(mem, sim::testing::test_inputs(n));
  const uint64_t y = sim::testing::upload(mem, std::vector<float>(n, -7.0f));
  sim::SimOptions o;
  o.sample_blocks = 3;
  const sim::SimStats s = sim::simulate(pointwise_kernel(), {8, 1, 1}, {128, 1, 1}, {x, y, n}, mem, o);
  EXPECT_EQ(s.blocks, 3);
  EXPECT_EQ(s.fp32_flops, kPointwiseFlops * 3 * 128);
  EXPECT_EQ(s.global_store_bytes, 4 * 3 * 128);
  const std::vector<float> got = sim::testing::download<float>(mem, y, n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t block = i / 128;
    EXPECT_EQ(got[i] == -7.0f, block != 0 && block != 3 && block != 7) << "element " << i << ", block " << block;
  }
}

// Global requests in 32-byte sectors: 32 lanes reading consecutive floats touch 4 sectors, lanes
// 32 floats apart one sector each.
TEST(SimCounts, GlobalRequestsCountTheirSectors) {
  using namespace sim::testing;
  auto strided = [](uint32_t stride) {
    KernelBuilder b("strided_copy");
    Reg x = b.param("x", Type::u64), y = b.param("y", Type::u64);
    Reg i = b.global_index_x();
    Reg v = b.ld(Space::global, Type::f32, b.address(x, b.mul(Type::u32, i, imm_u32(stride)), 4));
    b.st(Space::global, Type::f32, b.address(y, i, 4), v);
    return b.finish();
  };
  sim::SimOptions o;
  o.count_requests = true;
  for (const uint32_t stride : {1u, 32u}) {
    sim::DeviceMemory mem;
    const uint64_t x = upload(mem, test_inputs(256 * stride)), y = mem.alloc(256 * 4);
    const sim::SimStats s = sim::simulate(strided(stride), {2, 1, 1}, {128, 1, 1}, {x, y}, mem, o);
    EXPECT_EQ(s.global_requests, 16) << "stride " << stride;  // 8 warps, a load and a store each
    EXPECT_EQ(s.global_sectors, 8 * (stride == 1 ? 4 : 32) + 8 * 4) << "stride " << stride;
  }
}

// A product's tensor FLOPs are 2 M N K on mma.sync and on wgmma (whole tiles, K a multiple of
// the k step), counted by the fake driver per kernel; sampled, scaled to the grid, the same.
TEST(SimCounts, AProductsTensorFlopsAreTwoMNK) {
  const int64_t m = 256, n = 256, k = 128;
  Circuit c;
  const ValueId a = c.add_external({Shape{m, k}, DType::bf16}, ValueRole::Input);
  const ValueId b = c.add_external({Shape{k, n}, DType::bf16}, ValueRole::Input);
  Params plain;
  plain.ints = {0, 0};  // neither operand transposed
  const ValueId y = c.add_op(PrimId::matmul, plain, {a, b})[0];
  const HostTensor ha = testing::random_tensor({Shape{m, k}, DType::bf16}, 1),
                   hb = testing::random_tensor({Shape{k, n}, DType::bf16}, 2);
  for (const bool wgmma : {false, true})
    for (const uint64_t sample : {uint64_t{0}, uint64_t{2}}) {
      Target t = device_target(testing::fake_runtime());
      t.matmul.wgmma = wgmma;
      t.matmul.split_k = 0;
      cuda::DeviceProgram program(c, {y}, testing::fake_runtime(), t);
      std::map<std::string, cuda::FakeKernelStats> stats;
      {
        const cuda::ScopedSampledBlocks sampled(sample);
        if (!sample) cuda::fake_driver_count_bank_conflicts(true);
        program.run({ha, hb});
        stats = cuda::fake_driver_kernel_stats();
        cuda::fake_driver_count_bank_conflicts(false);
      }
      int64_t tensor = 0, loads = 0;
      for (const auto& [name, s] : stats) tensor += s.tensor_flops, loads += s.global_load_bytes;
      EXPECT_EQ(tensor, 2 * m * n * k) << (wgmma ? "wgmma" : "mma.sync") << ", sampled " << sample;
      // Each block reads its rows of A and columns of B once: at least the operands.
      EXPECT_GE(loads, (m * k + k * n) * 2) << (wgmma ? "wgmma" : "mma.sync") << ", sampled " << sample;
    }
}

}  // namespace
}  // namespace kiln
