// Benchmarks of the engine's per-step host work: realizing an identical recorded step (cache
// hit: hash, lookup, bind), and building its plan from scratch (passes + planning); and of the
// CPU executor's pointwise bodies (GELU's backward, spelled out in ops or as one op).
// And softcap as kiln's pointwise op or as a user Prim (BM_SoftcapStep).
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <cmath>
#include <numbers>

#include <kiln/ad/backward.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/traced_step.hpp>
#include <kiln/core/user_prim.hpp>
#include <kiln/train/sgd.hpp>

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

// A layer norm's forward and backward over the GPT default config's activations ([16, 64, 128]
// f32) as the CPU executor runs them: arg 0 after pointwise fusion only (the CPU pipeline), arg 1
// with the row reductions and the ops around them fused into fused_rows ops.
void BM_LayerNormForwardBackward(benchmark::State& state) {
  const Shape x_shape{16, 64, 128}, row{128};
  Circuit c;
  ValueId x = c.add_external({x_shape, DType::f32}, ValueRole::Input);
  ValueId gamma = c.add_external({row, DType::f32}, ValueRole::Input);
  ValueId beta = c.add_external({row, DType::f32}, ValueRole::Input);
  ValueId r = c.add_external({x_shape, DType::f32}, ValueRole::Input);
  Builder b(c);
  ValueId y = composite::layernorm(b, x, gamma, beta);
  ValueId loss = b.reduce_all(ReduceKind::Sum, b.mul(y, r));
  std::vector<ValueId> outs{y};
  for (ValueId g : ad::backward(b, loss, {x, gamma, beta})) outs.push_back(g);
  Circuit f = fuse_pointwise(cse(c, outs), outs);
  if (state.range(0) == 1) f = fuse_rows(f, outs);
  Program p(std::move(f), outs);
  std::vector<HostTensor> binds{HostTensor::zeros(DType::f32, x_shape), HostTensor::zeros(DType::f32, row),
                                HostTensor::zeros(DType::f32, row), HostTensor::zeros(DType::f32, x_shape)};
  for (int64_t i = 0; i < x_shape.numel(); ++i) {
    binds[0].set(i, static_cast<double>(i % 89) / 16.0 - 2.5);
    binds[3].set(i, static_cast<double>(i % 31) / 8.0 - 2.0);
  }
  for (int64_t i = 0; i < row.numel(); ++i) binds[1].set(i, 1.0 + static_cast<double>(i % 7) / 10.0);
  for (auto _ : state) benchmark::DoNotOptimize(p.run(binds));
  state.SetItemsProcessed(state.iterations() * x_shape.numel());
}
BENCHMARK(BM_LayerNormForwardBackward)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// The MLP's bias and GELU forward over [16, 64, 512] f32, keeping the pre-activation for the
// backward: arg 0 as two pointwise ops, arg 1 as one fused_rows op with two outputs.
void BM_BiasGelu(benchmark::State& state) {
  const Shape x_shape{16, 64, 512}, row{512};
  Circuit c;
  ValueId x = c.add_external({x_shape, DType::f32}, ValueRole::Input);
  ValueId bias = c.add_external({row, DType::f32}, ValueRole::Input);
  Builder b(c);
  ValueId h = b.add(x, bias);
  std::vector<ValueId> outs{h, b.pointwise(se::gelu(se::in(0)), {h})};
  Circuit f = cse(c, outs);
  if (state.range(0) == 1) f = fuse_rows(f, outs);
  Program p(std::move(f), outs);
  std::vector<HostTensor> binds{HostTensor::zeros(DType::f32, x_shape), HostTensor::zeros(DType::f32, row)};
  for (int64_t i = 0; i < x_shape.numel(); ++i) binds[0].set(i, static_cast<double>(i % 89) / 16.0 - 2.5);
  for (auto _ : state) benchmark::DoNotOptimize(p.run(binds));
  state.SetItemsProcessed(state.iterations() * x_shape.numel());
}
BENCHMARK(BM_BiasGelu)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// AdamW's update of a [rows, 128] f32 parameter (new moments and parameter; the step's scalars
// as inputs): first arg 0 as three pointwise ops, 1 as one fused_rows op with three outputs;
// second arg the rows (512: a weight; 1: a bias or a layer norm's gain, where the per-op cost
// outweighs the arithmetic).
void BM_AdamWUpdate(benchmark::State& state) {
  const Shape shape{state.range(1), 128};
  Circuit circuit;
  std::vector<ValueId> x;  // g, m, v, p, lr, correction
  for (int k = 0; k < 4; ++k) x.push_back(circuit.add_external({shape, DType::f32}, ValueRole::Input));
  for (int k = 0; k < 2; ++k) x.push_back(circuit.add_external({Shape{}, DType::f32}, ValueRole::Input));
  Builder b(circuit);
  using se::in, se::c;
  ValueId m = b.pointwise(in(0) * c(0.9) + in(1) * c(0.1), {x[1], x[0]});
  ValueId v = b.pointwise(in(0) * c(0.999) + in(1) * in(1) * c(0.001), {x[2], x[0]});
  ValueId p = b.pointwise(in(0) - in(1) * in(2) / (se::sqrt(in(3)) * in(4) + c(1e-8)), {x[3], x[4], m, v, x[5]});
  std::vector<ValueId> outs{m, v, p};
  Circuit f = cse(circuit, outs);
  if (state.range(0) == 1) f = fuse_rows(f, outs);
  Program prog(std::move(f), outs);
  std::vector<HostTensor> binds;
  for (int k = 0; k < 4; ++k) binds.push_back(HostTensor::zeros(DType::f32, shape));
  for (int k = 0; k < 2; ++k) binds.push_back(HostTensor::zeros(DType::f32, Shape{}));
  for (int64_t i = 0; i < shape.numel(); ++i)
    for (int k = 0; k < 4; ++k) binds[static_cast<size_t>(k)].set(i, 0.5 + static_cast<double>((i + k) % 13) / 8.0);
  binds[4].set(0, 1e-3);
  binds[5].set(0, 1.0);
  for (auto _ : state) benchmark::DoNotOptimize(prog.run(binds));
  state.SetItemsProcessed(state.iterations() * shape.numel());
}
BENCHMARK(BM_AdamWUpdate)->ArgsProduct({{0, 1}, {512, 1}})->Unit(benchmark::kMicrosecond);

// softcap(h) = 2 tanh(h / 2) over a (4096, 256) Linear output, forward and backward in a traced
// step: 0 kiln's own pointwise op (map), 1 a user Prim whose reference is Eigen arrays, 2 a user
// Prim whose reference loops over HostTensor::get/set (docs/BENCHMARKS.md, "User Prims on the CPU").
UserPrim softcap_prim(bool eigen_reference) {
  UserPrimSpec s;
  s.name = eigen_reference ? "bench_softcap_eigen" : "bench_softcap_get_set";
  s.shape = [](const ShapeCtx&, const std::vector<ValueInfo>& in, const Params&) {
    return std::vector<ValueInfo>{in[0]};
  };
  if (eigen_reference)
    s.reference = [](const PrimCall& c) {  // f32 only in this benchmark
      const auto k = static_cast<float>(c.params.reals[0]);
      const Eigen::Index n = c.inputs[0]->numel();
      Eigen::Map<Eigen::ArrayXf>(c.outputs[0].data<float>(), n) =
          k * (Eigen::Map<const Eigen::ArrayXf>(c.inputs[0]->data<float>(), n) / k).tanh();
    };
  else
    s.reference = [](const PrimCall& c) {
      const double k = c.params.reals[0];
      for (int64_t i = 0; i < c.inputs[0]->numel(); ++i) c.outputs[0].set(i, k * std::tanh(c.inputs[0]->get(i) / k));
    };
  s.vjp = [](const VjpArgs& a) {
    const Tensor t = a.outputs[0] / a.params.reals[0];
    return std::vector<Tensor>{a.out_grads[0] * (1.0 - t * t)};
  };
  return register_prim(s);
}

void BM_SoftcapStep(benchmark::State& state) {
  static const UserPrim eigen_prim = softcap_prim(true), get_set_prim = softcap_prim(false);
  HostTensor xs = HostTensor::zeros(DType::f32, Shape{4096, 256});
  for (int64_t i = 0; i < xs.numel(); ++i) xs.set(i, 3 * std::sin(0.01 * static_cast<double>(i)));
  Params cap;
  cap.reals = {2.0};
  const Tensor w = Tensor::parameter("softcap_w", Tensor::randn({256, 256}).to_host());
  Tensor x = Tensor::from_host(xs);
  TracedStep step({x}, [&] {
    const Tensor h = matmul(x, w) * 0.0625;
    const Tensor y = state.range(0) == 0 ? map(se::c(2.0) * se::tanh(se::in(0) / se::c(2.0)), {h})
                                         : (state.range(0) == 1 ? eigen_prim : get_set_prim)({h}, cap);
    mean(square(y)).backward();
    Engine::current().realize();
    return std::vector<Tensor>{};
  });
  for (auto _ : state) step.run({xs});
}
BENCHMARK(BM_SoftcapStep)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
