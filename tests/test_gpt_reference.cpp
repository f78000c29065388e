// T6: the GPT against the independent PyTorch oracle in ../shared/reference (its README states
// the tolerances used here): logits, loss and every parameter gradient in f64 and f32, and the
// losses of ten AdamW steps in f32. Errors are ||kiln - ref|| / ||ref|| per tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "train/adamw.hpp"
#include "train/hdf5_file.hpp"
#include "train/weights.hpp"

namespace kiln {
namespace {

const std::string kDir = KILN_REFERENCE_DIR;

bool reference_present() { return std::filesystem::exists(kDir + "/gpt_tiny_reference.h5"); }

#define REQUIRE_REFERENCE()                                                                      \
  do {                                                                                           \
    if (!reference_present()) {                                                                  \
      if (std::getenv("KILN_REQUIRE_REFERENCE")) FAIL() << "reference data missing in " << kDir; \
      GTEST_SKIP() << "reference data not found in " << kDir;                                    \
    }                                                                                            \
  } while (0)

double rel_error(const HostTensor& a, const HostTensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape());
  double d = 0, n = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    d += (a.get(i) - ref.get(i)) * (a.get(i) - ref.get(i));
    n += ref.get(i) * ref.get(i);
  }
  return std::sqrt(d) / std::sqrt(n);
}

struct Loaded {
  std::unique_ptr<models::GPT> model;
  Tensor x, y;
};

Loaded load(DType dtype) {
  Loaded l;
  l.model = std::make_unique<models::GPT>(read_weights_config(kDir + "/gpt_tiny_weights.h5"));
  load_weights(kDir + "/gpt_tiny_weights.h5", *l.model);
  l.model->to(dtype);
  h5::File f = h5::File::open_read(kDir + "/gpt_tiny_reference.h5");
  l.x = Tensor::from_host(f.read("batch/x"));
  l.y = Tensor::from_host(f.read("batch/y"));
  return l;
}

void check_forward_backward(DType dtype, double tol_logits, double tol_grads) {
  Loaded l = load(dtype);
  Tensor logits = l.model->forward(l.x);
  Tensor loss = cross_entropy(logits, l.y);
  loss.backward();
  Engine::current().realize();
  h5::File ref = h5::File::open_read(kDir + "/gpt_tiny_reference.h5");
  double e_logits = rel_error(logits.to_host(), ref.read("reference/logits"));
  double ref_loss = ref.read("reference/loss").get(0);
  double e_loss = std::abs(loss.item() - ref_loss) / std::abs(ref_loss);
  std::printf("%s: logits %.2e, loss %.2e\n", dtype_name(dtype), e_logits, e_loss);
  EXPECT_LT(e_logits, tol_logits);
  EXPECT_LT(e_loss, tol_logits);
  double worst = 0;
  for (const auto& [name, p] : l.model->named_parameters()) {
    double e = rel_error(p.grad().to_host(), ref.read("reference/grads/" + dataset_path(name)));
    worst = std::max(worst, e);
    EXPECT_LT(e, tol_grads) << name;
  }
  std::printf("%s: worst gradient %.2e over %zu parameters\n", dtype_name(dtype), worst,
              l.model->named_parameters().size());
}

// The README's expectations: f64 about 1e-10, f32 1e-5 for logits and loss, 1e-4 per gradient.
TEST(GptReference, ForwardBackwardF64) {
  REQUIRE_REFERENCE();
  check_forward_backward(DType::f64, 1e-9, 1e-9);
}

TEST(GptReference, ForwardBackwardF32) {
  REQUIRE_REFERENCE();
  check_forward_backward(DType::f32, 1e-5, 1e-4);
}

TEST(GptReference, TenAdamWStepsF32) {
  REQUIRE_REFERENCE();
  Loaded l = load(DType::f32);
  h5::File ref = h5::File::open_read(kDir + "/gpt_tiny_reference.h5");
  HostTensor want = ref.read("reference/adamw_losses/losses");
  optim::AdamW opt(l.model->parameters(), {1e-3, 0.9, 0.999, 1e-8, 0.0});
  double worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    Tensor loss = l.model->loss(l.x, l.y);
    loss.backward();
    opt.step();
    double e = std::abs(loss.item() - want.get(i));
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-4) << "step " << i;
  }
  std::printf("f32 AdamW: worst loss difference %.2e over %lld steps\n", worst, static_cast<long long>(want.numel()));
}

}  // namespace
}  // namespace kiln
