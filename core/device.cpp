// Device parsing and availability.
#include <memory>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/device.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

namespace kiln {

const char* device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

cuda::Runtime* cuda_runtime(std::string* why) { return cuda::Runtime::system(why); }

cuda::Runtime* simulated_cuda_runtime() {
  static cuda::Runtime rt(cuda::fake_driver(), cuda::RuntimeOptions{"off", "", false});
  return &rt;
}

bool cuda_available() { return cuda_runtime() != nullptr; }

bool DeviceSelection::simulated() const { return runtime && runtime->fake(); }

DeviceSelection parse_device(const std::string& s) {
  if (s == "cpu") return {Device::CPU, nullptr};
  if (s == "sim") return {Device::CUDA, simulated_cuda_runtime()};
  if (s == "auto") {
    cuda::Runtime* rt = cuda_runtime();
    return rt ? DeviceSelection{Device::CUDA, rt} : DeviceSelection{Device::CPU, nullptr};
  }
  if (s == "cuda") {
    std::string why;
    cuda::Runtime* rt = cuda_runtime(&why);
    if (!rt) throw Error("--device cuda: no usable GPU (" + why + "); use --device cpu, auto or sim");
    return {Device::CUDA, rt};
  }
  throw Error("unknown device '" + s + "': expected auto, cpu, cuda or sim");
}

}  // namespace kiln
