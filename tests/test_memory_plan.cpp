// The static memory plan (circuit/exec/memory_plan.hpp): on random lifetimes no two blocks that meet
// in time share a byte, offsets are aligned, the workspace is never below the live peak and the
// plan is the same every time; and DeviceProgram's planned workspace runs a GPT training step
// (resident tensors) to the bit of a run where every buffer is allocated on its own, without
// allocating device memory once its first steps are done and uploading its inputs in one copy.
#include <gtest/gtest.h>

#include <random>

#include <kiln/circuit/exec/memory_plan.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>

#include "device_test_util.hpp"

namespace kiln {
namespace {

void expect_valid(const std::vector<PlannedBlock>& blocks, const MemoryPlan& plan, size_t alignment) {
  ASSERT_EQ(plan.offset.size(), blocks.size());
  for (size_t a = 0; a < blocks.size(); ++a) {
    EXPECT_EQ(plan.offset[a] % alignment, 0u);
    EXPECT_LE(plan.offset[a] + blocks[a].bytes, plan.size);
    for (size_t b = a + 1; b < blocks.size(); ++b) {
      bool meet_in_time = blocks[a].first <= blocks[b].last && blocks[b].first <= blocks[a].last;
      bool share_bytes =
          plan.offset[a] < plan.offset[b] + blocks[b].bytes && plan.offset[b] < plan.offset[a] + blocks[a].bytes;
      EXPECT_FALSE(meet_in_time && share_bytes) << "blocks " << a << " and " << b;
    }
  }
  EXPECT_GE(plan.size, peak_live_bytes(blocks));
}

TEST(MemoryPlan, RandomLifetimesNeverShareBytesWhileBothLive) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<PlannedBlock> blocks;
    const int steps = 1 + static_cast<int>(rng() % 40);
    const size_t n = 1 + rng() % 60;
    for (size_t i = 0; i < n; ++i) {
      int first = static_cast<int>(rng() % static_cast<unsigned>(steps));
      int last = first + static_cast<int>(rng() % static_cast<unsigned>(steps - first));
      blocks.push_back({first, last, 1 + rng() % 5000});
    }
    MemoryPlan plan = plan_memory(blocks, 64);
    expect_valid(blocks, plan, 64);
    MemoryPlan again = plan_memory(blocks, 64);
    EXPECT_EQ(again.offset, plan.offset);
    EXPECT_EQ(again.size, plan.size);
  }
}

TEST(MemoryPlan, BuffersThatNeverMeetShareOnePlace) {
  // A chain: each buffer is read by the next op and dead after it, as in a pointwise sequence.
  std::vector<PlannedBlock> chain;
  for (int i = 0; i < 10; ++i) chain.push_back({i, i + 1, 1000});
  MemoryPlan plan = plan_memory(chain, 256);
  expect_valid(chain, plan, 256);
  EXPECT_EQ(plan.size, 2 * 1024u);  // two live at once, each rounded up to the alignment
  EXPECT_EQ(peak_live_bytes(chain), 2000u);
}

// A GPT step on a fake GPU whose runtime plans memory (no exact block sizes), against the shared
// fake runtime, which allocates each buffer on its own for its bounds checks.
TEST(MemoryPlan, APlannedWorkspaceRunsTrainingStepsToTheBitOfSeparateBuffers) {
  cuda::Runtime planned_rt(cuda::fake_driver(), cuda::RuntimeOptions{"off", "", false});
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{2, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 5 + 3) % 13));
  struct Run {
    std::vector<double> losses;
    size_t workspace = 0, peak_live = 0, buffers = 0;
    int64_t allocations_after_warmup = 0, uploads = 0;
  };
  auto train = [&](cuda::Runtime& rt) {
    testing::OnDevice on(rt);
    manual_seed(4);
    models::GPT model(testing::tiny_gpt_config(1));
    optim::AdamW opt(model.parameters(), {1e-2, 0.9, 0.99, 1e-8, 0.1});
    Tensor x = Tensor::from_host(ids), y = Tensor::from_host(ids);
    Run r;
    int64_t allocations = 0;
    for (int s = 0; s < 5; ++s) {
      if (s == 2) allocations = rt.stats().device_allocations;
      Tensor loss = model.loss(x, y);
      loss.backward();
      opt.step(1.0);
      r.losses.push_back(loss.item());
    }
    r.allocations_after_warmup = rt.stats().device_allocations - allocations;
    const cuda::DeviceProgram& dp = *Engine::current().last_plan()->device;
    r.uploads = dp.last_run().uploads;
    r.workspace = dp.workspace_bytes();
    r.peak_live = dp.peak_live_bytes();
    for (ValueId v = 0; v < static_cast<ValueId>(dp.circuit().num_values()); ++v)
      if (dp.circuit().value(v).role != ValueRole::Persistent) r.buffers += dp.circuit().info(v).nbytes();
    return r;
  };
  Run separate = train(testing::fake_runtime()), planned = train(planned_rt);
  EXPECT_EQ(planned.losses, separate.losses);
  EXPECT_EQ(separate.workspace, 0u);
  EXPECT_GE(planned.workspace, planned.peak_live);
  EXPECT_LT(planned.workspace, planned.buffers / 2);  // reuse: well under one buffer per value
  EXPECT_EQ(planned.allocations_after_warmup, 0);
  EXPECT_EQ(planned.uploads, 1);  // every input (tokens, scalars, random offsets) in one copy
  EXPECT_GT(separate.uploads, 5);
  std::printf("planned workspace %zu bytes, live peak %zu, one buffer per value would be %zu\n", planned.workspace,
              planned.peak_live, planned.buffers);
}

}  // namespace
}  // namespace kiln
