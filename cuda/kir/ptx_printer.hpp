// The PTX printer: a one-to-one, deterministic printing of kernel IR as PTX text. It makes no
// decisions: registers are declared per type in a fixed order and named by type prefix and
// number, labels come from the IR's label numbers, floats print as exact bit patterns
// (0f3F800000, 0d3FF0000000000000). Same IR -> byte-identical text.
#pragma once

#include <string>

#include <kiln/cuda/kir/kir.hpp>

namespace kiln::kir {

// Supported targets: 80 (sm_80, PTX ISA 7.1) and 90 (sm_90, PTX ISA 7.8). Throws kiln::Error
// for others. Checks the kernel (kir::check) first.
std::string print_ptx(const Kernel& k, int sm);

// The generator version: part of every module-cache key, bumped whenever the text a given IR
// prints to changes.
constexpr int kPtxGeneratorVersion = 2;

}  // namespace kiln::kir
