// The CUDA driver API as a table of entry points. kiln never links libcuda: the real table is
// filled by dlopen("libcuda.so.1") + dlsym at run time (so one binary runs with or without a
// driver), and the fake driver (cuda/driver/fake_driver.hpp) fills the same table with checked
// stand-ins that run kernels in the SIMT simulator. The types and constants below are the
// driver ABI's (cuda.h), declared here so that building kiln needs no CUDA headers; a test
// compares them with cuda.h where the toolkit is installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace kiln::kir {
struct Kernel;
}

namespace kiln::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = uint64_t;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUlinkState = struct CUlinkState_st*;
using CUjit_option = int;
using CUgraph = struct CUgraph_st*;
using CUgraphNode = struct CUgraphNode_st*;
using CUgraphExec = struct CUgraphExec_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
// Kernel faults: the context is lost, and every later call in the process fails (sticky).
constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
constexpr CUresult CUDA_ERROR_LAUNCH_TIMEOUT = 702;
constexpr CUresult CUDA_ERROR_HARDWARE_STACK_ERROR = 714;
constexpr CUresult CUDA_ERROR_ILLEGAL_INSTRUCTION = 715;
constexpr CUresult CUDA_ERROR_MISALIGNED_ADDRESS = 716;
constexpr CUresult CUDA_ERROR_INVALID_PC = 718;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
constexpr CUresult CUDA_ERROR_LAUNCH_FAILED = 719;
// Whether r leaves the context unusable (the CUDA driver's sticky errors).
constexpr bool cu_error_is_sticky(CUresult r) {
  return r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_LAUNCH_TIMEOUT || r == CUDA_ERROR_HARDWARE_STACK_ERROR ||
         r == CUDA_ERROR_ILLEGAL_INSTRUCTION || r == CUDA_ERROR_MISALIGNED_ADDRESS || r == CUDA_ERROR_INVALID_PC ||
         r == CUDA_ERROR_LAUNCH_FAILED;
}
constexpr CUresult CUDA_ERROR_INVALID_PTX = 218;

constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;

constexpr CUjit_option CU_JIT_INFO_LOG_BUFFER = 3;
constexpr CUjit_option CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4;
constexpr CUjit_option CU_JIT_ERROR_LOG_BUFFER = 5;
constexpr CUjit_option CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6;
constexpr int CU_JIT_INPUT_PTX = 1;  // CUjitInputType

constexpr int CU_FUNC_ATTRIBUTE_NUM_REGS = 4;
constexpr int CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

// cuLaunchKernel's `extra`: the parameters packed into one buffer.
inline void* const CU_LAUNCH_PARAM_END = reinterpret_cast<void*>(0x00);
inline void* const CU_LAUNCH_PARAM_BUFFER_POINTER = reinterpret_cast<void*>(0x01);
inline void* const CU_LAUNCH_PARAM_BUFFER_SIZE = reinterpret_cast<void*>(0x02);

// CUDA_KERNEL_NODE_PARAMS (its v2 layout, which cuGraphAddKernelNode_v2 takes).
struct CudaKernelNodeParams {
  CUfunction func = nullptr;
  unsigned gridDimX = 1, gridDimY = 1, gridDimZ = 1;
  unsigned blockDimX = 1, blockDimY = 1, blockDimZ = 1;
  unsigned sharedMemBytes = 0;
  void** kernelParams = nullptr;
  void** extra = nullptr;
  void* kern = nullptr;  // CUkernel: unused when func is set
  CUcontext ctx = nullptr;
};

// CUDA_MEMSET_NODE_PARAMS.
struct CudaMemsetNodeParams {
  CUdeviceptr dst = 0;
  size_t pitch = 0;
  unsigned value = 0;
  unsigned elementSize = 1;  // 1, 2 or 4
  size_t width = 0;          // elements per row
  size_t height = 1;
};

// CUtensorMap: 128 opaque bytes that cuTensorMapEncodeTiled fills (the driver needs 64-byte
// alignment; cuda.h declares 128), and the
// enumerations kiln passes it (CUtensorMapDataType, ...Interleave, ...Swizzle, ...L2promotion,
// ...FloatOOBfill).
struct alignas(128) CUtensorMap {
  uint64_t opaque[16];
};
constexpr int CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0;
constexpr int CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1;
constexpr int CU_TENSOR_MAP_DATA_TYPE_UINT32 = 2;
constexpr int CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6;
constexpr int CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7;
constexpr int CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9;
constexpr int CU_TENSOR_MAP_INTERLEAVE_NONE = 0;
constexpr int CU_TENSOR_MAP_SWIZZLE_NONE = 0;
constexpr int CU_TENSOR_MAP_SWIZZLE_128B = 3;
constexpr int CU_TENSOR_MAP_L2_PROMOTION_NONE = 0;
constexpr int CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3;
constexpr int CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0;  // zeros outside the tensor

// One pointer per entry point kiln uses; the comment names the versioned symbol loaded.
struct DriverApi {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDriverGetVersion)(int* version);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* dev, int ordinal);
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice dev);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice dev);
  CUresult (*cuDeviceTotalMem)(size_t* bytes, CUdevice dev);  // cuDeviceTotalMem_v2
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev);
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuMemAlloc)(CUdeviceptr* ptr, size_t bytes);                      // cuMemAlloc_v2
  CUresult (*cuMemFree)(CUdeviceptr ptr);                                      // cuMemFree_v2
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void* src, size_t bytes);    // cuMemcpyHtoD_v2
  CUresult (*cuMemcpyDtoH)(void* dst, CUdeviceptr src, size_t bytes);          // cuMemcpyDtoH_v2
  CUresult (*cuMemcpyDtoD)(CUdeviceptr dst, CUdeviceptr src, size_t bytes);    // cuMemcpyDtoD_v2
  CUresult (*cuMemsetD8)(CUdeviceptr dst, unsigned char value, size_t bytes);  // cuMemsetD8_v2
  CUresult (*cuModuleLoadDataEx)(CUmodule* module, const void* image, unsigned num_options, CUjit_option* options,
                                 void** values);
  CUresult (*cuModuleGetFunction)(CUfunction* fn, CUmodule module, const char* name);
  CUresult (*cuModuleUnload)(CUmodule module);
  CUresult (*cuLinkCreate)(unsigned num_options, CUjit_option* options, void** values, CUlinkState* state);  // _v2
  CUresult (*cuLinkAddData)(CUlinkState state, int type, void* data, size_t size, const char* name,
                            unsigned num_options, CUjit_option* options, void** values);  // cuLinkAddData_v2
  CUresult (*cuLinkComplete)(CUlinkState state, void** cubin, size_t* size);
  CUresult (*cuLinkDestroy)(CUlinkState state);
  CUresult (*cuLaunchKernel)(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shared_bytes, CUstream stream, void** params, void** extra);
  CUresult (*cuFuncGetAttribute)(int* value, int attribute, CUfunction fn);
  CUresult (*cuFuncSetAttribute)(CUfunction fn, int attribute, int value);
  CUresult (*cuGetErrorString)(CUresult error, const char** text);
  // CUDA graphs: all present or all null (a driver without them runs launch by launch).
  CUresult (*cuGraphCreate)(CUgraph* graph, unsigned flags);
  CUresult (*cuGraphAddKernelNode)(CUgraphNode* node, CUgraph graph, const CUgraphNode* dependencies,
                                   size_t num_dependencies, const CudaKernelNodeParams* params);  // _v2
  CUresult (*cuGraphAddMemsetNode)(CUgraphNode* node, CUgraph graph, const CUgraphNode* dependencies,
                                   size_t num_dependencies, const CudaMemsetNodeParams* params, CUcontext ctx);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec* exec, CUgraph graph, unsigned long long flags);
  CUresult (*cuGraphLaunch)(CUgraphExec exec, CUstream stream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec exec);
  CUresult (*cuGraphDestroy)(CUgraph graph);
  // Stream capture, for a library's device work (NCCL's collectives) inside kiln's graphs: all
  // present or all null (the fake driver has none).
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags);
  CUresult (*cuStreamDestroy)(CUstream stream);                 // cuStreamDestroy_v2
  CUresult (*cuStreamBeginCapture)(CUstream stream, int mode);  // cuStreamBeginCapture_v2
  CUresult (*cuStreamEndCapture)(CUstream stream, CUgraph* graph);
  CUresult (*cuGraphAddChildGraphNode)(CUgraphNode* node, CUgraph graph, const CUgraphNode* dependencies,
                                       size_t num_dependencies, CUgraph child);
  // Tensor maps for the tensor copy engine (CUDA 12.0 and up; null with an older driver).
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap* map, int data_type, uint32_t rank, void* address,
                                     const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                                     const uint32_t* element_strides, int interleave, int swizzle, int l2_promotion,
                                     int oob_fill);
};
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;

// A driver: the table, what it is (for logs), and, for the fake driver only, a hook through
// which the runtime tells it which kernel IR a PTX text was printed from (the fake driver runs
// IR in the simulator; it does not parse PTX).
struct Driver {
  DriverApi api{};
  std::string description;
  std::function<void(const std::string& ptx, const kir::Kernel& kernel)> observe_kernel;
  bool fake = false;
};

// "CUDA_ERROR_INVALID_PTX" for the codes declared above, nullptr for others.
const char* cu_error_name(CUresult r);

// dlopen(library) and resolve every entry point. Returns nullopt with the reason in *why when
// the library or a symbol is missing (a machine without a driver is not an error here).
std::optional<Driver> load_cuda_driver(std::string* why, const char* library = "libcuda.so.1");

}  // namespace kiln::cuda
