// Device selection: where realized steps run. The CPU (Eigen executor) is always present; the
// CUDA back end (cuda/) runs steps as kiln's own PTX through the driver, loaded at run time.
// `cuda` without a usable GPU is an error, never a silent fallback; `auto` picks the GPU when
// one is usable. KILN_FAKE_CUDA=1 makes the fake driver (kernels run in the SIMT simulator on
// the CPU) the CUDA device: slow, for testing the whole path on machines without a GPU.
#pragma once

#include <string>

namespace kiln {

namespace cuda {
class Runtime;
}

enum class Device { CPU, CUDA };

const char* device_name(Device d);
// The process's CUDA runtime (the GPU, or the fake driver under KILN_FAKE_CUDA=1); nullptr
// when there is none, with the reason in *why when given.
cuda::Runtime* cuda_runtime(std::string* why = nullptr);
// True when a CUDA runtime is usable.
bool cuda_available();
// Parses "auto" | "cpu" | "cuda"; throws kiln::Error for other words or for an unavailable "cuda".
Device parse_device(const std::string& s);

}  // namespace kiln
