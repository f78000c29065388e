// Device selection: where realized steps run. The CPU (Eigen executor) is always present; the
// CUDA back end (cuda/) lands with the PTX issues. `cuda` without a usable GPU is an error,
// never a silent fallback; `auto` picks the GPU when one is usable.
#pragma once

#include <string>

namespace kiln {

enum class Device { CPU, CUDA };

const char* device_name(Device d);
// True when a CUDA device and a kiln CUDA back end are both available.
bool cuda_available();
// Parses "auto" | "cpu" | "cuda"; throws kiln::Error for other words or for an unavailable "cuda".
Device parse_device(const std::string& s);

}  // namespace kiln
