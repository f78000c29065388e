// Device parsing and availability.
#include "core/device.hpp"

#include "circuit/error.hpp"

namespace kiln {

const char* device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

// The PTX back end is not built yet, so no GPU is usable by kiln whatever the machine has.
bool cuda_available() { return false; }

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::CPU;
  if (s == "auto") return cuda_available() ? Device::CUDA : Device::CPU;
  if (s == "cuda") {
    if (!cuda_available())
      throw Error(
          "--device cuda: no usable GPU (this build of kiln has no CUDA back end yet); use --device cpu or auto");
    return Device::CUDA;
  }
  throw Error("unknown device '" + s + "': expected auto, cpu or cuda");
}

}  // namespace kiln
