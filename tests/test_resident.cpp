// Persistent tensors resident on the device (cuda/runtime/resident.hpp) through the engine, on the fake
// GPU: after the first step a step copies only its inputs in and the values asked for out; host
// reads and writes between steps meet the device copies; a failed step leaves them as they were;
// leaving the device brings every updated tensor home.
#include <gtest/gtest.h>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/sgd.hpp>

#include "device_test_util.hpp"

namespace kiln {
namespace {

TEST(ResidentGpu, AfterTheFirstStepAStepCopiesOnlyItsInputsAndRequestedValues) {
  testing::OnDevice on(testing::fake_runtime());
  manual_seed(3);
  models::GPT model(testing::tiny_gpt_config(1));
  optim::AdamW opt(model.parameters(), {1e-2, 0.9, 0.99, 1e-8, 0.1});
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{2, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 5 + 3) % 13));
  Tensor x = Tensor::from_host(ids), y = Tensor::from_host(ids);
  auto step = [&] {
    Tensor loss = model.loss(x, y);
    loss.backward();
    opt.step(1.0);
    return loss.item();
  };
  step();
  const Plan& plan = *Engine::current().last_plan();
  const cuda::DeviceRunStats first = plan.device->last_run();
  step();
  const cuda::DeviceRunStats second = plan.device->last_run();
  ASSERT_EQ(Engine::current().last_plan(), &plan);
  size_t inputs = 0, persistent = 0, outputs = 0;
  const Circuit& c = plan.device->circuit();
  for (ValueId e : c.externals())
    (c.value(e).role == ValueRole::Persistent ? persistent : inputs) += c.info(e).nbytes();
  for (ValueId o : plan.program->outputs()) outputs += c.info(o).nbytes();
  EXPECT_EQ(first.uploaded_bytes, inputs + persistent);
  EXPECT_EQ(second.uploaded_bytes, inputs);
  // Downloads: the values asked for, and the index checks' status words (8 bytes per checking op).
  EXPECT_GE(second.downloaded_bytes, outputs);
  EXPECT_LT(second.downloaded_bytes, outputs + 8 * c.ops().size());
  EXPECT_GT(persistent, 100 * second.downloaded_bytes);  // what the step no longer copies
}

// An SGD step on w [4] (f32): loss = sum(w * w * x), so w -= lr * 2 x w.
TEST(ResidentGpu, HostReadsAndWritesBetweenStepsMeetTheDeviceCopies) {
  testing::OnDevice on(testing::fake_runtime());
  Tensor w = Tensor::parameter("w", Tensor::from_vector({1, 2, 3, 4}, Shape{4}).to_host());
  optim::SGD opt({w}, 0.25);
  Tensor x = Tensor::from_vector({1, 1, 0, 2}, Shape{4});
  auto step = [&] {
    sum(w * w * x).backward();
    opt.step();
  };
  step();  // w *= 1 - 0.5 x
  EXPECT_EQ(w.to_vector(), (std::vector<double>{0.5, 1, 3, 0}));
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{2, 4, 0, 16}));
  Engine::current().write_persistent(*w.impl(), Tensor::from_vector({8, 4, 2, 1}, Shape{4}).to_host());
  step();  // from the written values
  EXPECT_EQ(w.to_vector(), (std::vector<double>{4, 2, 2, 0}));
  step();  // twice without a host read in between
  step();
  EXPECT_EQ(w.to_vector(), (std::vector<double>{1, 0.5, 2, 0}));
}

// Two tensors assigned one computed buffer, and one assigned another persistent tensor: each
// ends with a device copy of its own (a later step writing one leaves the others alone).
TEST(ResidentGpu, AssignsSharingABufferEachGetTheirOwnCopy) {
  testing::OnDevice on(testing::fake_runtime());
  Tensor a = Tensor::state("a", Shape{3}, DType::f32), b = Tensor::state("b", Shape{3}, DType::f32),
         c = Tensor::state("c", Shape{3}, DType::f32);
  Tensor src = Tensor::parameter("src", Tensor::from_vector({1, 2, 3}, Shape{3}).to_host(), false);
  Tensor doubled = src * 2.0;
  a.assign(doubled);
  b.assign(doubled);
  c.assign(src);
  Engine::current().realize();
  a.assign(a + 1.0);
  src.assign(src * 0.0);
  Engine::current().realize();
  EXPECT_EQ(a.to_vector(), (std::vector<double>{3, 5, 7}));
  EXPECT_EQ(b.to_vector(), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(c.to_vector(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(src.to_vector(), (std::vector<double>{0, 0, 0}));
}

TEST(ResidentGpu, AFailedStepLeavesTheResidentTensorsAsTheyWere) {
  testing::OnDevice on(testing::fake_runtime());
  Tensor table = Tensor::parameter("table", Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{3, 2}).to_host());
  optim::SGD opt({table}, 0.5);
  auto step = [&](std::vector<int32_t> rows) {
    sum(gather_rows(table, Tensor::from_ints(rows, Shape{2}))).backward();
    opt.step();
  };
  step({0, 2});  // rows 0 and 2 lose 0.5
  const std::vector<double> after_first{0.5, 1.5, 3, 4, 4.5, 5.5};
  EXPECT_EQ(table.to_vector(), after_first);
  step({1, 1});  // row 1 loses 1 on the device; nobody reads it on the host
  try {
    step({0, 7});  // out of range: the device's index check fails the step
    ADD_FAILURE() << "the out-of-range index was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
  EXPECT_EQ(table.to_vector(), (std::vector<double>{0.5, 1.5, 2, 3, 4.5, 5.5}));
  step({2, 0});
  EXPECT_EQ(table.to_vector(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
}

TEST(ResidentGpu, LeavingTheDeviceBringsUpdatedTensorsHome) {
  Tensor w = Tensor::parameter("w", Tensor::from_vector({1, 2}, Shape{2}).to_host());
  optim::SGD opt({w}, 0.5);
  auto step = [&] {
    sum(w * w).backward();
    opt.step();
  };
  {
    testing::OnDevice on(testing::fake_runtime());
    step();  // w = 0
    step();
  }
  // On the CPU now: the device's result, which nothing on the host had read.
  EXPECT_EQ(w.to_vector(), (std::vector<double>{0, 0}));
  Tensor v = Tensor::parameter("v", Tensor::from_vector({4, 4}, Shape{2}).to_host());
  optim::SGD opt_v({v}, 0.25);
  {
    testing::OnDevice on(testing::fake_runtime());
    sum(v * v).backward();
    opt_v.step();  // v = 2
  }
  sum(v * v).backward();
  opt_v.step();  // on the CPU, from v = 2: v = 1
  EXPECT_EQ(v.to_vector(), (std::vector<double>{1, 1}));
}

}  // namespace
}  // namespace kiln
