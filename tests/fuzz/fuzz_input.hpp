// What every fuzz target shares. kiln's readers take paths, so an input is written to a file
// of this process first. A hostile input may end in exactly two ways: success, or a
// kiln::Error (the clear message a user gets). Anything else (a sanitizer report, a signal,
// another exception, a failed property check) is a crash that libFuzzer reports and keeps.
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <kiln/circuit/ir/error.hpp>

namespace kiln::fuzz {

// The input as a file (one per process, rewritten for each input).
inline const std::string& input_file(const uint8_t* data, size_t size) {
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("kiln_fuzz_" + std::to_string(::getpid()) + ".bin")).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  return path;
}

// Runs `read` on the input; kiln::Error is a clean refusal. KILN_FUZZ_VERBOSE=1 prints each
// outcome (to see what a corpus reaches: fuzz_x -runs=0 corpus/).
template <class F>
int refuse_or_accept(F&& read) {
  static const bool verbose = [] {
    spdlog::set_level(spdlog::level::off);
    const char* v = std::getenv("KILN_FUZZ_VERBOSE");
    return v && std::string(v) == "1";
  }();
  try {
    read();
    if (verbose) std::fprintf(stderr, "accepted\n");
  } catch (const Error& e) {
    if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
  }
  return 0;
}

// A property that must hold for every input: its failure is a crash with this message.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property violated: %s\n", what);
    std::abort();
  }
}

// Models bigger than this are skipped by the weights and checkpoint targets (a harness limit
// that keeps each input fast: the readers' size checks for any machine are tested in
// tests/test_hostile_files.cpp).
constexpr double kMaxFuzzParameters = 2e5;

}  // namespace kiln::fuzz
