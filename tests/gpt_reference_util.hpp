// The PyTorch reference of ../shared/reference (its README states the tolerances): loading the
// tiny GPT and its batch, and the forward/backward check, which runs on whatever device the
// engine uses, so the CPU tests and the GPU back end's tests make the same comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <kiln/core/engine.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/weights.hpp>

#include "prim_test_util.hpp"

namespace kiln::testing {

// $KILN_REFERENCE_DIR (tests run from a bundle on another machine), else the folder beside the
// source tree that this binary was built from.
inline const std::string kReferenceDir = [] {
  const char* dir = std::getenv("KILN_REFERENCE_DIR");
  return std::string(dir && *dir ? dir : KILN_REFERENCE_DIR);
}();

inline bool reference_present() { return std::filesystem::exists(kReferenceDir + "/gpt_tiny_reference.h5"); }

// Skips the test without the reference data, except where KILN_REQUIRE_REFERENCE is set (CI).
#define KILN_REQUIRE_REFERENCE()                                                        \
  do {                                                                                  \
    if (!::kiln::testing::reference_present()) {                                        \
      if (std::getenv("KILN_REQUIRE_REFERENCE"))                                        \
        FAIL() << "reference data missing in " << ::kiln::testing::kReferenceDir;       \
      GTEST_SKIP() << "reference data not found in " << ::kiln::testing::kReferenceDir; \
    }                                                                                   \
  } while (0)

struct ReferenceModel {
  std::unique_ptr<models::GPT> model;
  Tensor x, y;
};

inline ReferenceModel load_reference_model(DType dtype) {
  ReferenceModel l;
  l.model = std::make_unique<models::GPT>(read_weights_config(kReferenceDir + "/gpt_tiny_weights.h5"));
  load_weights(kReferenceDir + "/gpt_tiny_weights.h5", *l.model);
  l.model->to(dtype);
  h5::File f = h5::File::open_read(kReferenceDir + "/gpt_tiny_reference.h5");
  l.x = Tensor::from_host(f.read("batch/x"));
  l.y = Tensor::from_host(f.read("batch/y"));
  return l;
}

// Logits, loss and every parameter gradient against the reference, norm-relative; prints the
// errors under `label`.
inline void check_reference_forward_backward(DType dtype, double tol_logits, double tol_grads,
                                             const std::string& label) {
  ReferenceModel l = load_reference_model(dtype);
  Tensor logits = l.model->forward(l.x);
  Tensor loss = cross_entropy(logits, l.y);
  loss.backward();
  Engine::current().realize();
  h5::File ref = h5::File::open_read(kReferenceDir + "/gpt_tiny_reference.h5");
  double e_logits = relative_error(logits.to_host(), ref.read("reference/logits"));
  double ref_loss = ref.read("reference/loss").get(0);
  double e_loss = std::abs(loss.item() - ref_loss) / std::abs(ref_loss);
  std::printf("%s: logits %.2e, loss %.2e\n", label.c_str(), e_logits, e_loss);
  EXPECT_LT(e_logits, tol_logits);
  EXPECT_LT(e_loss, tol_logits);
  double worst = 0;
  for (const auto& [name, p] : l.model->named_parameters()) {
    double e = relative_error(p.grad().to_host(), ref.read("reference/grads/" + dataset_path(name)));
    worst = std::max(worst, e);
    EXPECT_LT(e, tol_grads) << name;
  }
  std::printf("%s: worst gradient %.2e over %zu parameters\n", label.c_str(), worst,
              l.model->named_parameters().size());
}

}  // namespace kiln::testing
