// bench_attention: q, k, v resident (parameters, (B, T, H, D) as a projection split into heads
// gives them), traced once and replayed; each run's time is the engine's device-work time of
// the forward, the backward into q, k and v, and a sum of the output (the value read back).
#include "bench_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/traced_step.hpp>

#include "bench_shapes.hpp"

namespace kiln::cli {

namespace {
struct AttentionShape {
  int64_t b, h, t, d;
};

std::vector<AttentionShape> parse_shapes(const std::string& spec) {
  std::vector<AttentionShape> out;
  for (const std::vector<int64_t>& dims : parse_shape_list(spec, "--attention", "BxHxTxD")) {
    if (dims.size() != 4)
      throw Error("--attention: expected BxHxTxD, received " + std::to_string(dims.size()) + " sizes in an item");
    out.push_back({dims[0], dims[1], dims[2], dims[3]});
  }
  return out;
}
}  // namespace

int bench_attention(const std::string& spec, int64_t runs, const std::optional<EstimateRequest>& estimate) {
  manual_seed(1);
  for (const AttentionShape& s : parse_shapes(spec)) {
    const std::string tag =
        std::to_string(s.b) + "x" + std::to_string(s.h) + "x" + std::to_string(s.t) + "x" + std::to_string(s.d);
    auto operand = [&](const std::string& name) {
      if (estimate)  // the work counted, whatever the values: not random numbers drawn on the simulator
        return Tensor::parameter(name + tag, HostTensor::zeros(DType::f32, Shape{s.b, s.t, s.h, s.d}));
      return Tensor::parameter(name + tag, Tensor::randn({s.b, s.t, s.h, s.d}).to_host());
    };
    Tensor q = operand("attention_q_"), k = operand("attention_k_"), v = operand("attention_v_");
    auto heads = [](const Tensor& x) { return permute(x, {0, 2, 1, 3}); };  // (B, H, T, D)
    const SampledBlocks sampled(estimate);
    TracedStep step({}, [&] {
      Tensor total;
      {  // the scores and the output go out of scope before the realization: a live handle would
         // keep them, and the attention fusion leaves a chain whose values someone keeps alone
        Tensor scores = matmul(heads(q) * (1.0 / std::sqrt(static_cast<double>(s.d))), heads(k), false, true);
        Tensor y = permute(matmul(softmax(causal_mask_fill(scores)), heads(v)), {0, 2, 1, 3});
        total = sum(y * y);
      }
      total.backward();
      Engine::current().realize();
      return std::vector<Tensor>{total};
    });
    if (estimate) {
      print_estimate(step, {}, *estimate,
                     "attention " + tag + " " + precision_name(Engine::current().precision()) + ", forward + backward");
      continue;
    }
    const double t = median_work_ms(step, runs);
    const double flops = 12.0 * static_cast<double>(s.b * s.h) * static_cast<double>(s.t) * static_cast<double>(s.t) *
                         static_cast<double>(s.d) / 2;
    std::printf(
        "attention %s (B H T D), causal, %s products, forward + backward: %.3f ms median of %lld -> %.3f TFLOP/s\n",
        tag.c_str(), precision_name(Engine::current().precision()), t, static_cast<long long>(runs),
        flops / (t / 1000) / 1e12);
  }
  return 0;
}

}  // namespace kiln::cli
