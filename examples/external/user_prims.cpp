// A user's program that extends kiln with its own operations (docs/USING.md, "Your own Prims"):
//  - softcap(x) = cap * tanh(x / cap), a Prim with all four pieces: its shape rule, a CPU
//    reference, a VJP written with Tensor functions, and a pointwise body as its GPU lowering
//    (fused with kiln's own pointwise ops in GPU plans);
//  - round_ste, a custom VJP: values rounded to bf16 going forward, gradients passed straight
//    through going back (quantization-aware training's straight-through estimator).
// A two-layer network fits y = sin(3x + 0.5) through both. The program checks softcap's gradients and
// the network's in f64 by finite differences, checks that round_ste's gradient is the one it
// defines, trains, and exits non-zero if any check fails or the loss did not fall.
//   ./user_prims [--device cpu|sim] [--plant-wrong-vjp]
// --device sim runs the training on the fake GPU: kiln's kernels in its SIMT simulator on the CPU.
// --plant-wrong-vjp registers softcap with a VJP that drops tanh's derivative: the gradient check
// must catch it (scripts/check_install.sh runs this and expects the failure).
#include <Eigen/Core>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/kiln.hpp>

using namespace kiln;

namespace {

// softcap: one input of any shape, the cap in params.reals[0].
UserPrim register_softcap(bool wrong_vjp) {
  UserPrimSpec s;
  s.name = "softcap";
  s.shape = [](const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
    if (in.size() != 1) ctx.fail("takes one input, received " + std::to_string(in.size()));
    if (p.reals.size() != 1 || !(p.reals[0] > 0)) ctx.fail("needs a positive cap (params.reals[0])");
    return std::vector<ValueInfo>{in[0]};
  };
  // Written with Eigen's array expressions, which vectorize tanh: as fast as kiln's own pointwise
  // op in a training step, where a loop of HostTensor::get/set is about 4 times slower
  // (docs/BENCHMARKS.md, "User Prims on the CPU").
  s.reference = [](const PrimCall& call) {
    const double cap = call.params.reals[0];
    const HostTensor& x = *call.inputs[0];
    HostTensor& y = call.outputs[0];
    const Eigen::Index n = x.numel();
    if (x.dtype() == DType::f32) {
      const auto c = static_cast<float>(cap);
      Eigen::Map<Eigen::ArrayXf>(y.data<float>(), n) =
          c * (Eigen::Map<const Eigen::ArrayXf>(x.data<float>(), n) / c).tanh();
    } else {  // f64, the gradient check's dtype (the spec's default dtypes are f32 and f64)
      Eigen::Map<Eigen::ArrayXd>(y.data<double>(), n) =
          cap * (Eigen::Map<const Eigen::ArrayXd>(x.data<double>(), n) / cap).tanh();
    }
  };
  // d softcap / dx = 1 - tanh(x / cap)^2 = 1 - (y / cap)^2: the output is reused.
  s.vjp = [wrong_vjp](const VjpArgs& a) {
    if (wrong_vjp) return std::vector<Tensor>{a.out_grads[0]};
    const Tensor t = a.outputs[0] / a.params.reals[0];
    return std::vector<Tensor>{a.out_grads[0] * (1.0 - t * t)};
  };
  s.pointwise_body = [](const Params& p) { return se::c(p.reals[0]) * se::tanh(se::in(0) / se::c(p.reals[0])); };
  s.describe = [](const Params& p) { return "cap=" + std::to_string(p.reals[0]); };
  return register_prim(s);
}

Params cap(double c) {
  Params p;
  p.reals = {c};
  return p;
}

// x: (n, 1) -> (n, 1): softcapped hidden units, rounded to bf16 (quantize) on their way out.
class CappedNet : public nn::Module {
 public:
  CappedNet(int64_t hidden, const UserPrim& softcap, const CustomVjp& round_ste)
      : hidden_layer(register_module("hidden", std::make_shared<nn::Linear>(1, hidden, true, 1.0))),
        output_layer(register_module("output", std::make_shared<nn::Linear>(hidden, 1, true, 0.1))),
        softcap_(softcap),
        round_ste_(round_ste) {}
  Tensor forward(const Tensor& x, bool quantize = true) const {
    Tensor h = softcap_({hidden_layer->forward(x)}, cap(2.0));
    return output_layer->forward(quantize ? round_ste_({h}) : h);
  }
  std::shared_ptr<nn::Linear> hidden_layer, output_layer;

 private:
  UserPrim softcap_;
  const CustomVjp& round_ste_;
};

void make_data(int64_t n, HostTensor& x, HostTensor& y, DType dtype) {
  x = HostTensor::zeros(dtype, Shape{n, 1});
  y = HostTensor::zeros(dtype, Shape{n, 1});
  for (int64_t i = 0; i < n; ++i) {
    const double v = -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(n - 1);
    x.set(i, v);
    y.set(i, std::sin(3.0 * v + 0.5));
  }
}

bool report(const char* what, const ad::GradCheckResult& r) {
  std::printf("%s: %s\n%s", what, r.ok ? "passed" : "FAILED", r.report.c_str());
  return r.ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu";
  bool wrong_vjp = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device = argv[++i];
    } else if (std::strcmp(argv[i], "--plant-wrong-vjp") == 0) {
      wrong_vjp = true;
    } else {
      std::fprintf(stderr, "usage: user_prims [--device cpu|sim] [--plant-wrong-vjp]\n");
      return 2;
    }
  }
  try {
    const UserPrim softcap = register_softcap(wrong_vjp);
    const CustomVjp round_ste(
        "round_ste", [](const std::vector<Tensor>& x) { return map(se::round_bf16(se::in(0)), x); },
        [](const CustomVjpArgs& a) { return std::vector<Tensor>{a.out_grad}; });
    // The catalogue `kiln prims` prints lists this program's Prims after kiln's own.
    const std::string catalogue = prim_catalogue();
    std::printf("%s", catalogue.substr(0, catalogue.find('\n') + 1).c_str());
    for (size_t at = 0, end; (end = catalogue.find('\n', at)) != std::string::npos; at = end + 1)
      if (catalogue.compare(at, end - at, "user: ") != 0 && catalogue.find("user: ", at) < end)
        std::printf("%s\n", catalogue.substr(at, end - at).c_str());
    manual_seed(7);
    bool ok = true;

    // 1. softcap's VJP against central differences in f64, and the network's parameters through it.
    HostTensor probe = HostTensor::zeros(DType::f64, Shape{4, 6});
    for (int64_t i = 0; i < probe.numel(); ++i) probe.set(i, 5.0 * std::sin(1.3 * static_cast<double>(i)));
    ok &= report(
        "softcap",
        gradcheck([&](const std::vector<Tensor>& in) { return sum(square(softcap({in[0]}, cap(2.0)))); }, {probe}));
    {
      CappedNet net(8, softcap, round_ste);
      net.to(DType::f64);
      HostTensor x, y;
      make_data(16, x, y, DType::f64);
      // round_ste's forward is a step function, whose finite differences are no derivative: the
      // network is checked without it, and round_ste against its definition below.
      auto loss = [&](const std::vector<Tensor>& in) { return mean(square(net.forward(in[0], false) - in[1])); };
      ok &= report("network (softcap, Linear)", gradcheck(loss, {x, y}, net.named_parameters()));
    }

    // 2. round_ste rounds to bf16 and its gradient is the output's, unchanged: d sum(w * round(x)) / dx = w.
    {
      Tensor x = Tensor::from_vector({0.1, -1.337, 2.71828, 100.3}, Shape{4}, DType::f64);
      Tensor w = Tensor::from_vector({1.5, -2.0, 0.25, 3.0}, Shape{4}, DType::f64);
      bool ste_ok = true;
      const std::vector<double> y = round_ste({x}).to_vector();
      const std::vector<double> g = grad(sum(w * round_ste({x})), {x})[0].to_vector(), wv = w.to_vector(),
                                xv = x.to_vector();
      for (size_t i = 0; i < 4; ++i) {
        const bool good = g[i] == wv[i] && y[i] == static_cast<double>(round_to_bf16(static_cast<float>(xv[i])));
        if (!good) std::printf("round_ste: element %zu: value %.9g gradient %.9g (want %.9g)\n", i, y[i], g[i], wv[i]);
        ste_ok &= good;
      }
      std::printf("round_ste: %s\n", ste_ok ? "passed" : "FAILED");
      ok &= ste_ok;
    }
    if (!ok) {
      std::printf("a check failed\n");
      return 1;
    }

    // 3. Training in f32 on the chosen device.
    const DeviceSelection where = parse_device(device);
    Engine::current().set_device(where.device, where.runtime);
    const int steps = 400;
    HostTensor xs, ys;
    make_data(128, xs, ys, DType::f32);
    CappedNet net(32, softcap, round_ste);
    Tensor x = Tensor::from_host(xs), y = Tensor::from_host(ys);
    optim::AdamWOptions options;
    options.lr = 1e-2;
    options.weight_decay = 0.0;
    optim::AdamW opt(net.parameters(), options);
    TracedStep step({x, y}, [&] {
      Tensor loss = mean(square(net.forward(x) - y));
      loss.backward();
      opt.step();
      return std::vector<Tensor>{loss};
    });
    const double first = step.outputs()[0].item();
    double last = first;
    for (int i = 2; i <= steps; ++i) {
      last = step.run({xs, ys})[0].item();
      if (i % (steps / 4) == 0) std::printf("step %3d  loss %.5f\n", i, last);
    }
    const bool fell = last < first / 10;
    std::printf("%s: loss %.4f -> %.5f in %d steps: %s\n", device.c_str(), first, last, steps,
                fell ? "passed" : "FAILED (did not fall enough)");
    return fell ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "user_prims: %s\n", e.what());
    return 1;
  }
}
