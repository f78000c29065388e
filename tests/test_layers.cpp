// Layers: an f64 gradient check of each layer with respect to its input and every parameter,
// the Module API (dotted names, tying, train/eval, dtype conversion, zero_grad) and layer
// paths in recorded ops and errors.
#include <gtest/gtest.h>

#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/gradcheck.hpp>
#include <kiln/layers/attention.hpp>
#include <kiln/layers/dropout.hpp>
#include <kiln/layers/embedding.hpp>
#include <kiln/layers/gated_mlp.hpp>
#include <kiln/layers/layer_norm.hpp>
#include <kiln/layers/mlp.hpp>
#include <kiln/layers/multi_head_attention.hpp>
#include <kiln/layers/rms_norm.hpp>
#include <kiln/layers/rotary.hpp>

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

TEST(LayerGradients, RMSNorm) {
  RMSNorm n(6);
  n.weight.assign(Tensor::randn({6}) + 1.0);  // a weight other than 1, so its gradient counts
  expect_layer_gradients(n, random_input({2, 3, 6}, 7));
}

TEST(LayerGradients, GatedMLP) {
  GatedMLP m(6, 10);
  expect_layer_gradients(m, random_input({2, 3, 6}, 8));
}

TEST(LayerGradients, GroupedQueryAttentionWithRotaryEmbeddings) {
  AttentionOptions o;
  o.dim = 8, o.n_heads = 4, o.n_kv_heads = 2, o.rope_theta = 10000;
  MultiHeadAttention a(o);
  expect_layer_gradients(a, random_input({2, 5, 8}, 9));
}

TEST(LayerGradients, FusedBiasedNonCausalAttention) {
  AttentionOptions o;
  o.dim = 8, o.n_heads = 2, o.fused_qkv = true, o.bias = true, o.causal = false;
  MultiHeadAttention a(o);
  expect_layer_gradients(a, random_input({2, 4, 8}, 10));
}

// Plain causal multi-head attention in the new layer computes what the GPT's layer computes,
// given the same weights (the fused c_attn split into q, k, v).
TEST(LayerValues, MultiHeadAttentionMatchesCausalSelfAttention) {
  CausalSelfAttention gpt(8, 2);
  AttentionOptions o;
  o.dim = 8, o.n_heads = 2, o.bias = true;
  MultiHeadAttention mha(o);
  Tensor w = gpt.c_attn->weight, bias = gpt.c_attn->bias;
  mha.q_proj->weight.assign(slice(w, 0, 0, 8));
  mha.k_proj->weight.assign(slice(w, 0, 8, 16));
  mha.v_proj->weight.assign(slice(w, 0, 16, 24));
  for (auto* p : {&mha.q_proj->bias, &mha.k_proj->bias, &mha.v_proj->bias}) p->assign(Tensor::randn({8}));
  gpt.c_attn->bias.assign(concat({mha.q_proj->bias, mha.k_proj->bias, mha.v_proj->bias}, 0));
  mha.o_proj->weight.assign(gpt.c_proj->weight * 1.0);
  mha.o_proj->bias.assign(gpt.c_proj->bias + 0.5);
  gpt.c_proj->bias.assign(gpt.c_proj->bias + 0.5);
  Tensor x = Tensor::randn({2, 5, 8});
  std::vector<double> a = gpt.forward(x).to_vector(), b = mha.forward(x).to_vector();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
}

// Grouped-query attention equals multi-head attention whose key/value projections repeat each
// key/value head's rows for the query heads it serves.
TEST(LayerValues, GroupedQueryAttentionRepeatsKeyValueHeads) {
  AttentionOptions o;
  o.dim = 8, o.n_heads = 4, o.n_kv_heads = 2, o.rope_theta = 500;
  MultiHeadAttention gqa(o);
  o.n_kv_heads = 4;
  MultiHeadAttention mha(o);
  const int64_t hs = 2;
  mha.q_proj->weight.assign(gqa.q_proj->weight * 1.0);
  mha.o_proj->weight.assign(gqa.o_proj->weight * 1.0);
  for (auto [from, to] : {std::pair{gqa.k_proj, mha.k_proj}, std::pair{gqa.v_proj, mha.v_proj}}) {
    std::vector<Tensor> rows;
    for (int64_t h = 0; h < 4; ++h) rows.push_back(slice(from->weight, 0, (h / 2) * hs, (h / 2 + 1) * hs));
    to->weight.assign(concat(rows, 0));
  }
  Tensor x = Tensor::randn({2, 6, 8});
  std::vector<double> a = gqa.forward(x).to_vector(), b = mha.forward(x).to_vector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
}

// Rotary embeddings rotate pairs (i, i + d/2) by position * theta^(-2i/d): checked against the
// formula at a few positions, and a rotation keeps each pair's length.
TEST(LayerValues, RotaryEmbeddingRotatesHalvesByPosition) {
  RotaryEmbedding rope(4, 100.0);
  HostTensor x = random_input({1, 3, 4}, 11);
  std::vector<double> in = Tensor::from_host(x).to_vector();
  std::vector<double> out = rope.forward(Tensor::from_host(x), /*start=*/2).to_vector();
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t i = 0; i < 2; ++i) {
      const double angle = static_cast<double>(t + 2) * std::pow(100.0, -2.0 * static_cast<double>(i) / 4);
      const double x1 = in[t * 4 + i], x2 = in[t * 4 + i + 2];
      EXPECT_NEAR(out[t * 4 + i], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-12);
      EXPECT_NEAR(out[t * 4 + i + 2], x2 * std::cos(angle) + x1 * std::sin(angle), 1e-12);
    }
}

TEST(TensorFunctions, GradientsOfSinCosSquareClampAndPow) {
  using F = std::function<Tensor(const std::vector<Tensor>&)>;
  const HostTensor x = random_input({3, 4}, 12);
  HostTensor positive = (exp(Tensor::from_host(random_input({3, 4}, 13)))).to_host();
  const std::vector<std::pair<const char*, F>> cases = {
      {"sin", [](const std::vector<Tensor>& in) { return sin(in[0]); }},
      {"cos", [](const std::vector<Tensor>& in) { return cos(in[0]); }},
      {"square", [](const std::vector<Tensor>& in) { return square(in[0]); }},
      {"clamp", [](const std::vector<Tensor>& in) { return clamp(in[0], -0.5, 0.7); }},
  };
  for (const auto& [name, f] : cases) {
    ad::GradCheckResult r = gradcheck(f, {x});
    EXPECT_TRUE(r.ok) << name << ": " << r.report;
  }
  ad::GradCheckResult r = gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], in[1]); }, {positive, x});
  EXPECT_TRUE(r.ok) << "pow: " << r.report;
  EXPECT_EQ(r.rel_error.size(), 2u);
}

TEST(TensorFunctions, ValuesOfClampAndSquare) {
  Tensor x = Tensor::from_vector({-2, -0.5, 0, 0.7, 3}, {5}, DType::f64);
  EXPECT_EQ(clamp(x, -0.5, 0.7).to_vector(), (std::vector<double>{-0.5, -0.5, 0, 0.7, 0.7}));
  EXPECT_EQ(square(x).to_vector(), (std::vector<double>{4, 0.25, 0, 0.7 * 0.7, 9}));
  EXPECT_THROW(clamp(x, 1, 0), Error);
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

TEST(ModuleApi, ModuleListNamesItsItemsByIndex) {
  struct Net : Module {
    std::shared_ptr<ModuleList<RMSNorm>> layers;
    Net() {
      layers = register_module("layers", std::make_shared<ModuleList<RMSNorm>>());
      for (int i = 0; i < 3; ++i) layers->push_back(std::make_shared<RMSNorm>(2));
    }
  } net;
  std::vector<std::string> names;
  for (auto& [n, p] : net.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.weight", "layers.1.weight", "layers.2.weight"}));
  EXPECT_EQ(net.layers->size(), 3u);
  EXPECT_EQ((*net.layers)[1]->weight.impl(), net.parameter("layers.1.weight").impl());
}

TEST(ModuleApi, DuplicateAndDottedNamesAreErrors) {
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one containing: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  Module m;
  m.register_module("norm", std::make_shared<RMSNorm>(2));
  expect_error([&] { m.register_module("norm", std::make_shared<RMSNorm>(2)); },
               "module name 'norm': a module of this name is already registered");
  expect_error([&] { m.register_parameter("norm", constant_init({2}, 0)); },
               "parameter name 'norm': a module of this name is already registered");
  expect_error([&] { m.register_module("a.b", std::make_shared<RMSNorm>(2)); }, "must not contain '.'");
  expect_error([&] { m.register_parameter("", constant_init({2}, 0)); }, "must not be empty");
  RMSNorm n(2);
  expect_error([&] { n.register_parameter("weight", n.weight); }, "a parameter of this name is already registered");
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

// A layer called directly, past the containers that hold it (as a model's forward calls
// model.layers[i]), still names its whole path: the error names every container.
TEST(ModuleApi, ErrorsNameEveryContainerOfTheLayer) {
  struct Body : Module {
    std::shared_ptr<ModuleList<MLP>> layers;
  };
  struct Net : Module {
    std::shared_ptr<Body> model;
    Net() {
      model = register_module("model", std::make_shared<Body>());
      model->layers = model->register_module("layers", std::make_shared<ModuleList<MLP>>());
      for (int i = 0; i < 2; ++i) model->layers->push_back(std::make_shared<MLP>(4));
    }
  } net;
  EXPECT_EQ((*net.model->layers)[1]->path(), "model.layers.1");
  try {
    (*net.model->layers)[1]->forward(Tensor::randn({2, 5}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in layer 'model.layers.1.c_fc'"), std::string::npos) << e.what();
  }
  // A module built first and registered later (bottom-up, as constructors run) gets the path too.
  auto late = std::make_shared<ModuleList<MLP>>();
  late->push_back(std::make_shared<MLP>(4));
  Net outer;
  outer.model->register_module("extra", late);
  EXPECT_EQ((*late)[0]->path(), "model.extra.0");
  Engine::current().realize();
}

// Messages speak of the user's tensors, not of kiln's internals.
TEST(ModuleApi, AnAxisOutOfRangeSaysWhichAxesExist) {
  try {
    (void)sum(Tensor::randn({2, 3}), 2);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("axis 2 is out of range for an input of shape [2, 3] (axes run from -2 to 1)"), std::string::npos)
        << m;
    EXPECT_EQ(m.find("builder"), std::string::npos) << m;
  }
  Engine::current().realize();
}

}  // namespace
}  // namespace kiln::nn
