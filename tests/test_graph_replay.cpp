// Whole steps replayed as CUDA graphs (DeviceProgram over a runtime that plans memory; the fake
// driver runs a graph's nodes in order): traced GPT training steps give the losses and weights
// of launching kernel by kernel, to the bit; a step's graph is built once per address set (two,
// as resident tensors alternate) and then only launched; a host write between steps reaches the
// graph's next run; a failed step inside a graph changes nothing.
#include <gtest/gtest.h>

#include <cstdlib>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/traced_step.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/sgd.hpp>

#include "device_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

// A fake GPU whose programs plan memory (no exact block sizes), so they may replay graphs. (Plans
// lowered for it are lowered again for the next runtime they run on.)
struct PlanningGpu {
  cuda::Runtime rt{cuda::fake_driver(), cuda::RuntimeOptions{"off", "", false}};
};

struct Steps {
  std::vector<double> losses, weights;
  std::vector<bool> graph, built;
  std::vector<int64_t> graph_launches;  // per step, of the runtime
};

Steps train(cuda::Runtime& rt, int steps) {
  testing::OnDevice on(rt);
  manual_seed(6);
  models::GPT model(testing::tiny_gpt_config(1));
  optim::AdamW opt(model.parameters(), {1e-2, 0.9, 0.99, 1e-8, 0.1});
  Steps r;
  std::unique_ptr<TracedStep> trace;
  for (int s = 0; s < steps; ++s) {
    const int64_t graphs_before = rt.stats().graph_launches;
    HostTensor ids = HostTensor::zeros(DType::i32, Shape{2, 8});
    for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 5 + 3 * s) % 13));
    Tensor x = Tensor::from_host(ids);
    Tensor loss;
    if (!trace) {
      trace = std::make_unique<TracedStep>(std::vector<Tensor>{x}, [&] {
        Tensor l = model.loss(x, x);
        l.backward();
        opt.step(1.0);
        return std::vector<Tensor>{l};
      });
      loss = trace->outputs()[0];
    } else {
      loss = trace->run({ids})[0];
    }
    r.losses.push_back(loss.item());
    const cuda::DeviceRunStats& run = Engine::current().last_plan()->device->last_run();
    r.graph.push_back(run.graph);
    r.built.push_back(run.graph_built);
    r.graph_launches.push_back(rt.stats().graph_launches - graphs_before);
  }
  for (const auto& [name, p] : model.named_parameters())
    for (double v : p.to_vector()) r.weights.push_back(v);
  return r;
}

TEST(GraphReplay, TrainingStepsAsGraphsGiveTheBitsOfLaunchByLaunch) {
  PlanningGpu gpu;
  const int steps = 6;
  Steps launches;
  {
    testing::ScopedTarget no_graphs([](Target& t) { t.cuda_graphs = false; });
    launches = train(gpu.rt, steps);
  }
  Steps graphs = train(gpu.rt, steps);
  EXPECT_EQ(graphs.losses, launches.losses);
  EXPECT_EQ(graphs.weights, launches.weights);
  EXPECT_EQ(launches.graph, std::vector<bool>(steps, false));
  EXPECT_EQ(graphs.graph, std::vector<bool>(steps, true));
  // Built for the first two steps' address sets (the spares of the resident tensors), then
  // launched as they are.
  EXPECT_EQ(graphs.built, (std::vector<bool>{true, true, false, false, false, false}));
  EXPECT_EQ(graphs.graph_launches, std::vector<int64_t>(steps, 1));  // the whole step: one launch
  EXPECT_EQ(launches.graph_launches, std::vector<int64_t>(steps, 0));
}

TEST(GraphReplay, AHostWriteReachesTheGraphAndAFailedStepChangesNothing) {
  PlanningGpu gpu;
  testing::OnDevice on(gpu.rt);
  Tensor table = Tensor::parameter("table", Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{3, 2}).to_host());
  optim::SGD opt({table}, 0.5);
  auto step = [&](std::vector<int32_t> rows) {
    sum(gather_rows(table, Tensor::from_ints(rows, Shape{2}))).backward();
    opt.step();
    return Engine::current().last_plan()->device->last_run();
  };
  EXPECT_TRUE(step({0, 2}).graph_built);
  EXPECT_TRUE(step({0, 2}).graph_built);
  cuda::DeviceRunStats third = step({0, 2});
  EXPECT_TRUE(third.graph);
  EXPECT_FALSE(third.graph_built);
  EXPECT_EQ(table.to_vector(), (std::vector<double>{-0.5, 0.5, 3, 4, 3.5, 4.5}));
  // The host's write drops the device copies; the next step uploads a new one (into whichever
  // block the allocator gives: the graph is built again only if its addresses changed).
  Engine::current().write_persistent(*table.impl(), Tensor::from_vector({1, 1, 1, 1, 1, 1}, Shape{3, 2}).to_host());
  EXPECT_TRUE(step({1, 1}).graph);
  EXPECT_EQ(table.to_vector(), (std::vector<double>{1, 1, 0, 0, 1, 1}));
  try {
    step({2, 9});
    ADD_FAILURE() << "the out-of-range index was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range on the device"), std::string::npos) << e.what();
  }
  EXPECT_EQ(table.to_vector(), (std::vector<double>{1, 1, 0, 0, 1, 1}));
  step({2, 0});
  EXPECT_EQ(table.to_vector(), (std::vector<double>{0.5, 0.5, 0, 0, 0.5, 0.5}));
}

// The same on a real GPU (the GPU tier): the driver's graphs against its own launches.
TEST(GpuGraphReplay, TrainingStepsAsGraphsGiveTheBitsOfLaunchByLaunch) {
  KILN_GPU_OR_SKIP(rt);
  ASSERT_TRUE(rt->graphs_supported());
  const int steps = 4;
  Steps launches;
  {
    testing::ScopedTarget no_graphs([](Target& t) { t.cuda_graphs = false; });
    launches = train(*rt, steps);
  }
  Steps graphs = train(*rt, steps);
  EXPECT_EQ(graphs.losses, launches.losses);
  EXPECT_EQ(graphs.weights, launches.weights);
  EXPECT_EQ(graphs.graph, std::vector<bool>(steps, true));
}

}  // namespace
}  // namespace kiln
