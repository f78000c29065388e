// Helpers the training, model and data tests share: temporary file paths unique to the process,
// a module's parameter values in order, generated text with structure a tiny model learns, and
// the check that CPU bf16 held as rounded f32 trains bit for bit as bf16 storage.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <kiln/core/engine.hpp>
#include <kiln/layers/module.hpp>

#include "scoped_target.hpp"

namespace kiln::testing {

// A path in the temporary directory: kiln_<prefix>_<pid>_<name>.
inline std::string temp_file_path(const std::string& prefix, const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kiln_" + prefix + "_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Every parameter's values, in named_parameters() order.
inline std::vector<double> parameter_values(const nn::Module& m) {
  std::vector<double> v;
  for (const auto& [n, p] : m.named_parameters())
    for (double x : p.to_vector()) v.push_back(x);
  return v;
}

// `words` words from a small lexicon in a fixed pattern.
inline std::string lexicon_text(size_t words) {
  const char* lexicon[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran ", "fast ", "home.\n"};
  std::string s;
  for (size_t i = 0; i < words; ++i) s += lexicon[(i * 7 + i / 3) % 10];
  return s;
}

// `train()` (a run returning .losses and .weights) under the bf16 policy gives the same bits with
// bf16 operands held in f32 rounded to bf16 (bf16_as_rounded_f32) as with bf16 storage widened
// for each product (the pass off).
template <class Train>
void expect_rounded_f32_trains_as_bf16_storage(const Train& train) {
  ScopedPrecision policy(Precision::bf16);
  ScopedTarget rounded_products([](Target& t) { t.cpu_bf16 = CpuBf16Products::rounded_f32; });
  const auto rounded = train();
  ScopedPipeline off("-bf16_as_rounded_f32");
  const auto stored = train();
  EXPECT_EQ(rounded.losses, stored.losses);
  EXPECT_EQ(rounded.weights, stored.weights);
}

}  // namespace kiln::testing
