// Layers: an f64 gradient check of each layer with respect to its input and every parameter,
// the Module API (dotted names, tying, train/eval, dtype conversion, zero_grad) and layer
// paths in recorded ops and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "circuit/ir/error.hpp"
#include "core/gradcheck.hpp"
#include "layers/attention.hpp"
#include "layers/dropout.hpp"
#include "layers/embedding.hpp"
#include "layers/layer_norm.hpp"
#include "layers/mlp.hpp"

namespace kiln::nn {
namespace {

HostTensor random_input(Shape shape, uint64_t seed) {
  manual_seed(seed);
  return Tensor::randn(std::move(shape), DType::f64).to_host();
}

// Checks d sum(R * layer(x)) / d (x, parameters) in f64.
template <class Layer>
void expect_layer_gradients(Layer& layer, const HostTensor& x) {
  layer.to(DType::f64);
  auto f = [&](const std::vector<Tensor>& in) { return layer.forward(in[0]); };
  ad::GradCheckResult r = gradcheck(f, {x}, {}, /*check_parameters=*/true);
  EXPECT_TRUE(r.ok) << r.report;
  size_t float_inputs = x.dtype() == DType::i32 ? 0 : 1;
  EXPECT_EQ(r.rel_error.size(), float_inputs + layer.named_parameters().size()) << r.report;
}

TEST(LayerGradients, Linear) {
  Linear l(5, 4);
  expect_layer_gradients(l, random_input({3, 5}, 1));
}

TEST(LayerGradients, LinearBatchedNoBias) {
  Linear l(5, 3, false);
  expect_layer_gradients(l, random_input({2, 3, 5}, 2));
}

TEST(LayerGradients, Embedding) {
  Embedding e(7, 3);
  HostTensor idx = Tensor::from_ints({0, 3, 6, 3, 1, 0}, {2, 3}).to_host();
  expect_layer_gradients(e, idx);
}

TEST(LayerGradients, LayerNorm) {
  LayerNorm ln(6);
  expect_layer_gradients(ln, random_input({2, 3, 6}, 3));
}

TEST(LayerErrors, DropoutRefusesAProbabilityOutsideZeroToOne) {
  for (double p : {-0.1, 1.0, 1.5, std::nan("")}) {
    try {
      Dropout d(p);
      ADD_FAILURE() << "accepted p = " << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Dropout: expected a probability p in [0, 1)"), std::string::npos)
          << e.what();
    }
  }
}

TEST(LayerGradients, DropoutInTraining) {
  Dropout d(0.3);
  expect_layer_gradients(d, random_input({4, 5}, 4));
}

TEST(LayerGradients, CausalSelfAttention) {
  CausalSelfAttention a(8, 2);
  expect_layer_gradients(a, random_input({2, 5, 8}, 5));
}

TEST(LayerGradients, MLP) {
  MLP m(6);
  expect_layer_gradients(m, random_input({2, 3, 6}, 6));
}

struct Block : Module {
  std::shared_ptr<Embedding> wte;
  std::shared_ptr<MLP> mlp;
  Tensor head;
  Block() {
    wte = register_module("wte", std::make_shared<Embedding>(5, 6));
    mlp = register_module("mlp", std::make_shared<MLP>(6, 0.5));
    head = register_parameter("head", wte->weight);  // tied
  }
};

TEST(ModuleApi, DottedNamesTyingAndModes) {
  Block b;
  std::vector<std::string> names;
  for (auto& [n, p] : b.named_parameters()) names.push_back(n);
  // Own parameters before children's (as PyTorch), each tensor once under its first name.
  EXPECT_EQ(names, (std::vector<std::string>{"head", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                                             "mlp.c_proj.bias"}));
  EXPECT_EQ(b.num_parameters(), 5u * 6 + 24 * 6 + 24 + 6 * 24 + 6);
  EXPECT_EQ(b.parameter("mlp.c_fc.bias").shape(), (Shape{24}));
  EXPECT_THROW(b.parameter("mlp.nope"), Error);
  EXPECT_TRUE(b.mlp->drop->is_training());
  b.eval();
  EXPECT_FALSE(b.mlp->drop->is_training());
  b.to(DType::f64);
  EXPECT_EQ(b.head.dtype(), DType::f64);  // the tied handle sees the conversion
  EXPECT_EQ(b.wte->weight.grad().dtype(), DType::f64);
}

TEST(ModuleApi, ZeroGradAndEvalDropoutIsIdentity) {
  MLP m(4, 0.5);
  m.eval();
  Tensor x = Tensor::randn({2, 4});
  Tensor loss = sum(m.forward(x));
  loss.backward();
  Engine::current().realize();
  EXPECT_NE(m.c_fc->weight.grad().to_vector(), std::vector<double>(64, 0.0));
  m.zero_grad();
  EXPECT_EQ(m.c_fc->weight.grad().to_vector(), std::vector<double>(64, 0.0));
}

TEST(ModuleApi, RecordedOpsAndErrorsNameTheLayer) {
  struct Net : Module {
    std::shared_ptr<MLP> mlp;
    Net() { mlp = register_module("mlp", std::make_shared<MLP>(4)); }
  } net;
  Tensor y = net.mlp->forward(Tensor::randn({2, 4}));
  std::string dump = Engine::current().pending().dump();
  EXPECT_NE(dump.find("# mlp.c_fc"), std::string::npos) << dump;
  EXPECT_NE(dump.find("# mlp.c_proj"), std::string::npos) << dump;
  try {
    net.mlp->forward(Tensor::randn({2, 5}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in layer 'mlp.c_fc'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 5]"), std::string::npos) << e.what();
  }
  Engine::current().realize();
}

}  // namespace
}  // namespace kiln::nn
