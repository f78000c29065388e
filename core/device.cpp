// Device parsing and availability.
#include <cstdlib>
#include <memory>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/options.hpp>
#include <kiln/core/device.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

namespace kiln {

const char* device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

cuda::Runtime* cuda_runtime(std::string* why) {
  if (options::fake_cuda()) {
    // As a GPU runs: memory planned in one workspace and steps replayed as graphs (the tests'
    // fake runtimes allocate every buffer alone for the simulator's bounds checks instead).
    static cuda::Runtime rt(cuda::fake_driver(), cuda::RuntimeOptions{"off", "", false});
    return &rt;
  }
  return cuda::Runtime::system(why);
}

bool cuda_available() { return cuda_runtime() != nullptr; }

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::CPU;
  if (s == "auto") return cuda_available() ? Device::CUDA : Device::CPU;
  if (s == "cuda") {
    std::string why;
    if (!cuda_runtime(&why)) throw Error("--device cuda: no usable GPU (" + why + "); use --device cpu or auto");
    return Device::CUDA;
  }
  throw Error("unknown device '" + s + "': expected auto, cpu or cuda");
}

}  // namespace kiln
