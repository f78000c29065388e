// Benchmarks of the engine's per-step host work: realizing an identical recorded step (cache
// hit: hash, lookup, bind), and building its plan from scratch (passes + planning).
#include <benchmark/benchmark.h>

#include "core/engine.hpp"
#include "train/sgd.hpp"

using namespace kiln;

namespace {

struct Mlp {
  Tensor w1, b1, w2, b2;
  Mlp(int64_t in, int64_t hidden, int64_t out)
      : w1(Tensor::parameter("w1", Tensor::randn({in, hidden}).to_host())),
        b1(Tensor::parameter("b1", HostTensor::zeros(DType::f32, {hidden}))),
        w2(Tensor::parameter("w2", Tensor::randn({hidden, out}).to_host())),
        b2(Tensor::parameter("b2", HostTensor::zeros(DType::f32, {out}))) {}
  Tensor loss(const Tensor& x, const Tensor& y) const {
    return cross_entropy(matmul(gelu(matmul(x, w1) + b1), w2) + b2, y);
  }
};

// A whole training step (record, backward, SGD, realize) on tiny sizes, so host work dominates.
struct TinyStep {
  Mlp m{8, 16, 4};
  optim::SGD opt{{m.w1, m.b1, m.w2, m.b2}, 0.1};
  Tensor x = Tensor::from_host(Tensor::randn({4, 8}).to_host());
  Tensor y = Tensor::from_ints({0, 1, 2, 3}, {4});
  void run() {
    Tensor l = m.loss(x, y);
    l.backward();
    opt.step();
  }
};

void BM_TrainStepCached(benchmark::State& state) {
  TinyStep step;
  double hash_bind = 0;
  for (auto _ : state) {
    step.run();
    hash_bind += Engine::current().stats().last_hash_bind_ms;
  }
  state.counters["hash_bind_us"] = 1000.0 * hash_bind / static_cast<double>(state.iterations());
  state.counters["ops"] = static_cast<double>(Engine::current().stats().last_recorded_ops);
}
BENCHMARK(BM_TrainStepCached);

// The same step with the plan cache cleared each time: what every step would cost without it.
void BM_TrainStepUncached(benchmark::State& state) {
  TinyStep step;
  double plan = 0;
  for (auto _ : state) {
    Engine::current().plan_cache().clear();
    step.run();
    plan += Engine::current().stats().last_plan_ms;
  }
  state.counters["plan_us"] = 1000.0 * plan / static_cast<double>(state.iterations());
}
BENCHMARK(BM_TrainStepUncached);

}  // namespace

BENCHMARK_MAIN();
