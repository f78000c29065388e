// Benchmarks of the engine's per-step host work: realizing an identical recorded step (cache
// hit: hash, lookup, bind), and building its plan from scratch (passes + planning); and of the
// CPU executor's pointwise bodies (GELU's backward, spelled out in ops or as one op).
#include <benchmark/benchmark.h>

#include <cmath>
#include <numbers>

#include "circuit/exec/executor.hpp"
#include "circuit/prims/builder.hpp"
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

// g * gelu'(x) over the GPT default config's MLP activations ([16, 64, 512] f32): arg 0 spells
// gelu'(x) out in ops (as the reverse sweep built it before gelu_grad existed), arg 1 is one
// gelu_grad op.
void BM_GeluBackwardBody(benchmark::State& state) {
  const ScalarExp x = se::in(1);
  ScalarExp d = se::gelu_grad(x);
  if (state.range(0) == 0) {
    const double k0 = std::sqrt(2.0 / std::numbers::pi), k1 = 0.044715;
    const ScalarExp one = se::c(1.0), t = se::tanh(se::c(k0) * (x + se::c(k1) * (x * x * x)));
    d = se::c(0.5) * (one + t) + se::c(0.5 * k0) * x * (one - t * t) * (one + se::c(3.0 * k1) * (x * x));
  }
  const Shape shape{16, 64, 512};
  Circuit c;
  ValueId g = c.add_external({shape, DType::f32}, ValueRole::Input);
  ValueId a = c.add_external({shape, DType::f32}, ValueRole::Input);
  Builder b(c);
  Program p(c, {b.pointwise(se::in(0) * d, {g, a})});
  std::vector<HostTensor> binds{HostTensor::zeros(DType::f32, shape), HostTensor::zeros(DType::f32, shape)};
  for (int64_t i = 0; i < shape.numel(); ++i) {
    binds[0].set(i, 1.0);
    binds[1].set(i, static_cast<double>(i % 97) / 16.0 - 3.0);
  }
  for (auto _ : state) benchmark::DoNotOptimize(p.run(binds));
  state.SetItemsProcessed(state.iterations() * shape.numel());
}
BENCHMARK(BM_GeluBackwardBody)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
