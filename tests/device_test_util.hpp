// Helpers for the tests of the GPU back end: one fake-driver runtime for the whole test binary
// (kernels run in the SIMT simulator), a small GPT config, the ptxas check of kernels, and a
// count of an instruction in a kernel's text.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

#include <kiln/core/engine.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/kir/ptxas.hpp>
#include <kiln/cuda/runtime/device_program.hpp>
#include <kiln/cuda/runtime/runtime.hpp>
#include <kiln/models/gpt.hpp>

#include "prim_test_util.hpp"

namespace kiln::testing {

// The GPU tier's runtime: the machine's GPU. Without one the test is skipped, unless
// KILN_REQUIRE_GPU=1 says the machine has one: then it fails, so that a GPU machine's run
// cannot pass by skipping. Declares `cuda::Runtime* var` in the calling test.
inline bool gpu_required() {
  const char* v = std::getenv("KILN_REQUIRE_GPU");
  return v && std::string(v) == "1";
}
#define KILN_GPU_OR_SKIP(var)                                                              \
  std::string var##_why;                                                                   \
  ::kiln::cuda::Runtime* var = ::kiln::cuda::Runtime::system(&var##_why);                  \
  if (!var) {                                                                              \
    if (::kiln::testing::gpu_required()) FAIL() << "KILN_REQUIRE_GPU=1 but " << var##_why; \
    GTEST_SKIP() << "no usable GPU: " << var##_why;                                        \
  }

inline cuda::Runtime& fake_runtime() {
  static cuda::Runtime rt(cuda::fake_driver(), cuda::RuntimeOptions{"off", "", true});
  return rt;
}

// Runs the engine on `rt` for the guard's lifetime.
class OnDevice {
 public:
  explicit OnDevice(cuda::Runtime& rt) { Engine::current().set_device(Device::CUDA, &rt); }
  ~OnDevice() { Engine::current().set_device(Device::CPU); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
};

// A small GPT for device tests: vocabulary 13, context 8, 2 heads, 16 wide, dropout 0.1 (so the
// step draws Philox masks on the device).
inline models::GPTConfig tiny_gpt_config(int64_t layers) {
  models::GPTConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.1;
  return c;
}

// How many times `what` occurs in `text` (an instruction in a kernel's PTX, say).
inline size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every kernel given passes ptxas for sm_80 and sm_90 (once per distinct kernel name).
inline void expect_ptxas_accepts(const std::vector<const kir::Kernel*>& kernels) {
  std::set<std::string> seen;
  for (const kir::Kernel* k : kernels) {
    if (!seen.insert(k->name).second) continue;
    for (int sm : {80, 90}) {
      if (sm == 80 && kir::needs_sm90a(*k)) continue;  // wgmma: sm_90a only
      cuda::PtxasResult r = cuda::run_ptxas(kir::print_ptx(*k, sm), sm);
      EXPECT_TRUE(r.ok) << k->name << " sm_" << sm << ":\n" << r.log;
    }
  }
}

}  // namespace kiln::testing
