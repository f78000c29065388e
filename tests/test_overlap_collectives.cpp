// overlap_collectives (circuit/passes/overlap_collectives.hpp) and the executor's started
// collectives, and ZeRO-1's reduce_scatter and all_gather, in one process: a world of two ranks whose other rank's
// contribution (1 to every element) arrives only when a started all-reduce is finished. A plan that read a bucket
// before its finish, or let another value's storage take the bucket while it was in flight, would read no contribution
// or a clobbered one: the averaged gradients, the update and the loss would differ from the step with whole (blocking)
// all-reduces. Several ranks in processes: tests/test_data_parallel.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/overlap_collectives.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>

#include "expect_error.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

// Two ranks; the other one adds 1 to every element. A blocking sum adds it at once; a started one
// only when finished, as MPI may (the buffer is the library's until then).
class LateWorld final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "late"; }
  void all_reduce_sum(float* data, int64_t n) override { add_one(data, n); }
  void all_reduce_sum(double* data, int64_t n) override { add_one(data, n); }
  void start_all_reduce_sum(float* data, int64_t n) override { started.push_back({data, n, 4}); }
  void start_all_reduce_sum(double* data, int64_t n) override { started.push_back({data, n, 8}); }
  void finish_all_reduce(const void* data) override {
    auto it = std::find_if(started.begin(), started.end(), [&](const Started& s) { return s.data == data; });
    ASSERT_NE(it, started.end()) << "a finish of a buffer no start named";
    if (it->bytes == 4) add_one(static_cast<float*>(it->data), it->n);
    if (it->bytes == 8) add_one(static_cast<double*>(it->data), it->n);
    ++finished;
    started.erase(it);
  }
  void progress() override { ++progress_calls; }
  void finish_all_started() override {
    while (!started.empty()) finish_all_reduce(started.front().data);
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

  struct Started {
    void* data;
    int64_t n;
    int bytes;
  };
  std::vector<Started> started;
  int finished = 0, whole = 0, progress_calls = 0;

 private:
  template <class T>
  void add_one(T* data, int64_t n) {
    for (int64_t i = 0; i < n; ++i) data[i] += T(1);
  }
};

struct ScopedWorld {
  explicit ScopedWorld(std::shared_ptr<Communicator> c) { set_world(std::move(c)); }
  ~ScopedWorld() { set_world(nullptr); }
};

// The op indices of a circuit's all_reduce ops of one stage.
std::vector<size_t> stage_ops(const Circuit& c, AllReduceStage stage) {
  std::vector<size_t> at;
  for (size_t i = 0; i < c.ops().size(); ++i)
    if (c.ops()[i].is(PrimId::all_reduce) && AllReduceParams::of(c.ops()[i]).stage == stage) at.push_back(i);
  return at;
}

// Two gradients made far apart, each a bucket of its own, and a third op between them: the first
// bucket starts right after its gradient, before the second gradient is made; both finish just
// before the first op reading their means.
TEST(OverlapCollectives, EachBucketStartsWhenMadeAndFinishesBeforeItsFirstReader) {
  Circuit c;
  const ValueId a = c.add_external({Shape{4, 3}, DType::f32}, ValueRole::Input);
  const ValueId b = c.add_external({Shape{5}, DType::f32}, ValueRole::Input);
  Builder bl(c);
  const ValueId ga = bl.mul(a, a);                                 // op 0: the first gradient
  const ValueId flat = bl.reshape(ga, Shape{12});                  // op 1: its bucket
  const ValueId between = bl.pointwise(se::exp(se::in(0)), {b});   // op 2: more backward
  const ValueId gb = bl.mul(between, b);                           // op 3: the second gradient
  const ValueId ma = c.add_op(PrimId::all_reduce, {}, {flat})[0];  // op 4
  const ValueId mb = c.add_op(PrimId::all_reduce, {}, {gb})[0];    // op 5
  const ValueId ua = bl.add(ma, ma), ub = bl.add(mb, mb);          // ops 6, 7: the update
  std::vector<ValueId> outputs{ua, ub};
  const Circuit got = overlap_collectives(c, outputs, cpu_target());
  const std::vector<size_t> starts = stage_ops(got, AllReduceStage::start);
  const std::vector<size_t> finishes = stage_ops(got, AllReduceStage::finish);
  ASSERT_EQ(starts.size(), 2u) << got.dump();
  ASSERT_EQ(finishes.size(), 2u) << got.dump();
  EXPECT_TRUE(stage_ops(got, AllReduceStage::whole).empty());
  // mul, reshape, start(a); exp, mul, start(b); finish(a), add; finish(b), add.
  EXPECT_EQ(starts, (std::vector<size_t>{2, 5})) << got.dump();
  EXPECT_EQ(finishes, (std::vector<size_t>{6, 8})) << got.dump();
  // GPU plans keep the whole op (the device collective is a node of the step's graph).
  std::vector<ValueId> gpu_outputs{ua, ub};
  EXPECT_EQ(stage_ops(overlap_collectives(c, gpu_outputs, cuda_target(90, true)), AllReduceStage::start).size(), 0u);

  // Run with the late world: the other rank's 1 arrives at the finish.
  auto late = std::make_shared<LateWorld>();
  ScopedWorld scoped(late);
  HostTensor ha = testing::random_tensor({Shape{4, 3}, DType::f32}, 1),
             hb = testing::random_tensor({Shape{5}, DType::f32}, 2);
  const std::vector<HostTensor> r = Program(got, outputs).run({ha, hb});
  for (int64_t i = 0; i < 12; ++i)
    EXPECT_FLOAT_EQ(static_cast<float>(r[0].get(i)), 2 * ((ha.get(i) * ha.get(i) + 1) / 2)) << i;
  for (int64_t i = 0; i < 5; ++i)
    EXPECT_FLOAT_EQ(static_cast<float>(r[1].get(i)),
                    static_cast<float>(2 * ((std::exp(hb.get(i)) * hb.get(i) + 1) / 2)))
        << i;
  EXPECT_EQ(late->finished, 2);
  EXPECT_GT(late->progress_calls, 0);  // ops ran while a collective was in flight
}

// A run that fails between a start and its finish (an index out of range) waits for the started
// collective before it returns the error: its buffer belongs to the plan's next run.
TEST(OverlapCollectives, ARunThatFailsFinishesTheCollectivesItStarted) {
  Circuit c;
  const ValueId a = c.add_external({Shape{4, 3}, DType::f32}, ValueRole::Input);
  const ValueId table = c.add_external({Shape{5, 3}, DType::f32}, ValueRole::Input);
  const ValueId idx = c.add_external({Shape{2}, DType::i32}, ValueRole::Input);
  Builder bl(c);
  const ValueId flat = bl.reshape(bl.mul(a, a), Shape{12});
  const ValueId rows = bl.gather_rows(table, idx);  // between the start and the finish
  const ValueId mean = c.add_op(PrimId::all_reduce, {}, {flat})[0];
  std::vector<ValueId> outputs{bl.add(mean, mean), rows};
  const Circuit got = overlap_collectives(c, outputs, cpu_target());
  auto late = std::make_shared<LateWorld>();
  ScopedWorld scoped(late);
  HostTensor bad = HostTensor::zeros(DType::i32, Shape{2});
  bad.set(1, 9);  // out of range
  const std::vector<HostTensor> in{testing::random_tensor({Shape{4, 3}, DType::f32}, 1),
                                   testing::random_tensor({Shape{5, 3}, DType::f32}, 2), bad};
  expect_error([&] { Program(got, outputs).run(in); }, {"gather_rows"});
  EXPECT_TRUE(late->started.empty());
  EXPECT_EQ(late->finished, 1);
}

// A GPT step with AdamW and clipping on two (fake) ranks, gradients in buckets of 4 KiB: with the
// overlapped plan and the late world, the losses and the weights after three steps equal the
// plan's with whole all-reduces (pass off) bit for bit, traced and recorded.
TEST(OverlapCollectives, AGptStepWithLateSumsEqualsTheStepWithWholeOnes) {
  models::GPTConfig cfg;
  cfg.vocab_size = 13;
  cfg.block_size = 8;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{2, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 5 + 3) % 13));
  auto train = [&](bool overlap) {
    testing::ScopedPipeline pipeline([&](PipelineOptions& p) {
      if (!overlap) p.disabled = {"overlap_collectives"};
    });
    auto late = std::make_shared<LateWorld>();
    ScopedWorld scoped(late);
    manual_seed(3);
    models::GPT model(cfg);
    optim::AdamWOptions o;
    o.bucket_bytes = 4096;
    o.weight_decay = 0.1;
    optim::AdamW opt(model.parameters(), o);
    Tensor x = Tensor::from_host(ids);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      Tensor loss = model.loss(x, x);
      loss.backward();
      losses.push_back(opt.step(1.0, loss).item());
    }
    std::vector<HostTensor> weights;
    for (const Tensor& p : model.parameters()) weights.push_back(p.to_host());
    EXPECT_EQ(late->started.size(), 0u);
    if (overlap) {
      EXPECT_GT(late->finished, 3 * 4) << "several buckets a step, each started and finished";
    } else {
      EXPECT_EQ(late->finished, 0);
    }
    return std::make_pair(losses, weights);
  };
  const auto [whole_losses, whole_weights] = train(false);
  const auto [losses, weights] = train(true);
  EXPECT_EQ(losses, whole_losses);
  ASSERT_EQ(weights.size(), whole_weights.size());
  for (size_t i = 0; i < weights.size(); ++i)
    EXPECT_EQ(testing::relative_error(weights[i], whole_weights[i]), 0.0) << "parameter " << i;
}

// The no-op collectives leave every rank's values as they are: the mean of one rank's values
// over "two" ranks is its values halved, whole or started.
TEST(OverlapCollectives, NoopCollectivesChangeNothing) {
  auto noop = with_noop_collectives(std::make_shared<LateWorld>());
  EXPECT_EQ(noop->size(), 2);
  EXPECT_NE(noop->backend().find("no-op"), std::string::npos);
  std::vector<float> v{1, 2, 3};
  noop->all_reduce_sum(v.data(), 3);
  noop->start_all_reduce_sum(v.data(), 3);
  noop->progress();
  noop->finish_all_reduce(v.data());
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
}

// reduce_scatter and all_gather (ZeRO-1's collectives) in a world of two ranks whose other rank
// holds what this one holds: the mean of a chunk is the chunk, and the gathered vector is this
// rank's chunk twice. Their shape rules name the op; a plan made for other ranks is refused.
class MirrorWorld final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "mirror"; }
  void all_reduce_sum(float* data, int64_t n) override {
    std::transform(data, data + n, data, [](float x) { return 2 * x; });
  }
  void all_reduce_sum(double* data, int64_t n) override {
    std::transform(data, data + n, data, [](double x) { return 2 * x; });
  }
  void all_gather(float* data, int64_t n) override { std::copy(data, data + n / 2, data + n / 2); }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

TEST(PrimReferenceZeroCollectives, ReduceScatterAndAllGatherGoThroughTheCommunicator) {
  ScopedWorld scoped(std::make_shared<MirrorWorld>());
  Circuit c;
  const ValueId x = c.add_external({Shape{6}, DType::f32}, ValueRole::Input);
  Params two;
  two.ints = {2};
  const ValueId chunk = c.add_op(PrimId::reduce_scatter, two, {x})[0];
  const ValueId gathered = c.add_op(PrimId::all_gather, two, {chunk})[0];
  EXPECT_EQ(c.info(chunk).shape, Shape{3});
  EXPECT_EQ(c.info(gathered).shape, Shape{6});
  const HostTensor in = testing::random_tensor({Shape{6}, DType::f32}, 4);
  const std::vector<HostTensor> r = execute(c, {in}, {chunk, gathered});
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_FLOAT_EQ(static_cast<float>(r[0].get(i)), static_cast<float>(in.get(i)));  // (x + x) / 2, rank 0's chunk
    EXPECT_FLOAT_EQ(static_cast<float>(r[1].get(i)), static_cast<float>(in.get(i)));
    EXPECT_FLOAT_EQ(static_cast<float>(r[1].get(3 + i)), static_cast<float>(in.get(i)));
  }
  Circuit bad;
  const ValueId odd = bad.add_external({Shape{5}, DType::f32}, ValueRole::Input);
  expect_error([&] { bad.add_op(PrimId::reduce_scatter, two, {odd}); },
               {"reduce_scatter", "5 values", "2 equal chunks"});
  Params three;
  three.ints = {3};
  Circuit other;
  const ValueId y = other.add_external({Shape{6}, DType::f32}, ValueRole::Input);
  const ValueId z = other.add_op(PrimId::reduce_scatter, three, {y})[0];
  expect_error([&] { execute(other, {in}, {z}); }, {"reduce_scatter", "planned for 3 ranks", "has 2"});
}

}  // namespace
}  // namespace kiln
