// The fake driver: every DriverApi entry point implemented over one process-wide fake device
// whose memory is the simulator's DeviceMemory. Each call checks its arguments as the real driver
// would (and a little more), logs why it fails, and launched kernels run in the SIMT simulator.
// Kernel launches, graphs and tensor maps are in fake_driver_launch.cpp; the fake device and
// entry() shared with it in fake_driver_state.hpp.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/driver/fake_driver_state.hpp>
#include <kiln/cuda/kir/kir.hpp>

namespace kiln::cuda {

using namespace fake;  // the shared device, entry() and the launch entry points (fake_driver_state.hpp)

namespace {

constexpr int kFakeDriverVersion = 12080;
constexpr int kFakeSmMajor = 9, kFakeSmMinor = 0;
constexpr int kFakeMultiprocessors = 8;
constexpr char kFakeDeviceName[] = "kiln fake device (SIMT simulator)";
constexpr size_t kFakeTotalMemory = size_t{8} << 30;  // host memory backs it: keep it modest
constexpr std::string_view kFakeCubinMagic = "KILNFAKECUBIN\n";

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

void fake_driver_sample_blocks(uint64_t blocks) {
  FakeDevice& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (blocks && !d.sample_blocks && !d.count_bank_conflicts) d.kernel_stats.clear();
  d.sample_blocks = blocks;
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
