// Internals of the fake driver shared by its source files: the one process-wide fake device with
// its handle tables, entry() that every entry point runs through, and the entry points that
// fake_driver_launch.cpp defines for the table in fake_driver.cpp. Not part of the API.
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <kiln/cuda/driver/driver_api.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/sim/simulator.hpp>

namespace kiln::cuda::fake {

// A kernel's IR as observed with its PTX text, prepared for the simulator once.
struct Observed {
  kir::Kernel kernel;
  std::shared_ptr<const sim::SimKernel> prepared;
};

// A JIT log buffer given through CU_JIT_*_LOG_BUFFER options (the caller owns the memory).
struct JitLog {
  char* buffer = nullptr;
  size_t size = 0;
  void** size_slot = nullptr;  // the option value, which receives the bytes written

  void write(const std::string& text) const {
    if (buffer == nullptr || size == 0) return;
    const size_t n = std::min(text.size(), size - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
    if (size_slot != nullptr) *size_slot = reinterpret_cast<void*>(static_cast<uintptr_t>(n));
  }
};

struct JitLogs {
  JitLog error, info;
};

struct Module {
  std::shared_ptr<const Observed> kernel;  // kiln prints one kernel per PTX text
  uintptr_t function = 0;                  // its function handle, made on first lookup
};

struct Function {
  uintptr_t module = 0;
  std::shared_ptr<const Observed> kernel;
  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as set by cuFuncSetAttribute, or -1 while
  // unset (a launch may then pass what the driver allows by default: the static limit less the
  // kernel's static arrays).
  int64_t max_dynamic_shared = -1;
};

struct Link {
  JitLogs logs;
  std::string ptx;
  std::shared_ptr<const Observed> kernel;  // set by cuLinkAddData
  std::string image;                       // the fake cubin, alive until cuLinkDestroy
};

// A node of a fake graph: a kernel launch (fn set; its packed parameters copied) or a memset
// of zeros.
struct GraphNode {
  uintptr_t handle = 0;
  CUfunction fn = nullptr;
  sim::Dim3 grid, block;
  unsigned shared_bytes = 0;
  bool has_params = false;
  size_t param_size = 0;
  std::vector<uint64_t> params;  // 8-aligned, as the driver requires of a parameter buffer
  CUdeviceptr memset_dst = 0;
  size_t memset_bytes = 0;
};

struct FakeDevice {
  std::mutex mu;
  bool initialized = false;
  sim::DeviceMemory memory;
  std::set<uint64_t> freed;  // bases freed and not allocated again, to name double frees
  int64_t launches = 0, modules_loaded = 0, jit_compiles = 0;
  std::map<std::string, std::shared_ptr<const Observed>> observed;  // by PTX text, kept for the process
  std::map<uintptr_t, Module> modules;
  std::map<uintptr_t, Function> functions;
  std::map<uintptr_t, Link> links;
  std::map<uintptr_t, std::vector<GraphNode>> graphs, graph_execs;
  int64_t graph_launches = 0;
  std::optional<std::string> fail_next_jit;
  std::string last_error;
  // After a kernel fault the context is lost, as on a GPU: every later call (but the device
  // queries) fails with this code until fake_driver_recover() (a new process, for tests).
  CUresult sticky = CUDA_SUCCESS;
  std::string sticky_message;
  bool count_bank_conflicts = false;
  uint64_t sample_blocks = 0;                           // fake_driver_sample_blocks
  std::map<std::string, FakeKernelStats> kernel_stats;  // while counting
  uintptr_t last_handle = 0x1000;

  uintptr_t new_handle() { return last_handle += 0x10; }  // distinct across handle kinds
};

inline FakeDevice& device() {
  static FakeDevice d;
  return d;
}

// Records why a call failed (the runtime adds it to its error); returns its code. The caller
// holds the device's lock.
inline CUresult fail(CUresult code, const std::string& message) {
  device().last_error = message;
  spdlog::debug("fake driver: {}", message);  // the runtime puts it into its error
  return code;
}

template <typename Handle>
Handle to_handle(uintptr_t h) {
  return reinterpret_cast<Handle>(h);
}
template <typename Handle>
uintptr_t from_handle(Handle h) {
  return reinterpret_cast<uintptr_t>(h);
}

inline const CUcontext kPrimaryContext = to_handle<CUcontext>(0xC0);

// The calling thread's current context, as the driver keeps one per thread: a thread that
// never made the context current gets CUDA_ERROR_INVALID_CONTEXT.
inline thread_local CUcontext current_context = nullptr;

// Device queries and context management work without a current context, and after a fault.
inline bool context_free(const char* fn) {
  return std::strncmp(fn, "cuDevice", 8) == 0 || std::strcmp(fn, "cuCtxSetCurrent") == 0;
}

// Runs one entry point: locks the device, requires cuInit, a current context and a context
// not lost to a fault, and turns exceptions (the device memory's bounds and double-free checks
// throw kiln::Error) into failed results.
template <typename Body>
CUresult entry(const char* fn, Body&& body) {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, std::string(fn) + ": cuInit has not been called");
  if (!context_free(fn)) {
    if (d.sticky != CUDA_SUCCESS) return fail(d.sticky, std::string(fn) + ": " + d.sticky_message);
    if (current_context == nullptr)
      return fail(CUDA_ERROR_INVALID_CONTEXT,
                  std::string(fn) + ": no current context on this thread (cuCtxSetCurrent was not called here)");
  }
  try {
    return body(d);
  } catch (const std::bad_alloc&) {
    return fail(CUDA_ERROR_OUT_OF_MEMORY, std::string(fn) + ": out of host memory backing the fake device");
  } catch (const std::exception& e) {
    return fail(CUDA_ERROR_INVALID_VALUE, std::string(fn) + ": " + e.what());
  }
}

// The entry points fake_driver_launch.cpp defines, for fake_driver()'s table.
CUresult fake_cuLaunchKernel(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shared_bytes, CUstream stream, void** params, void** extra);
CUresult fake_cuGraphCreate(CUgraph* graph, unsigned flags);
CUresult fake_cuGraphAddKernelNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t num_deps,
                                   const CudaKernelNodeParams* p);
CUresult fake_cuGraphAddMemsetNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t num_deps,
                                   const CudaMemsetNodeParams* p, CUcontext ctx);
CUresult fake_cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags);
CUresult fake_cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult fake_cuGraphExecDestroy(CUgraphExec exec);
CUresult fake_cuGraphDestroy(CUgraph graph);
CUresult fake_cuTensorMapEncodeTiled(CUtensorMap* map, int data_type, uint32_t rank, void* address,
                                     const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                                     const uint32_t* element_strides, int interleave, int swizzle, int l2_promotion,
                                     int oob_fill);

}  // namespace kiln::cuda::fake
