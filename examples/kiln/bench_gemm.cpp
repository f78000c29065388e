// bench_gemm: c = a b of random operands resident where the step runs (parameters), stored into a
// resident c in the operands' type (f32; or on the GPU bf16 under --precision bf16, rounded from
// the f32 accumulators by the product's own kernel, as cuBLAS returns a bf16 product), traced once
// and replayed. On the CPU each shape is timed twice: f32, and bf16 operands cast in the step
// with an f32 c. Each run's time is the engine's device-work time (first launch to the
// synchronize after the last, host-timed): the product's one kernel, and the launch and
// synchronize around it (on a GPU, bf16 b rows that are not 16-byte aligned, n = 50257, add a
// copy into padded rows).
#include "bench_gemm.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/traced_step.hpp>

#include "bench_shapes.hpp"

namespace kiln::cli {

namespace {
struct GemmShape {
  int64_t m, n, k;
};

std::vector<GemmShape> parse_shapes(const std::string& spec) {
  std::vector<GemmShape> out;
  for (const std::vector<int64_t>& dims : parse_shape_list(spec, "--gemm", "N or MxNxK")) {
    if (dims.size() == 1)
      out.push_back({dims[0], dims[0], dims[0]});
    else if (dims.size() == 3)
      out.push_back({dims[0], dims[1], dims[2]});
    else
      throw Error("--gemm: expected N or MxNxK, received " + std::to_string(dims.size()) + " sizes in an item");
  }
  return out;
}
}  // namespace

int bench_gemm(const std::string& spec, int64_t runs, const std::optional<EstimateRequest>& estimate) {
  const std::vector<GemmShape> shapes = parse_shapes(spec);
  const bool gpu = Engine::current().device() == Device::CUDA;
  // The GPU times the precision asked for; the CPU times f32 and bf16 products side by side.
  std::vector<bool> bf16_runs{Engine::current().precision() == Precision::bf16};
  if (!gpu) bf16_runs = {false, true};
  // The CPU's f32 run multiplies f32 operands even under --precision bf16 (which casts them).
  ScopedPrecision f32_operands(gpu ? Engine::current().precision() : Precision::f32);
  manual_seed(1);
  for (const GemmShape& s : shapes)
    for (const bool bf16 : bf16_runs) {
      const std::string tag =
          std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + (bf16 ? "_bf16" : "");
      // On the GPU, bf16 operands are stored in bf16 (as the policy's casts leave them), so that
      // the step times the matmul alone. On the CPU they are cast in the step, as a training
      // step's are (whose rounded_f32 products take the rounding pass, and oneDNN's the casts).
      const bool stored_bf16 = bf16 && gpu;
      auto operand = [&](const std::string& name, Shape shape) {
        // An estimate counts the work, whatever the values: zeros, not random numbers drawn on the
        // simulator.
        if (estimate)
          return Tensor::parameter(name + tag, HostTensor::zeros(stored_bf16 ? DType::bf16 : DType::f32, shape), false);
        Tensor init = Tensor::randn(std::move(shape));
        return Tensor::parameter(name + tag, (stored_bf16 ? cast(init, DType::bf16) : init).to_host(), false);
      };
      Tensor a = operand("gemm_a_", {s.m, s.k});
      Tensor b = operand("gemm_b_", {s.k, s.n});
      Tensor c = Tensor::state("gemm_c_" + tag, {s.m, s.n}, stored_bf16 ? DType::bf16 : DType::f32);
      const SampledBlocks sampled(estimate);
      TracedStep step({}, [&] {
        // No handle of the f32 product stays alive to realize: a live one would be written out.
        if (stored_bf16)
          c.assign(cast(matmul(a, b), DType::bf16));
        else if (bf16)
          c.assign(matmul(cast(a, DType::bf16), cast(b, DType::bf16)));
        else
          c.assign(matmul(a, b));
        Engine::current().realize();
        return std::vector<Tensor>{};
      });
      if (estimate) {
        print_estimate(step, {}, *estimate,
                       "gemm " + std::to_string(s.m) + " x " + std::to_string(s.n) + " x " + std::to_string(s.k) +
                           (bf16 ? " bf16" : " f32"));
        continue;
      }
      const double t = median_work_ms(step, runs),
                   flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
      const std::string what = !bf16 ? "f32"
                               : gpu ? "bf16 operands"
                                     : std::string("bf16 operands, cast in the step (cpu-bf16=") +
                                           cpu_bf16_name(Engine::current().target().cpu_bf16) + ")";
      std::printf("gemm %lld x %lld x %lld (m n k), %s: %.3f ms median of %lld -> %.3f TFLOP/s\n",
                  static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k), what.c_str(),
                  t, static_cast<long long>(runs), flops / (t / 1000) / 1e12);
    }
  return 0;
}

}  // namespace kiln::cli
