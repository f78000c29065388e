// Loads the real CUDA driver at run time: dlopen("libcuda.so.1") and dlsym of every entry point
// of the DriverApi table (versioned symbols where cuda.h maps a name to one), so that kiln builds
// and runs without libcuda and uses it where a driver is installed.
#include <dlfcn.h>

#include <kiln/cuda/driver/driver_api.hpp>

namespace kiln::cuda {

const char* cu_error_name(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_TIMEOUT: return "CUDA_ERROR_LAUNCH_TIMEOUT";
    case CUDA_ERROR_HARDWARE_STACK_ERROR: return "CUDA_ERROR_HARDWARE_STACK_ERROR";
    case CUDA_ERROR_ILLEGAL_INSTRUCTION: return "CUDA_ERROR_ILLEGAL_INSTRUCTION";
    case CUDA_ERROR_MISALIGNED_ADDRESS: return "CUDA_ERROR_MISALIGNED_ADDRESS";
    case CUDA_ERROR_INVALID_PC: return "CUDA_ERROR_INVALID_PC";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_INVALID_PTX: return "CUDA_ERROR_INVALID_PTX";
    default: return nullptr;
  }
}

namespace {

// Resolves symbols of `lib` into the table's pointers; after the first missing one, ok is false
// and *why says which.
struct Resolver {
  void* lib;
  const char* library;
  std::string* why;
  bool ok = true;

  template <typename Fn>
  void operator()(const char* symbol, Fn*& fn) {
    if (!ok) return;
    fn = reinterpret_cast<Fn*>(dlsym(lib, symbol));
    ok = fn != nullptr;
    if (!ok && why) *why = std::string(library) + " lacks " + symbol;
  }
};

}  // namespace

std::optional<Driver> load_cuda_driver(std::string* why, const char* library) {
  // Never closed on success: the driver's code must outlive every module and context.
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    if (why) *why = std::string(library) + " not found: " + (err ? err : "dlopen failed");
    return std::nullopt;
  }
  Driver d;
  DriverApi& a = d.api;
  Resolver resolve{lib, library, why};
  resolve("cuInit", a.cuInit);
  resolve("cuDriverGetVersion", a.cuDriverGetVersion);
  resolve("cuDeviceGetCount", a.cuDeviceGetCount);
  resolve("cuDeviceGet", a.cuDeviceGet);
  resolve("cuDeviceGetName", a.cuDeviceGetName);
  resolve("cuDeviceGetAttribute", a.cuDeviceGetAttribute);
  resolve("cuDeviceTotalMem_v2", a.cuDeviceTotalMem);
  resolve("cuDevicePrimaryCtxRetain", a.cuDevicePrimaryCtxRetain);
  resolve("cuCtxSetCurrent", a.cuCtxSetCurrent);
  resolve("cuCtxSynchronize", a.cuCtxSynchronize);
  resolve("cuMemAlloc_v2", a.cuMemAlloc);
  resolve("cuMemFree_v2", a.cuMemFree);
  resolve("cuMemcpyHtoD_v2", a.cuMemcpyHtoD);
  resolve("cuMemcpyDtoH_v2", a.cuMemcpyDtoH);
  resolve("cuMemcpyDtoD_v2", a.cuMemcpyDtoD);
  resolve("cuMemsetD8_v2", a.cuMemsetD8);
  resolve("cuModuleLoadDataEx", a.cuModuleLoadDataEx);
  resolve("cuModuleGetFunction", a.cuModuleGetFunction);
  resolve("cuModuleUnload", a.cuModuleUnload);
  resolve("cuLinkCreate_v2", a.cuLinkCreate);
  resolve("cuLinkAddData_v2", a.cuLinkAddData);
  resolve("cuLinkComplete", a.cuLinkComplete);
  resolve("cuLinkDestroy", a.cuLinkDestroy);
  resolve("cuLaunchKernel", a.cuLaunchKernel);
  resolve("cuFuncGetAttribute", a.cuFuncGetAttribute);
  resolve("cuFuncSetAttribute", a.cuFuncSetAttribute);
  resolve("cuGetErrorString", a.cuGetErrorString);
  if (!resolve.ok) {
    dlclose(lib);
    return std::nullopt;
  }
  // Graphs are optional: without any one of their entry points, none is used.
  std::string no_graphs;
  Resolver graphs{lib, library, &no_graphs};
  graphs("cuGraphCreate", a.cuGraphCreate);
  graphs("cuGraphAddKernelNode_v2", a.cuGraphAddKernelNode);
  graphs("cuGraphAddMemsetNode", a.cuGraphAddMemsetNode);
  graphs("cuGraphInstantiateWithFlags", a.cuGraphInstantiateWithFlags);
  graphs("cuGraphLaunch", a.cuGraphLaunch);
  graphs("cuGraphExecDestroy", a.cuGraphExecDestroy);
  graphs("cuGraphDestroy", a.cuGraphDestroy);
  if (!graphs.ok) {
    a.cuGraphCreate = nullptr;
    a.cuGraphAddKernelNode = nullptr;
    a.cuGraphAddMemsetNode = nullptr;
    a.cuGraphInstantiateWithFlags = nullptr;
    a.cuGraphLaunch = nullptr;
    a.cuGraphExecDestroy = nullptr;
    a.cuGraphDestroy = nullptr;
  }
  std::string no_capture;
  Resolver capture{lib, library, &no_capture};
  capture("cuStreamCreate", a.cuStreamCreate);
  capture("cuStreamDestroy_v2", a.cuStreamDestroy);
  capture("cuStreamBeginCapture_v2", a.cuStreamBeginCapture);
  capture("cuStreamEndCapture", a.cuStreamEndCapture);
  capture("cuGraphAddChildGraphNode", a.cuGraphAddChildGraphNode);
  if (!capture.ok || !a.cuGraphCreate) {
    a.cuStreamCreate = nullptr;
    a.cuStreamDestroy = nullptr;
    a.cuStreamBeginCapture = nullptr;
    a.cuStreamEndCapture = nullptr;
    a.cuGraphAddChildGraphNode = nullptr;
  }
  std::string no_tensor_maps;
  Resolver tensor_maps{lib, library, &no_tensor_maps};
  tensor_maps("cuTensorMapEncodeTiled", a.cuTensorMapEncodeTiled);
  if (!tensor_maps.ok) a.cuTensorMapEncodeTiled = nullptr;
  d.description = "CUDA driver (libcuda.so.1)";
  return d;
}

}  // namespace kiln::cuda
