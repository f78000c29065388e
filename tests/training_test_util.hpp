// Helpers the training, model and data tests share: temporary file paths unique to the process,
// a module's parameter values in order, and generated text with structure a tiny model learns.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <kiln/layers/module.hpp>

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

}  // namespace kiln::testing
