// The CUDA runtime over a Driver table: device and context setup, the caching memory arena, the
// module cache (memory, then cubins on disk written atomically and checked on read, then the
// driver's PTX JIT), and launches with parameters packed into one buffer.
#include <fcntl.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/hash.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/runtime/collective.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

namespace kiln::cuda {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMinBlockBytes = 256;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kJitLogBytes = 16384;
constexpr std::string_view kCacheMagic = "KILNCUBIN1";
// A cache file: the magic, then key, payload length and payload checksum (u64, host order), then the payload.
constexpr size_t kCacheHeaderBytes = kCacheMagic.size() + 3 * sizeof(uint64_t);

size_t size_class(size_t bytes) {
  const size_t b = std::max(bytes, kMinBlockBytes);
  return b <= kMiB ? std::bit_ceil(b) : (b + kMiB - 1) / kMiB * kMiB;
}

std::string default_cache_dir() {
  if (std::string dir = settings().cache_dir; !dir.empty()) return dir;
  spdlog::warn("neither KILN_CACHE_DIR, XDG_CACHE_HOME nor HOME is set: the module disk cache is off");
  return "off";
}

// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename.
// Creates the directory first. Returns false with the reason in *why.
bool write_file_atomic(const fs::path& path, std::string_view bytes, std::string* why) {
  static std::atomic<uint64_t> counter{0};
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    *why = "cannot create " + path.parent_path().string() + ": " + ec.message();
    return false;
  }
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path.string(), ::getpid(), counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == bytes.size() && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    *why = "cannot write " + path.string() + ": " + std::strerror(ok ? errno : saved_errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

void append_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

uint64_t read_u64(const std::string& in, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

std::string encode_cache_entry(uint64_t key, const std::string& image) {
  std::string out(kCacheMagic);
  append_u64(out, key);
  append_u64(out, image.size());
  append_u64(out, fnv1a64(image));
  return out + image;
}

// The image cached at `path`: nullopt when there is none (*corrupt empty) or the entry is corrupt
// (*corrupt says how).
std::optional<std::string> read_cache_entry(const std::string& path, uint64_t key, std::string* corrupt) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  if (file.size() < kCacheHeaderBytes) {
    *corrupt = fmt::format("{} bytes, shorter than the header", file.size());
  } else if (std::string_view(file).substr(0, kCacheMagic.size()) != kCacheMagic) {
    *corrupt = "wrong magic";
  } else if (read_u64(file, kCacheMagic.size()) != key) {
    *corrupt = fmt::format("key {:016x}, expected {:016x}", read_u64(file, kCacheMagic.size()), key);
  } else if (const uint64_t length = read_u64(file, kCacheMagic.size() + 8);
             length != file.size() - kCacheHeaderBytes) {
    *corrupt = fmt::format("payload of {} bytes, the header says {}", file.size() - kCacheHeaderBytes, length);
  } else if (std::string payload = file.substr(kCacheHeaderBytes);
             fnv1a64(payload) != read_u64(file, kCacheMagic.size() + 16)) {
    *corrupt = "payload checksum mismatch";
  } else {
    return payload;
  }
  return std::nullopt;
}

std::string dims(Dim3 d) { return fmt::format("{}x{}x{}", d.x, d.y, d.z); }

}  // namespace

namespace {

// KILN_CUDA_DEVICE, else the process's rank among those a launcher started on this machine (one
// GPU per rank under `mpirun -np <GPUs>`), else 0.
int device_ordinal(int count) {
  const Settings s = settings();
  const int chosen = s.cuda_device;
  if (chosen >= count)
    throw Error(fmt::format("KILN_CUDA_DEVICE={}: this machine has {} CUDA device(s)", chosen, count));
  if (chosen >= 0) return chosen;
  return s.launcher_local_rank >= 0 ? s.launcher_local_rank % count : 0;
}

}  // namespace

Runtime::Runtime(Driver driver, RuntimeOptions options) : driver_(std::move(driver)), options_(std::move(options)) {
  if (options_.cache_dir.empty()) options_.cache_dir = default_cache_dir();
  if (options_.ptx_dump_dir.empty()) options_.ptx_dump_dir = settings().ptx_dump_dir;
  const DriverApi& a = driver_.api;
  check(a.cuInit(0), "cuInit");
  int count = 0;
  check(a.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (count == 0) throw Error("no CUDA device (" + driver_.description + " reports none)");
  const int ordinal = device_ordinal(count);
  check(a.cuDeviceGet(&device_, ordinal), fmt::format("cuDeviceGet({})", ordinal));
  char name[256] = {};
  check(a.cuDeviceGetName(name, sizeof name, device_), "cuDeviceGetName");
  device_name_ = name;
  int major = 0, minor = 0;
  check(a.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_), "compute capability");
  check(a.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_), "compute capability");
  sm_ = 10 * major + minor;
  check(a.cuDriverGetVersion(&driver_version_), "cuDriverGetVersion");
  size_t total = 0;
  check(a.cuDeviceTotalMem(&total, device_), "cuDeviceTotalMem");
  check(a.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
  check(a.cuCtxSetCurrent(context_), "cuCtxSetCurrent");
  spdlog::info("CUDA device 0: {}, sm_{}, driver {}.{}, {:.1f} GiB", device_name_, sm_, driver_version_ / 1000,
               driver_version_ % 1000 / 10, static_cast<double>(total) / static_cast<double>(size_t{1} << 30));
}

Runtime::~Runtime() {
  // Results are ignored: a destructor cannot report them, and the fake driver logs its own. A
  // lost context has nothing left to free.
  if (lost()) return;
  driver_.api.cuCtxSetCurrent(context_);
  for (const auto& [ptx, m] : modules_) driver_.api.cuModuleUnload(m.module);
  for (const auto& [cls, ptr] : free_blocks_) driver_.api.cuMemFree(ptr);
  for (const auto& [ptr, cls] : live_blocks_) driver_.api.cuMemFree(ptr);
}

Runtime* Runtime::system(std::string* why) {
  static std::string reason;
  // Created once and never destroyed: at exit the driver may be torn down before static destructors run.
  static Runtime* runtime = []() -> Runtime* {
    std::optional<Driver> driver = load_cuda_driver(&reason);
    if (!driver) return nullptr;
    try {
      auto rt = std::make_unique<Runtime>(std::move(*driver));
      rt->ptx_target();
      return rt.release();
    } catch (const std::exception& e) {
      reason = e.what();
      return nullptr;
    }
  }();
  if (runtime == nullptr && why != nullptr) *why = reason;
  return runtime;
}

int Runtime::ptx_target() const {
  if (sm_ >= 90) return 90;
  if (sm_ >= 80) return 80;
  throw Error(fmt::format("{} is sm_{}; kiln's PTX needs sm_80 or newer", device_name_, sm_));
}

std::string Runtime::error_text(CUresult r) const {
  const char* name = cu_error_name(r);
  std::string s = name ? name : "CUresult " + std::to_string(r);
  const char* text = nullptr;
  if (driver_.api.cuGetErrorString(r, &text) == CUDA_SUCCESS && text != nullptr && s != text)
    s += fmt::format(" ({})", text);
  if (driver_.fake) {
    if (const std::string message = fake_driver_last_error(); !message.empty()) s += ": " + message;
  }
  return s;
}

void Runtime::check(CUresult r, const std::string& what) const {
  if (r == CUDA_SUCCESS) return;
  std::string message = what + " failed: " + error_text(r);
  if (cu_error_is_sticky(r) && lost_.empty()) {
    lost_ = "the CUDA context is lost: a kernel faulted (" + message +
            "); no later GPU call can succeed in this process, which must restart (resume from the last checkpoint)";
    message = lost_;
  }
  throw Error(message);
}

CUtensorMap Runtime::encode_tensor_map(const std::string& what, CUdeviceptr address, uint32_t element_bytes,
                                       const std::vector<uint64_t>& dims, const std::vector<uint64_t>& strides,
                                       const std::vector<uint32_t>& box, bool swizzle_128) {
  enter();
  // Kernels with tensor copies print PTX 8.3 (the tensor-map fence), which a CUDA 12.3 driver
  // compiles first.
  if (!driver_.api.cuTensorMapEncodeTiled || driver_version_ < 12030)
    throw Error(fmt::format("{}: tensor copies need a CUDA 12.3 or later driver (this one: {}.{}{})", what,
                            driver_version_ / 1000, driver_version_ % 1000 / 10,
                            driver_.api.cuTensorMapEncodeTiled ? "" : ", without cuTensorMapEncodeTiled"));
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4)
    throw Error(fmt::format("{}: tensor maps of {}-byte elements are not supported", what, element_bytes));
  const int type = element_bytes == 1   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                   : element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                        : CU_TENSOR_MAP_DATA_TYPE_UINT32;
  const std::vector<uint32_t> ones(dims.size(), 1);
  auto list = [](const auto& values) {
    std::string s;
    for (const auto& v : values) s += (s.empty() ? "" : ", ") + std::to_string(v);
    return s;
  };
  CUtensorMap map{};
  check(driver_.api.cuTensorMapEncodeTiled(&map, type, static_cast<uint32_t>(dims.size()),
                                           reinterpret_cast<void*>(static_cast<uintptr_t>(address)), dims.data(),
                                           strides.data(), box.data(), ones.data(), CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           swizzle_128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        fmt::format("{}: cuTensorMapEncodeTiled (address {:#x}, dims [{}], strides [{}], box [{}])", what, address,
                    list(dims), list(strides), list(box)));
  ++stats_.tensor_maps_encoded;
  return map;
}

void Runtime::enter() const {
  if (!lost_.empty()) throw Error(lost_);
  thread_local CUcontext current = nullptr;  // what this thread last made current through a runtime
  if (current != context_) {
    check(driver_.api.cuCtxSetCurrent(context_), "cuCtxSetCurrent");
    current = context_;
  }
}

CUdeviceptr Runtime::alloc(size_t bytes) {
  enter();
  const size_t cls = options_.exact_block_sizes ? std::max<size_t>(bytes, 4) : size_class(bytes);
  CUdeviceptr ptr = 0;
  if (auto it = free_blocks_.find(cls); it != free_blocks_.end()) {
    ptr = it->second;
    free_blocks_.erase(it);
  } else {
    CUresult r = driver_.api.cuMemAlloc(&ptr, cls);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !free_blocks_.empty()) {
      release_free_blocks();
      r = driver_.api.cuMemAlloc(&ptr, cls);
    }
    check(r, fmt::format("cuMemAlloc of {} bytes ({} in use)", cls, stats_.bytes_in_use));
    ++stats_.device_allocations;
  }
  live_blocks_[ptr] = cls;
  stats_.bytes_in_use += cls;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return ptr;
}

void Runtime::free(CUdeviceptr ptr) {
  if (ptr == 0) return;
  auto it = live_blocks_.find(ptr);
  if (it == live_blocks_.end())
    throw Error(
        fmt::format("Runtime::free: {:#x} is not a live block of the arena (freed twice, or not from alloc)", ptr));
  free_blocks_.emplace(it->second, ptr);
  stats_.bytes_in_use -= it->second;
  live_blocks_.erase(it);
}

void Runtime::release_free_blocks() {
  enter();
  for (const auto& [cls, ptr] : free_blocks_) check(driver_.api.cuMemFree(ptr), fmt::format("cuMemFree of {:#x}", ptr));
  free_blocks_.clear();
}

void Runtime::upload(CUdeviceptr dst, const void* src, size_t bytes) {
  enter();
  if (bytes == 0) return;
  check(driver_.api.cuMemcpyHtoD(dst, src, bytes), fmt::format("upload of {} bytes to {:#x}", bytes, dst));
  stats_.bytes_uploaded += bytes;
  ++stats_.uploads;
}

void Runtime::download(void* dst, CUdeviceptr src, size_t bytes) {
  enter();
  if (bytes == 0) return;
  check(driver_.api.cuMemcpyDtoH(dst, src, bytes), fmt::format("download of {} bytes from {:#x}", bytes, src));
  stats_.bytes_downloaded += bytes;
  ++stats_.downloads;
}

void Runtime::copy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  enter();
  if (bytes == 0) return;
  check(driver_.api.cuMemcpyDtoD(dst, src, bytes),
        fmt::format("copy of {} bytes from {:#x} to {:#x}", bytes, src, dst));
}

void Runtime::memset_zero(CUdeviceptr dst, size_t bytes) {
  enter();
  if (bytes == 0) return;
  check(driver_.api.cuMemsetD8(dst, 0, bytes), fmt::format("zeroing {} bytes at {:#x}", bytes, dst));
}

std::string Runtime::cache_path(uint64_t key) const { return fmt::format("{}/{:016x}.cubin", options_.cache_dir, key); }

LoadedKernel Runtime::load(const kir::Kernel& k) {
  enter();
  if (kir::needs_sm90a(k) && sm_ != 90)
    throw Error(
        fmt::format("kernel '{}' uses wgmma, which only sm_90a (an H100 or H200) has; {} is sm_{} (lower it "
                    "with --matmul wgmma=off)",
                    k.name, device_name_, sm_));
  std::string ptx = kir::print_ptx(k, ptx_target());
  if (auto it = modules_.find(ptx); it != modules_.end()) {
    ++stats_.memory_cache_hits;
    return it->second.kernel;
  }
  if (driver_.observe_kernel) driver_.observe_kernel(ptx, k);
  if (!options_.ptx_dump_dir.empty()) {
    std::string why;
    if (!write_file_atomic(fs::path(options_.ptx_dump_dir) / (k.name + ".ptx"), ptx, &why))
      spdlog::warn("PTX dump of kernel '{}': {}", k.name, why);
  }
  // The disk-cache key: the whole text, then everything else that changes the compiled image.
  uint64_t key = fnv1a64(ptx);
  key = hash_combine(key, static_cast<uint64_t>(ptx_target()));
  key = hash_combine(key, static_cast<uint64_t>(sm_));  // a cubin is for the exact device arch
  key = hash_combine(key, static_cast<uint64_t>(driver_version_));
  key = hash_combine(key, static_cast<uint64_t>(kir::kPtxGeneratorVersion));
  key = hash_combine(key, driver_.fake ? 1 : 0);  // a fake cubin is no image for the real driver

  Module m;
  m.ir = std::make_unique<kir::Kernel>(k);
  m.module = load_module(k, ptx, key);
  CUfunction fn = nullptr;
  if (CUresult r = driver_.api.cuModuleGetFunction(&fn, m.module, k.name.c_str()); r != CUDA_SUCCESS) {
    driver_.api.cuModuleUnload(m.module);
    check(r, "cuModuleGetFunction of kernel '" + k.name + "'");
  }
  if (const int64_t dynamic = k.dynamic_shared_bytes(); dynamic > 0) {
    // Launches pass this much dynamic shared memory, over the static limit: the driver refuses
    // it until the function's own limit is raised.
    if (CUresult r = driver_.api.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    static_cast<int>(dynamic));
        r != CUDA_SUCCESS) {
      driver_.api.cuModuleUnload(m.module);
      check(r, fmt::format("raising the dynamic shared memory limit of kernel '{}' to {} bytes", k.name, dynamic));
    }
  }
  int registers = -1;
  if (driver_.api.cuFuncGetAttribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, fn) != CUDA_SUCCESS) registers = -1;
  m.kernel = LoadedKernel{fn, m.ir.get(), registers};
  spdlog::debug("loaded kernel '{}' for sm_{}: {} registers", k.name, ptx_target(), registers);
  return modules_.emplace(std::move(ptx), std::move(m)).first->second.kernel;
}

CUmodule Runtime::load_module(const kir::Kernel& k, const std::string& ptx, uint64_t key) {
  const bool disk = options_.cache_dir != "off";
  const std::string path = disk ? cache_path(key) : std::string();
  CUmodule module = nullptr;
  if (disk) {
    std::string corrupt;
    if (std::optional<std::string> image = read_cache_entry(path, key, &corrupt)) {
      const CUresult r = driver_.api.cuModuleLoadDataEx(&module, image->data(), 0, nullptr, nullptr);
      if (r == CUDA_SUCCESS) {
        ++stats_.disk_cache_hits;
        return module;
      }
      corrupt = "the driver rejects its image: " + error_text(r);
    }
    if (!corrupt.empty()) {
      spdlog::warn("module cache entry {} of kernel '{}' is corrupt ({}); compiling it again", path, k.name, corrupt);
      ++stats_.corrupt_cache_entries;
    }
  }
  const std::string image = jit_compile(k, ptx, key);
  ++stats_.modules_compiled;
  check(driver_.api.cuModuleLoadDataEx(&module, image.data(), 0, nullptr, nullptr),
        "loading the compiled module of kernel '" + k.name + "'");
  if (disk) write_cache(path, key, image);
  return module;
}

std::string Runtime::jit_compile(const kir::Kernel& k, const std::string& ptx, uint64_t key) {
  std::vector<char> error_log(kJitLogBytes, '\0'), info_log(kJitLogBytes, '\0');
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(uintptr_t{kJitLogBytes}), info_log.data(),
                    reinterpret_cast<void*>(uintptr_t{kJitLogBytes})};
  CUlinkState link = nullptr;
  check(driver_.api.cuLinkCreate(4, options, values, &link), "cuLinkCreate for kernel '" + k.name + "'");
  CUresult r = driver_.api.cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(ptx.c_str()), ptx.size() + 1,
                                         k.name.c_str(), 0, nullptr, nullptr);
  void* cubin = nullptr;
  size_t size = 0;
  if (r == CUDA_SUCCESS) r = driver_.api.cuLinkComplete(link, &cubin, &size);
  std::string image = r == CUDA_SUCCESS ? std::string(static_cast<const char*>(cubin), size) : std::string();
  driver_.api.cuLinkDestroy(link);  // the image was copied: the link owns `cubin`
  const std::string info(info_log.data(), strnlen(info_log.data(), kJitLogBytes));
  if (!info.empty()) spdlog::debug("JIT of kernel '{}': {}", k.name, info);
  if (r == CUDA_SUCCESS) return image;

  std::error_code ec;
  fs::path dir = fs::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  const fs::path file = dir / fmt::format("kiln-failed-{}-{:016x}.ptx", k.name, key);
  std::string why;
  const std::string where =
      write_file_atomic(file, ptx, &why) ? "PTX written to " + file.string() : "the PTX could not be written: " + why;
  const std::string log(error_log.data(), strnlen(error_log.data(), kJitLogBytes));
  throw Error(fmt::format("JIT compilation of kernel '{}' for sm_{} failed: {}\ndriver error log:\n{}\n{}", k.name,
                          ptx_target(), error_text(r), log.empty() ? "(empty)" : log, where));
}

void Runtime::write_cache(const std::string& path, uint64_t key, const std::string& image) {
  std::string why;
  if (write_file_atomic(path, encode_cache_entry(key, image), &why)) return;
  if (!cache_write_warned_)
    spdlog::warn("module disk cache {} is not writable ({}): kernels will be compiled again next run",
                 options_.cache_dir, why);
  cache_write_warned_ = true;
}

void Runtime::launch(const LoadedKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& args) {
  enter();
  const kir::Kernel& kernel = *k.kernel;
  const std::string what =
      fmt::format("launch of kernel '{}' (grid {}, block {})", kernel.name, dims(grid), dims(block));
  std::vector<uint64_t> words;
  size_t size = pack_params(kernel, args, words, what);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, words.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  check(driver_.api.cuLaunchKernel(k.fn, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                   static_cast<unsigned>(kernel.dynamic_shared_bytes()), nullptr, nullptr, extra),
        what);
  ++stats_.launches;
}

size_t Runtime::pack_params(const kir::Kernel& kernel, const std::vector<uint64_t>& args, std::vector<uint64_t>& words,
                            const std::string& what) const {
  if (args.size() != kernel.params.size())
    throw Error(fmt::format("{}: {} arguments for {} parameters", what, args.size(), kernel.params.size()));
  // Each parameter takes at most 8 bytes: one word per parameter holds the packed buffer, 8-aligned.
  words.assign(std::max<size_t>(args.size(), 1), 0);
  auto* bytes = reinterpret_cast<std::byte*>(words.data());
  size_t size = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const size_t n = static_cast<size_t>(kir::type_bytes(kernel.params[i].type));
    const size_t offset = (size + n - 1) / n * n;
    std::memcpy(bytes + offset, &args[i], n);  // little-endian: the low n bytes
    size = offset + n;
  }
  return size;
}

void Runtime::synchronize() {
  enter();
  check(driver_.api.cuCtxSynchronize(), "cuCtxSynchronize");
}

std::function<void()> Runtime::detached_synchronize() const {
  enter();
  return [set_current = driver_.api.cuCtxSetCurrent, wait = driver_.api.cuCtxSynchronize, context = context_] {
    if (set_current(context) != CUDA_SUCCESS || wait() != CUDA_SUCCESS)
      throw Error("cuCtxSynchronize failed on the waiting thread");
  };
}

std::function<void()> Runtime::detached_make_current() const {
  enter();
  return [set_current = driver_.api.cuCtxSetCurrent, context = context_] {
    if (set_current(context) != CUDA_SUCCESS) throw Error("cuCtxSetCurrent failed on a helper thread");
  };
}

CUgraphNode Runtime::add_collective_node(CUgraph graph, CUgraphNode after, const DeviceCommand& c, size_t i) {
  const std::string what = fmt::format("graph node {}: a collective over {} bytes at {:#x}", i, c.bytes, c.dst);
  if (!capture_supported()) throw Error(what + ": the driver lacks stream capture");
  const DriverApi& api = driver_.api;
  CUstream stream = nullptr;
  check(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), what + ": cuStreamCreate");
  CUgraph child = nullptr;
  try {
    // Relaxed: a library may allocate while it is captured (NCCL's first use of a buffer).
    check(api.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED), what + ": cuStreamBeginCapture");
    try {
      run_collective(*this, c, stream);
    } catch (...) {
      api.cuStreamEndCapture(stream, &child);
      throw;
    }
    check(api.cuStreamEndCapture(stream, &child), what + ": cuStreamEndCapture");
    CUgraphNode node = nullptr;
    check(api.cuGraphAddChildGraphNode(&node, graph, &after, after ? 1 : 0, child),
          what + ": cuGraphAddChildGraphNode");
    api.cuGraphDestroy(child);  // the parent holds a copy
    api.cuStreamDestroy(stream);
    return node;
  } catch (...) {
    if (child) api.cuGraphDestroy(child);
    api.cuStreamDestroy(stream);
    throw;
  }
}

Runtime::Graph Runtime::make_graph(const std::vector<DeviceCommand>& commands) {
  enter();
  if (!graphs_supported()) throw Error("CUDA graphs: the driver has no graph entry points");
  const DriverApi& api = driver_.api;
  Graph g;
  check(api.cuGraphCreate(&g.graph, 0), "cuGraphCreate");
  try {
    CUgraphNode last = nullptr;
    for (size_t i = 0; i < commands.size(); ++i) {
      const DeviceCommand& c = commands[i];
      CUgraphNode node = nullptr;
      const size_t deps = last ? 1 : 0;
      if (c.collective) {
        node = add_collective_node(g.graph, last, c, i);
      } else if (!c.kernel) {
        CudaMemsetNodeParams p;
        p.dst = c.dst;
        p.elementSize = c.bytes % 4 == 0 && c.dst % 4 == 0 ? 4 : 1;
        p.width = c.bytes / p.elementSize;
        p.pitch = c.bytes;
        check(api.cuGraphAddMemsetNode(&node, g.graph, &last, deps, &p, context_),
              fmt::format("graph node {}: zero {} bytes at {:#x}", i, c.bytes, c.dst));
      } else {
        const std::string what = fmt::format("graph node {}: kernel '{}' (grid {}, block {})", i,
                                             c.kernel->kernel->name, dims(c.grid), dims(c.block));
        std::vector<uint64_t> words;  // copied into the node by the driver
        size_t size = pack_params(*c.kernel->kernel, c.args, words, what);
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, words.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         CU_LAUNCH_PARAM_END};
        CudaKernelNodeParams p;
        p.func = c.kernel->fn;
        p.gridDimX = c.grid.x;
        p.gridDimY = c.grid.y;
        p.gridDimZ = c.grid.z;
        p.blockDimX = c.block.x;
        p.blockDimY = c.block.y;
        p.blockDimZ = c.block.z;
        p.sharedMemBytes = static_cast<unsigned>(c.kernel->kernel->dynamic_shared_bytes());
        p.extra = extra;
        check(api.cuGraphAddKernelNode(&node, g.graph, &last, deps, &p), what);
        ++g.kernels;
      }
      last = node;
    }
    check(api.cuGraphInstantiateWithFlags(&g.exec, g.graph, 0), "cuGraphInstantiateWithFlags");
  } catch (...) {
    destroy(g);
    throw;
  }
  ++stats_.graphs_built;
  return g;
}

void Runtime::launch(const Graph& graph) {
  enter();
  check(driver_.api.cuGraphLaunch(graph.exec, nullptr), fmt::format("launch of a graph of {} kernels", graph.kernels));
  stats_.launches += graph.kernels;
  ++stats_.graph_launches;
}

void Runtime::destroy(Graph& graph) {
  // Results are ignored: this runs on error paths and in destructors.
  if (lost()) {
    graph = Graph{};
    return;
  }
  if (graph.exec) driver_.api.cuGraphExecDestroy(graph.exec);
  if (graph.graph) driver_.api.cuGraphDestroy(graph.graph);
  graph = Graph{};
}

Target device_target(const Runtime& rt) { return cuda_target(rt.sm(), rt.fake()); }

}  // namespace kiln::cuda
