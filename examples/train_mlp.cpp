// A small MLP learns a synthetic 3-class task (points of the plane labelled by angle sector,
// a non-linear boundary) with SGD + momentum on the CPU; prints its falling loss.
//   ./train_mlp [steps]
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <string>

#include <kiln/circuit/prims/philox.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/tensor.hpp>
#include <kiln/train/sgd.hpp>

using namespace kiln;

// A batch of points in [-1, 1]^2 and their class: the sector of their angle, rotated by radius.
static void make_batch(uint64_t step, int64_t n, Tensor& x, Tensor& y) {
  HostTensor xs = HostTensor::zeros(DType::f32, Shape{n, 2});
  HostTensor ys = HostTensor::zeros(DType::i32, Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    double a = 2 * bits_to_uniform(philox_bits(step, 0, 2 * static_cast<uint64_t>(i))) - 1;
    double b = 2 * bits_to_uniform(philox_bits(step, 0, 2 * static_cast<uint64_t>(i) + 1)) - 1;
    double angle = std::atan2(b, a) + 2.0 * std::sqrt(a * a + b * b) + M_PI;
    xs.set(2 * i, a);
    xs.set(2 * i + 1, b);
    ys.set(i, static_cast<int>(std::floor(std::fmod(angle, 2 * M_PI) / (2 * M_PI / 3))) % 3);
  }
  x = Tensor::from_host(xs);
  y = Tensor::from_host(ys);
}

static Tensor init(const std::string& name, Shape shape, double scale) {
  // Parameters drawn with kiln's own Philox normal sampler, realized once.
  Tensor r = Tensor::randn(shape) * scale;
  return Tensor::parameter(name, r.to_host());
}

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::stoi(argv[1]) : 400;
  const int64_t batch = 256, hidden = 64;
  manual_seed(1);
  Tensor w1 = init("w1", {2, hidden}, 1.0), b1 = init("b1", {hidden}, 0.0);
  Tensor w2 = init("w2", {hidden, hidden}, 1.0 / std::sqrt(hidden)), b2 = init("b2", {hidden}, 0.0);
  Tensor w3 = init("w3", {hidden, 3}, 1.0 / std::sqrt(hidden)), b3 = init("b3", {3}, 0.0);
  optim::SGD opt({w1, b1, w2, b2, w3, b3}, 0.1, 0.9);

  spdlog::info("MLP 2-{}-{}-3, batch {}, SGD lr 0.1 momentum 0.9, {} steps", hidden, hidden, batch, steps);
  auto t0 = std::chrono::steady_clock::now();
  double first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    Tensor x, y;
    make_batch(static_cast<uint64_t>(step), batch, x, y);
    Tensor h = tanh(matmul(x, w1) + b1);
    h = tanh(matmul(h, w2) + b2);
    Tensor loss = cross_entropy(matmul(h, w3) + b3, y);
    loss.backward();
    opt.step();
    last = loss.item();
    if (step == 1) first = last;
    if (step == 1 || step % 50 == 0 || step == steps) {
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / step;
      spdlog::info("step {:4d}/{}  loss {:.4f}  {:.2f} ms/step", step, steps, last, ms);
    }
  }
  const auto& st = Engine::current().stats();
  spdlog::info("loss {:.4f} -> {:.4f}; plans built {}, cache hits {}, hash+bind {:.3f} ms/step", first, last,
               st.plans_built, st.cache_hits, st.last_hash_bind_ms);
  return last < first ? 0 : 1;
}
