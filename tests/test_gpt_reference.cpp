// T6: the GPT against the independent PyTorch oracle in ../shared/reference (its README states
// the tolerances used here): logits, loss and every parameter gradient in f64 and f32, and the
// losses of ten AdamW steps in f32. Errors are ||kiln - ref|| / ||ref|| per tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <kiln/train/adamw.hpp>

#include "gpt_reference_util.hpp"

namespace kiln {
namespace {

using testing::check_reference_forward_backward;
using testing::kReferenceDir;

// The README's expectations: f64 about 1e-10, f32 1e-5 for logits and loss, 1e-4 per gradient.
TEST(GptReference, ForwardBackwardF64) {
  KILN_REQUIRE_REFERENCE();
  check_reference_forward_backward(DType::f64, 1e-9, 1e-9, "f64");
}

TEST(GptReference, ForwardBackwardF32) {
  KILN_REQUIRE_REFERENCE();
  check_reference_forward_backward(DType::f32, 1e-5, 1e-4, "f32");
}

TEST(GptReference, TenAdamWStepsF32) {
  KILN_REQUIRE_REFERENCE();
  testing::ReferenceModel l = testing::load_reference_model(DType::f32);
  h5::File ref = h5::File::open_read(kReferenceDir + "/gpt_tiny_reference.h5");
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
