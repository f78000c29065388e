// Device selection: where realized steps run. The CPU (Eigen executor) is always present; the
// CUDA back end (cuda/) runs steps as kiln's own PTX through the driver, loaded at run time.
// `cuda` without a usable GPU is an error, never a silent fallback; `auto` picks the GPU when
// one is usable; `sim` runs the CUDA back end on the fake driver (kernels in the SIMT simulator
// on the CPU): slow, for testing the whole path on machines without a GPU.
#pragma once

#include <string>

namespace kiln {

namespace cuda {
class Runtime;
}

enum class Device { CPU, CUDA };

const char* device_name(Device d);
// The process's CUDA runtime over the real driver; nullptr when there is none, with the reason
// in *why when given.
cuda::Runtime* cuda_runtime(std::string* why = nullptr);
// The process's CUDA runtime over the fake driver, as a GPU runs: memory planned in one
// workspace and steps replayed as graphs (the tests' fake runtimes allocate every buffer alone
// for the simulator's bounds checks instead).
cuda::Runtime* simulated_cuda_runtime();
// True when a CUDA runtime is usable.
bool cuda_available();

// A device and, for CUDA, the runtime it runs through (the GPU's or the simulator's).
struct DeviceSelection {
  Device device = Device::CPU;
  cuda::Runtime* runtime = nullptr;
  bool simulated() const;
};
// Parses "auto" | "cpu" | "cuda" | "sim"; throws kiln::Error for other words or for an
// unavailable "cuda".
DeviceSelection parse_device(const std::string& s);

}  // namespace kiln
