// A user's program on kiln: a two-layer network (a Module of two Linears) fits y = sin(3x) on the
// CPU. It checks its gradients against finite differences first, draws its data from kiln's
// Philox stream into an HDF5 data file, trains with AdamW in a replayed step (TracedStep), and
// saves its weights to an HDF5 file. Exits 0 when the gradient check passes and the loss fell
// tenfold. It includes <kiln/kiln.hpp> alone.
//   ./tiny_regression [weights.h5]
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

using namespace kiln;

// x: (n, 1) -> (n, 1).
class TinyNet : public nn::Module {
 public:
  explicit TinyNet(int64_t hidden)
      : hidden_layer(register_module("hidden", std::make_shared<nn::Linear>(1, hidden, true, 1.0))),
        output_layer(register_module("output", std::make_shared<nn::Linear>(hidden, 1, true, 0.1))) {}
  Tensor forward(const Tensor& x) const { return output_layer->forward(tanh(hidden_layer->forward(x))); }
  std::shared_ptr<nn::Linear> hidden_layer, output_layer;
};

// n points of [-1, 1] and their targets sin(3x).
static void make_data(int64_t n, HostTensor& x, HostTensor& y, DType dtype) {
  x = HostTensor::zeros(dtype, Shape{n, 1});
  y = HostTensor::zeros(dtype, Shape{n, 1});
  for (int64_t i = 0; i < n; ++i) {
    double v = -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(n - 1);
    x.set(i, v);
    y.set(i, std::sin(3.0 * v));
  }
}

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "tiny_regression.h5";
  std::printf("kiln %s\n", version_string);
  manual_seed(7);

  // 1. The gradients of the loss with respect to every parameter, in f64, by name.
  {
    TinyNet net(8);
    net.to(DType::f64);
    HostTensor x, y;
    make_data(16, x, y, DType::f64);
    auto loss = [&](const std::vector<Tensor>& in) { return mean(square(net.forward(in[0]) - in[1])); };
    ad::GradCheckResult check = gradcheck(loss, {x, y}, net.named_parameters());
    std::printf("%s", check.report.c_str());
    if (!check.ok) return 1;
  }

  // 2. The data: x drawn from kiln's Philox stream (seed 7, stream 0; the same bits on every
  // backend and as cuRAND's Philox), written to an HDF5 data file and read back from it.
  const std::string data_path = out + ".data.h5";
  {
    HostTensor xs, ys;
    make_data(256, xs, ys, DType::f32);
    for (int64_t i = 0; i < xs.numel(); ++i) {
      const double v = -1.0 + 2.0 * bits_to_uniform(philox_bits(7, 0, static_cast<uint64_t>(i)));
      xs.set(i, v);
      ys.set(i, std::sin(3.0 * v));
    }
    h5::write_atomically(data_path, [&](h5::File& f) {
      f.write("x", xs);
      f.write("y", ys);
    });
  }
  const h5::File data = h5::File::open_read(data_path);
  const HostTensor xs = data.read("x"), ys = data.read("y");

  // 3. Training in f32: the step recorded once, then replayed with the inputs' values.
  TinyNet net(32);
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
  for (int i = 2; i <= 500; ++i) {
    last = step.run({xs, ys})[0].item();
    if (i % 100 == 0) std::printf("step %3d  loss %.5f\n", i, last);
  }

  // 4. The weights, by their names ("hidden.weight", ...), in kiln's HDF5 weights format.
  save_module_weights(out, net);
  std::printf("loss %.4f -> %.5f; weights written to %s\n", first, last, out.c_str());
  return last < first / 10 ? 0 : 1;
}
