// KILN_REQUIRE_PTXAS_OR_SKIP(): the first line of a test that needs the CUDA toolkit's ptxas.
// Without ptxas the test is skipped, except where KILN_REQUIRE_PTXAS=1 (CI): there a missing
// ptxas fails the test, so that validation cannot silently stop running.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <kiln/cuda/kir/ptxas.hpp>

#define KILN_REQUIRE_PTXAS_OR_SKIP()                                                                    \
  do {                                                                                                  \
    if (::kiln::cuda::find_ptxas().empty()) {                                                           \
      const char* kiln_require_ptxas = std::getenv("KILN_REQUIRE_PTXAS");                               \
      if (kiln_require_ptxas != nullptr && std::string(kiln_require_ptxas) == "1")                      \
        FAIL() << "ptxas not found on PATH or in /usr/local/cuda/bin, and KILN_REQUIRE_PTXAS=1: CI "    \
                  "requires ptxas";                                                                     \
      GTEST_SKIP() << "ptxas not found on PATH or in /usr/local/cuda/bin (set KILN_REQUIRE_PTXAS=1 to " \
                      "make this a failure)";                                                           \
    }                                                                                                   \
  } while (0)
