// The fake driver: every DriverApi entry point implemented over one process-wide fake device
// whose memory is the simulator's DeviceMemory. Each call checks its arguments as the real driver
// would (and a little more), logs why it fails, and launched kernels run in the SIMT simulator.
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string_view>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/sim/tensor_map.hpp>

namespace kiln::cuda {

namespace {

constexpr int kFakeDriverVersion = 12080;
constexpr int kFakeSmMajor = 9, kFakeSmMinor = 0;
constexpr int kFakeMultiprocessors = 8;
constexpr char kFakeDeviceName[] = "kiln fake device (SIMT simulator)";
constexpr size_t kFakeTotalMemory = size_t{8} << 30;  // host memory backs it: keep it modest
constexpr uint64_t kMaxBlockThreads = 1024;
constexpr size_t kParamBufferAlignment = 8;
constexpr std::string_view kFakeCubinMagic = "KILNFAKECUBIN\n";

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

JitLogs parse_jit_options(unsigned num_options, const CUjit_option* options, void** values) {
  JitLogs logs;
  for (unsigned i = 0; options != nullptr && values != nullptr && i < num_options; ++i) {
    switch (options[i]) {
      case CU_JIT_ERROR_LOG_BUFFER: logs.error.buffer = static_cast<char*>(values[i]); break;
      case CU_JIT_INFO_LOG_BUFFER: logs.info.buffer = static_cast<char*>(values[i]); break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        logs.error.size = reinterpret_cast<uintptr_t>(values[i]);
        logs.error.size_slot = &values[i];
        break;
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        logs.info.size = reinterpret_cast<uintptr_t>(values[i]);
        logs.info.size_slot = &values[i];
        break;
      default: break;  // other JIT options do not change what the fake driver does
    }
  }
  return logs;
}

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
  std::map<std::string, FakeKernelStats> kernel_stats;  // while counting
  uintptr_t last_handle = 0x1000;

  uintptr_t new_handle() { return last_handle += 0x10; }  // distinct across handle kinds
};

FakeDevice& device() {
  static FakeDevice d;
  return d;
}

// Records why a call failed (the runtime adds it to its error); returns its code. The caller
// holds the device's lock.
CUresult fail(CUresult code, const std::string& message) {
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

const CUcontext kPrimaryContext = to_handle<CUcontext>(0xC0);

// The calling thread's current context, as the driver keeps one per thread: a thread that
// never made the context current gets CUDA_ERROR_INVALID_CONTEXT.
thread_local CUcontext current_context = nullptr;

// Device queries and context management work without a current context, and after a fault.
bool context_free(const char* fn) {
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

CUresult check_device(CUdevice dev, const char* fn) {
  if (dev != 0)
    return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("{}: no device {} (the fake driver has device 0)", fn, dev));
  return CUDA_SUCCESS;
}

// "Compiles" PTX text: finds the IR it was printed from (or fails as the test hook asks).
CUresult compile_ptx(FakeDevice& d, const std::string& ptx, const char* fn, const JitLog& log,
                     std::shared_ptr<const Observed>* out) {
  if (d.fail_next_jit) {
    const std::string text = *d.fail_next_jit;
    d.fail_next_jit.reset();
    log.write(text);
    return fail(CUDA_ERROR_INVALID_PTX, std::string(fn) + ": PTX compilation failed: " + text);
  }
  auto it = d.observed.find(ptx);
  if (it == d.observed.end()) {
    const std::string text = "the fake driver compiles only PTX whose kernel IR was given to Driver::observe_kernel";
    log.write(text);
    return fail(CUDA_ERROR_INVALID_PTX, std::string(fn) + ": " + text);
  }
  ++d.jit_compiles;
  *out = it->second;
  return CUDA_SUCCESS;
}

CUresult fake_cuInit(unsigned flags) {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("cuInit: flags must be 0, got {}", flags));
  d.initialized = true;
  return CUDA_SUCCESS;
}

CUresult fake_cuDriverGetVersion(int* version) {
  std::lock_guard<std::mutex> lock(device().mu);
  if (version == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDriverGetVersion: null output");
  *version = kFakeDriverVersion;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetCount(int* count) {
  return entry("cuDeviceGetCount", [&](FakeDevice&) {
    if (count == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount: null output");
    *count = 1;
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuDeviceGet(CUdevice* dev, int ordinal) {
  return entry("cuDeviceGet", [&](FakeDevice&) {
    if (dev == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet: null output");
    if (CUresult r = check_device(ordinal, "cuDeviceGet")) return r;
    *dev = 0;
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuDeviceGetName(char* name, int len, CUdevice dev) {
  return entry("cuDeviceGetName", [&](FakeDevice&) {
    if (name == nullptr || len <= 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName: no buffer");
    if (CUresult r = check_device(dev, "cuDeviceGetName")) return r;
    const size_t n = std::min(sizeof(kFakeDeviceName) - 1, static_cast<size_t>(len) - 1);
    std::memcpy(name, kFakeDeviceName, n);
    name[n] = '\0';
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuDeviceGetAttribute(int* value, int attribute, CUdevice dev) {
  return entry("cuDeviceGetAttribute", [&](FakeDevice&) {
    if (value == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute: null output");
    if (CUresult r = check_device(dev, "cuDeviceGetAttribute")) return r;
    switch (attribute) {
      case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = kFakeMultiprocessors; return CUDA_SUCCESS;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = kFakeSmMajor; return CUDA_SUCCESS;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = kFakeSmMinor; return CUDA_SUCCESS;
      default:
        return fail(CUDA_ERROR_INVALID_VALUE,
                    fmt::format("cuDeviceGetAttribute: attribute {} is not faked", attribute));
    }
  });
}

CUresult fake_cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  return entry("cuDeviceTotalMem", [&](FakeDevice&) {
    if (bytes == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem: null output");
    if (CUresult r = check_device(dev, "cuDeviceTotalMem")) return r;
    *bytes = kFakeTotalMemory;
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  return entry("cuDevicePrimaryCtxRetain", [&](FakeDevice&) {
    if (ctx == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain: null output");
    if (CUresult r = check_device(dev, "cuDevicePrimaryCtxRetain")) return r;
    *ctx = kPrimaryContext;
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuCtxSetCurrent(CUcontext ctx) {
  return entry("cuCtxSetCurrent", [&](FakeDevice&) {
    if (ctx != nullptr && ctx != kPrimaryContext)
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuCtxSetCurrent: unknown context");
    current_context = ctx;
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuCtxSynchronize() {
  return entry("cuCtxSynchronize", [&](FakeDevice&) { return CUDA_SUCCESS; });  // launches run synchronously
}

CUresult fake_cuMemAlloc(CUdeviceptr* ptr, size_t bytes) {
  return entry("cuMemAlloc", [&](FakeDevice& d) {
    if (ptr == nullptr || bytes == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc: null output or zero bytes");
    if (bytes > kFakeTotalMemory - std::min(kFakeTotalMemory, d.memory.live_bytes()))
      return fail(CUDA_ERROR_OUT_OF_MEMORY, fmt::format("cuMemAlloc: {} bytes do not fit: {} of {} in use", bytes,
                                                        d.memory.live_bytes(), kFakeTotalMemory));
    *ptr = d.memory.alloc(bytes);
    d.freed.erase(*ptr);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuMemFree(CUdeviceptr ptr) {
  return entry("cuMemFree", [&](FakeDevice& d) {
    if (d.freed.count(ptr)) return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("cuMemFree: double free of {:#x}", ptr));
    d.memory.free(ptr);
    d.freed.insert(ptr);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  return entry("cuMemcpyHtoD", [&](FakeDevice& d) {
    if (bytes == 0) return CUDA_SUCCESS;
    if (src == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD: null host source");
    d.memory.write(dst, src, bytes);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  return entry("cuMemcpyDtoH", [&](FakeDevice& d) {
    if (bytes == 0) return CUDA_SUCCESS;
    if (dst == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoH: null host destination");
    d.memory.read(src, dst, bytes);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return entry("cuMemcpyDtoD", [&](FakeDevice& d) {
    if (bytes == 0) return CUDA_SUCCESS;
    const std::byte* from = d.memory.at(src, bytes);
    std::memmove(d.memory.at(dst, bytes), from, bytes);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t bytes) {
  return entry("cuMemsetD8", [&](FakeDevice& d) {
    if (bytes == 0) return CUDA_SUCCESS;
    std::memset(d.memory.at(dst, bytes), value, bytes);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned num_options, CUjit_option* options,
                                 void** values) {
  return entry("cuModuleLoadDataEx", [&](FakeDevice& d) {
    if (module == nullptr || image == nullptr)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadDataEx: null argument");
    const std::string_view text(static_cast<const char*>(image));  // PTX and fake cubins end with a NUL
    std::shared_ptr<const Observed> kernel;
    if (text.starts_with(kFakeCubinMagic)) {
      auto it = d.observed.find(std::string(text.substr(kFakeCubinMagic.size())));
      if (it == d.observed.end())
        return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadDataEx: a fake cubin of PTX this process never observed");
      kernel = it->second;
    } else {
      const JitLogs logs = parse_jit_options(num_options, options, values);
      if (CUresult r = compile_ptx(d, std::string(text), "cuModuleLoadDataEx", logs.error, &kernel)) return r;
    }
    const uintptr_t h = d.new_handle();
    d.modules[h] = Module{kernel, 0};
    *module = to_handle<CUmodule>(h);
    ++d.modules_loaded;
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuModuleGetFunction(CUfunction* fn, CUmodule module, const char* name) {
  return entry("cuModuleGetFunction", [&](FakeDevice& d) {
    auto it = d.modules.find(from_handle(module));
    if (it == d.modules.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction: unknown module");
    if (fn == nullptr || name == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction: null argument");
    Module& m = it->second;
    if (m.kernel->kernel.name != name)
      return fail(CUDA_ERROR_NOT_FOUND, fmt::format("cuModuleGetFunction: no kernel '{}' in the module (it holds '{}')",
                                                    name, m.kernel->kernel.name));
    if (m.function == 0) {
      m.function = d.new_handle();
      d.functions[m.function] = Function{it->first, m.kernel};
    }
    *fn = to_handle<CUfunction>(m.function);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuModuleUnload(CUmodule module) {
  return entry("cuModuleUnload", [&](FakeDevice& d) {
    auto it = d.modules.find(from_handle(module));
    if (it == d.modules.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload: unknown module");
    d.functions.erase(it->second.function);
    d.modules.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuLinkCreate(unsigned num_options, CUjit_option* options, void** values, CUlinkState* state) {
  return entry("cuLinkCreate", [&](FakeDevice& d) {
    if (state == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuLinkCreate: null output");
    const uintptr_t h = d.new_handle();
    d.links[h].logs = parse_jit_options(num_options, options, values);
    *state = to_handle<CUlinkState>(h);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuLinkAddData(CUlinkState state, int type, void* data, size_t size, const char*, unsigned, CUjit_option*,
                            void**) {
  return entry("cuLinkAddData", [&](FakeDevice& d) {
    auto it = d.links.find(from_handle(state));
    if (it == d.links.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLinkAddData: unknown link state");
    Link& link = it->second;
    if (type != CU_JIT_INPUT_PTX)
      return fail(CUDA_ERROR_INVALID_VALUE,
                  fmt::format("cuLinkAddData: input type {}: the fake driver links PTX only", type));
    if (data == nullptr || size == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuLinkAddData: no data");
    if (link.kernel)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuLinkAddData: the fake driver links one PTX input per link");
    const char* text = static_cast<const char*>(data);
    std::string ptx(text, strnlen(text, size));
    if (CUresult r = compile_ptx(d, ptx, "cuLinkAddData", link.logs.error, &link.kernel)) return r;
    link.ptx = std::move(ptx);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuLinkComplete(CUlinkState state, void** cubin, size_t* size) {
  return entry("cuLinkComplete", [&](FakeDevice& d) {
    auto it = d.links.find(from_handle(state));
    if (it == d.links.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLinkComplete: unknown link state");
    if (cubin == nullptr || size == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuLinkComplete: null output");
    Link& link = it->second;
    if (!link.kernel) return fail(CUDA_ERROR_INVALID_VALUE, "cuLinkComplete: nothing was added to the link");
    link.image = std::string(kFakeCubinMagic) + link.ptx;
    link.image.push_back('\0');
    link.logs.info.write(fmt::format("fake cubin of kernel '{}'", link.kernel->kernel.name));
    *cubin = link.image.data();
    *size = link.image.size();
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuLinkDestroy(CUlinkState state) {
  return entry("cuLinkDestroy", [&](FakeDevice& d) {
    if (d.links.erase(from_handle(state)) == 0)
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuLinkDestroy: unknown link state");
    return CUDA_SUCCESS;
  });
}

// The parameter values of a launch, from `extra`'s packed buffer, each parameter at its natural
// alignment (the CUDA ABI); checks the buffer's size and alignment against the kernel's parameters.
CUresult unpack_params(const kir::Kernel& k, void** extra, const std::string& who, std::vector<uint64_t>* values) {
  const std::byte* buffer = nullptr;
  const size_t* size = nullptr;
  for (size_t i = 0; extra != nullptr && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      buffer = static_cast<const std::byte*>(extra[i + 1]);
    } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
      size = static_cast<const size_t*>(extra[i + 1]);
    } else {
      return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("{}: unknown key {} in `extra`", who, extra[i]));
    }
  }
  std::vector<size_t> offsets;
  std::string layout;
  size_t packed = 0;
  for (const kir::Param& p : k.params) {
    const size_t bytes = static_cast<size_t>(kir::type_bytes(p.type));
    offsets.push_back((packed + bytes - 1) / bytes * bytes);
    packed = offsets.back() + bytes;
    layout += fmt::format("{}{} {} at {}", layout.empty() ? "" : ", ", kir::type_name(p.type), p.name, offsets.back());
  }
  if (k.params.empty() && buffer == nullptr && size == nullptr) return CUDA_SUCCESS;
  if (buffer == nullptr || size == nullptr)
    return fail(CUDA_ERROR_INVALID_VALUE, who + ": `extra` lacks the parameter buffer or its size");
  if (*size != packed)
    return fail(CUDA_ERROR_INVALID_VALUE,
                fmt::format("{}: the parameter buffer holds {} bytes, the parameters pack to {} ({})", who, *size,
                            packed, layout));
  if (reinterpret_cast<uintptr_t>(buffer) % kParamBufferAlignment != 0)
    return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("{}: the parameter buffer at {} is not {}-byte aligned", who,
                                                      static_cast<const void*>(buffer), kParamBufferAlignment));
  for (size_t i = 0; i < k.params.size(); ++i) {
    uint64_t v = 0;  // little-endian: a narrower parameter fills the low bytes
    std::memcpy(&v, buffer + offsets[i], static_cast<size_t>(kir::type_bytes(k.params[i].type)));
    values->push_back(v);
  }
  return CUDA_SUCCESS;
}

// Checks and runs one kernel launch; the caller holds the device's lock.
CUresult launch_locked(FakeDevice& d, CUfunction fn, sim::Dim3 grid, sim::Dim3 block, unsigned shared_bytes,
                       void** params, void** extra, const std::string& api) {
  auto it = d.functions.find(from_handle(fn));
  if (it == d.functions.end()) return fail(CUDA_ERROR_INVALID_HANDLE, api + ": unknown function");
  const Observed& kernel = *it->second.kernel;
  const kir::Kernel& k = kernel.kernel;
  const std::string who = api + " of '" + k.name + "'";
  if (params != nullptr)
    return fail(CUDA_ERROR_INVALID_VALUE, who + ": kernelParams given; kiln packs parameters into `extra`");
  const std::string dims =
      fmt::format("grid {}x{}x{}, block {}x{}x{}", grid.x, grid.y, grid.z, block.x, block.y, block.z);
  if (grid.count() == 0 || block.count() == 0)
    return fail(CUDA_ERROR_INVALID_VALUE, who + ": a zero dimension: " + dims);
  if (block.count() > kMaxBlockThreads || block.z > 64 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu)
    return fail(CUDA_ERROR_INVALID_VALUE, who + ": dimensions over the device's limits: " + dims);
  // Static arrays, and what the launch passes as dynamic shared memory: as the driver, refuse
  // more than the function's limit (raised with cuFuncSetAttribute above the static 48 KiB);
  // stricter than it, refuse less than the kernel's carved arrays need (a GPU would read past
  // the allocation).
  const int64_t static_bytes = k.static_shared_bytes();
  const int64_t dynamic_limit =
      it->second.max_dynamic_shared >= 0 ? it->second.max_dynamic_shared : kir::kStaticSharedLimit - static_bytes;
  if (static_bytes + shared_bytes > kir::max_shared_bytes(k) || shared_bytes > dynamic_limit)
    return fail(CUDA_ERROR_INVALID_VALUE,
                fmt::format("{}: {} bytes of dynamic shared memory, over the function's limit of {} (raise it with "
                            "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                            who, shared_bytes, dynamic_limit));
  if (static_cast<int64_t>(shared_bytes) < k.dynamic_shared_bytes())
    return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("{}: {} bytes of dynamic shared memory given, the kernel's "
                                                      "arrays take {}",
                                                      who, shared_bytes, k.dynamic_shared_bytes()));
  std::vector<uint64_t> values;
  if (CUresult r = unpack_params(k, extra, who, &values)) return r;
  try {
    sim::SimOptions options;
    options.count_bank_conflicts = d.count_bank_conflicts;
    const sim::SimStats stats = sim::simulate(*kernel.prepared, grid, block, values, d.memory, options);
    if (d.count_bank_conflicts) {
      FakeKernelStats& s = d.kernel_stats[k.name];
      ++s.launches;
      s.shared_requests += stats.shared_requests;
      s.shared_wavefronts += stats.shared_wavefronts;
      s.bank_conflicts += stats.bank_conflicts;
      s.instructions += stats.instructions;
    }
  } catch (const Error& e) {
    d.sticky = CUDA_ERROR_LAUNCH_FAILED;
    d.sticky_message = "the context was lost when kernel '" + k.name + "' faulted: " + e.what();
    return fail(CUDA_ERROR_LAUNCH_FAILED, api + ": " + std::string(e.what()));
  }
  ++d.launches;
  return CUDA_SUCCESS;
}

CUresult fake_cuLaunchKernel(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shared_bytes, CUstream stream, void** params, void** extra) {
  return entry("cuLaunchKernel", [&](FakeDevice& d) {
    if (stream != nullptr)
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: unknown stream (the fake has the default one)");
    return launch_locked(d, fn, {gx, gy, gz}, {bx, by, bz}, shared_bytes, params, extra, "cuLaunchKernel");
  });
}

// Graphs. The fake runs a graph's nodes one after another in the order they were added, so it
// accepts only chains: each node depends on exactly the node added before it (the order a real
// driver must keep too; without the dependencies it may run nodes at once).
CUresult fake_cuGraphCreate(CUgraph* graph, unsigned flags) {
  return entry("cuGraphCreate", [&](FakeDevice& d) {
    if (graph == nullptr || flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphCreate: null output or flags");
    uintptr_t h = d.new_handle();
    d.graphs[h] = {};
    *graph = to_handle<CUgraph>(h);
    return CUDA_SUCCESS;
  });
}

// Appends `node` to `graph` after checking that it depends on the graph's last node alone.
CUresult add_node(FakeDevice& d, CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t num_deps,
                  GraphNode node, const char* api) {
  auto it = d.graphs.find(from_handle(graph));
  if (it == d.graphs.end()) return fail(CUDA_ERROR_INVALID_HANDLE, std::string(api) + ": unknown graph");
  std::vector<GraphNode>& nodes = it->second;
  const bool chained =
      nodes.empty() ? num_deps == 0 : num_deps == 1 && deps != nullptr && from_handle(deps[0]) == nodes.back().handle;
  if (!chained)
    return fail(CUDA_ERROR_INVALID_VALUE,
                fmt::format("{}: node {} must depend on exactly the node added before it (the fake runs chains)", api,
                            nodes.size()));
  if (out == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, std::string(api) + ": null output");
  node.handle = d.new_handle();
  *out = to_handle<CUgraphNode>(node.handle);
  nodes.push_back(std::move(node));
  return CUDA_SUCCESS;
}

CUresult fake_cuGraphAddKernelNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t num_deps,
                                   const CudaKernelNodeParams* p) {
  return entry("cuGraphAddKernelNode", [&](FakeDevice& d) {
    if (p == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphAddKernelNode: null parameters");
    if (p->func == nullptr || !d.functions.count(from_handle(p->func)))
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphAddKernelNode: unknown function");
    if (p->kernelParams != nullptr)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphAddKernelNode: kernelParams given; kiln packs them into `extra`");
    GraphNode node;
    node.fn = p->func;
    node.grid = {p->gridDimX, p->gridDimY, p->gridDimZ};
    node.block = {p->blockDimX, p->blockDimY, p->blockDimZ};
    node.shared_bytes = p->sharedMemBytes;
    // The parameters are copied when the node is made, as the driver does (checked at launch).
    const void* buffer = nullptr;
    for (size_t i = 0; p->extra != nullptr && p->extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (p->extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = p->extra[i + 1];
      if (p->extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) node.param_size = *static_cast<const size_t*>(p->extra[i + 1]);
    }
    node.has_params = buffer != nullptr;
    if (buffer) {
      node.params.resize((node.param_size + 7) / 8);
      std::memcpy(node.params.data(), buffer, node.param_size);
    }
    return add_node(d, out, graph, deps, num_deps, std::move(node), "cuGraphAddKernelNode");
  });
}

CUresult fake_cuGraphAddMemsetNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t num_deps,
                                   const CudaMemsetNodeParams* p, CUcontext ctx) {
  return entry("cuGraphAddMemsetNode", [&](FakeDevice& d) {
    if (p == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphAddMemsetNode: null parameters");
    if (ctx != kPrimaryContext) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphAddMemsetNode: unknown context");
    if (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4)
      return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("cuGraphAddMemsetNode: element size {}", p->elementSize));
    if (p->height != 1) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphAddMemsetNode: the fake sets one row");
    if (p->value != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphAddMemsetNode: the fake sets zeros only");
    GraphNode node;
    node.memset_dst = p->dst;
    node.memset_bytes = p->width * p->elementSize;
    d.memory.at(node.memset_dst, node.memset_bytes);  // checked now: inside one allocation
    return add_node(d, out, graph, deps, num_deps, std::move(node), "cuGraphAddMemsetNode");
  });
}

CUresult fake_cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  return entry("cuGraphInstantiateWithFlags", [&](FakeDevice& d) {
    auto it = d.graphs.find(from_handle(graph));
    if (it == d.graphs.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphInstantiateWithFlags: unknown graph");
    if (exec == nullptr || flags != 0)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiateWithFlags: null output or flags");
    uintptr_t h = d.new_handle();
    d.graph_execs[h] = it->second;  // a snapshot: later changes to the graph do not reach it
    *exec = to_handle<CUgraphExec>(h);
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return entry("cuGraphLaunch", [&](FakeDevice& d) {
    auto it = d.graph_execs.find(from_handle(exec));
    if (it == d.graph_execs.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphLaunch: unknown executable graph");
    if (stream != nullptr) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphLaunch: unknown stream");
    const std::vector<GraphNode>& nodes = it->second;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const GraphNode& n = nodes[i];
      if (!n.fn) {
        std::memset(d.memory.at(n.memset_dst, n.memset_bytes), 0, n.memset_bytes);
        continue;
      }
      size_t size = n.param_size;
      void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<uint64_t*>(n.params.data()),
                       CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
      if (CUresult r = launch_locked(d, n.fn, n.grid, n.block, n.shared_bytes, nullptr, n.has_params ? extra : nullptr,
                                     fmt::format("cuGraphLaunch (node {})", i)))
        return r;
    }
    ++d.graph_launches;
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuGraphExecDestroy(CUgraphExec exec) {
  return entry("cuGraphExecDestroy", [&](FakeDevice& d) {
    if (!d.graph_execs.erase(from_handle(exec)))
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphExecDestroy: unknown executable graph");
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuGraphDestroy(CUgraph graph) {
  return entry("cuGraphDestroy", [&](FakeDevice& d) {
    if (!d.graphs.erase(from_handle(graph))) return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphDestroy: unknown graph");
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuFuncGetAttribute(int* value, int attribute, CUfunction fn) {
  return entry("cuFuncGetAttribute", [&](FakeDevice& d) {
    auto it = d.functions.find(from_handle(fn));
    if (it == d.functions.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuFuncGetAttribute: unknown function");
    if (value == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuFuncGetAttribute: null output");
    const kir::Kernel& k = it->second.kernel->kernel;
    switch (attribute) {
      case CU_FUNC_ATTRIBUTE_NUM_REGS:
        *value = 0;
        for (int n : k.num_regs) *value += n;
        return CUDA_SUCCESS;
      case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *value = 0; return CUDA_SUCCESS;
      default:
        return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("cuFuncGetAttribute: attribute {} is not faked", attribute));
    }
  });
}

CUresult fake_cuFuncSetAttribute(CUfunction fn, int attribute, int value) {
  return entry("cuFuncSetAttribute", [&](FakeDevice& d) {
    auto it = d.functions.find(from_handle(fn));
    if (it == d.functions.end()) return fail(CUDA_ERROR_INVALID_HANDLE, "cuFuncSetAttribute: unknown function");
    if (attribute != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
      return fail(CUDA_ERROR_INVALID_VALUE, fmt::format("cuFuncSetAttribute: attribute {} is not faked", attribute));
    const kir::Kernel& k = it->second.kernel->kernel;
    const int64_t static_bytes = k.static_shared_bytes();
    if (value < 0 || static_bytes + value > kir::max_shared_bytes(k))
      return fail(CUDA_ERROR_INVALID_VALUE,
                  fmt::format("cuFuncSetAttribute of '{}': {} bytes of dynamic shared memory with {} static, over "
                              "the {} a block may use",
                              k.name, value, static_bytes, kir::max_shared_bytes(k)));
    it->second.max_dynamic_shared = value;
    return CUDA_SUCCESS;
  });
}

CUresult fake_cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = cu_error_name(error);
  return *text == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

void observe_kernel(const std::string& ptx, const kir::Kernel& kernel) {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.observed.count(ptx)) return;  // one-to-one printing: the same text is the same kernel
  auto observed = std::make_shared<Observed>();
  observed->kernel = kernel;
  observed->prepared = sim::prepare(observed->kernel);
  d.observed.emplace(ptx, std::move(observed));
}

// Checks the arguments as the real driver documents them and writes the fields into the map in
// the simulator's layout (cuda/sim/tensor_map.hpp). Modelled: the data types kiln copies, element
// strides of 1, no interleave, no swizzle or the 128-byte one, zeros outside the tensor.
CUresult fake_cuTensorMapEncodeTiled(CUtensorMap* map, int data_type, uint32_t rank, void* address,
                                     const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                                     const uint32_t* element_strides, int interleave, int swizzle, int l2_promotion,
                                     int oob_fill) {
  return entry("cuTensorMapEncodeTiled", [&](FakeDevice&) {
    auto bad = [](const std::string& why) { return fail(CUDA_ERROR_INVALID_VALUE, "cuTensorMapEncodeTiled: " + why); };
    if (map == nullptr || reinterpret_cast<uintptr_t>(map) % sim::kTensorMapAlign)
      return bad("the map must be 64-byte aligned host memory");
    if (rank < 1 || rank > sim::kTensorMapMaxRank) return bad(fmt::format("rank {} (1 to 5)", rank));
    if (dims == nullptr || box == nullptr || element_strides == nullptr || (rank > 1 && strides == nullptr))
      return bad("null dimension, stride, box or element-stride array");
    sim::TensorMap m;
    switch (data_type) {
      case CU_TENSOR_MAP_DATA_TYPE_UINT8: m.element_bytes = 1; break;
      case CU_TENSOR_MAP_DATA_TYPE_UINT16:
      case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
      case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: m.element_bytes = 2; break;
      case CU_TENSOR_MAP_DATA_TYPE_UINT32:
      case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: m.element_bytes = 4; break;
      default: return bad(fmt::format("data type {} (the fake models uint8/16/32, f16, bf16 and f32)", data_type));
    }
    if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || oob_fill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
      return bad("the fake models no interleave and zeros outside the tensor only");
    if (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && swizzle != CU_TENSOR_MAP_SWIZZLE_128B)
      return bad(fmt::format("swizzle {} (the fake models none and 128 bytes)", swizzle));
    if (l2_promotion < CU_TENSOR_MAP_L2_PROMOTION_NONE || l2_promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B)
      return bad(fmt::format("L2 promotion {}", l2_promotion));
    m.address = reinterpret_cast<uint64_t>(address);
    m.rank = rank;
    m.swizzle = swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? sim::TensorSwizzle::b128 : sim::TensorSwizzle::none;
    m.strides[0] = m.element_bytes;
    for (uint32_t d = 0; d < rank; ++d) {
      m.dims[d] = dims[d];
      m.box[d] = box[d];
      if (d > 0) m.strides[d] = strides[d - 1];
      if (element_strides[d] < 1 || element_strides[d] > 8)
        return bad(fmt::format("element stride {} in dimension {} (1 to 8)", element_strides[d], d));
      if (d > 0 && element_strides[d] != 1) return bad("the fake models element strides of 1 only");
    }
    if (const std::string why = sim::tensor_map_problem(m); !why.empty()) return bad(why);
    const auto bytes = sim::encode_tensor_map(m);
    std::memcpy(map->opaque, bytes.data(), bytes.size());
    return CUDA_SUCCESS;
  });
}

}  // namespace

Driver fake_driver() {
  Driver d;
  d.api =
      DriverApi{fake_cuInit, fake_cuDriverGetVersion, fake_cuDeviceGetCount, fake_cuDeviceGet, fake_cuDeviceGetName,
                fake_cuDeviceGetAttribute, fake_cuDeviceTotalMem, fake_cuDevicePrimaryCtxRetain, fake_cuCtxSetCurrent,
                fake_cuCtxSynchronize, fake_cuMemAlloc, fake_cuMemFree, fake_cuMemcpyHtoD, fake_cuMemcpyDtoH,
                fake_cuMemcpyDtoD, fake_cuMemsetD8, fake_cuModuleLoadDataEx, fake_cuModuleGetFunction,
                fake_cuModuleUnload, fake_cuLinkCreate, fake_cuLinkAddData, fake_cuLinkComplete, fake_cuLinkDestroy,
                fake_cuLaunchKernel, fake_cuFuncGetAttribute, fake_cuFuncSetAttribute, fake_cuGetErrorString,
                fake_cuGraphCreate, fake_cuGraphAddKernelNode, fake_cuGraphAddMemsetNode,
                fake_cuGraphInstantiateWithFlags, fake_cuGraphLaunch, fake_cuGraphExecDestroy, fake_cuGraphDestroy,
                // No stream capture: its work finishes inside each call, and collectives
                // run between graph replays (cuda/runtime/collective.hpp).
                nullptr, nullptr, nullptr, nullptr, nullptr, fake_cuTensorMapEncodeTiled};
  d.description = "kiln fake driver (SIMT simulator)";
  d.observe_kernel = observe_kernel;
  d.fake = true;
  return d;
}

FakeDeviceState fake_device_state() {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  return FakeDeviceState{&d.memory, d.launches, d.modules_loaded, d.jit_compiles, d.graph_launches};
}

void fake_driver_fail_next_jit(std::string log) {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  d.fail_next_jit = std::move(log);
}

void fake_driver_count_bank_conflicts(bool on) {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  d.count_bank_conflicts = on;
  if (on) d.kernel_stats.clear();
}

std::map<std::string, FakeKernelStats> fake_driver_kernel_stats() {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.kernel_stats;
}

void fake_driver_recover() {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  d.sticky = CUDA_SUCCESS;
  d.sticky_message.clear();
}

std::string fake_driver_last_error() {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.last_error;
}

}  // namespace kiln::cuda
