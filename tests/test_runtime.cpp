// Tests for the CUDA runtime over the fake driver (arena, transfers, memory and disk module caches,
// corrupt cache entries, JIT failures, PTX dumps, launches and their checks), the fake driver's own
// checks, the driver ABI constants against cuda.h where the toolkit is installed, and (GpuRuntime*)
// the same on a real device, skipped where no GPU is found.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/driver/driver_api.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/kir/ptxas.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

#include "device_test_util.hpp"
#include "ptxas_skip.hpp"

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;
using kir::Cmp;
using kir::Reg;
using kir::Space;
using kir::Type;

constexpr size_t kMiB = size_t{1} << 20;

// y[i] = a * x[i] for i < n; parameters x (u64), y (u64), n (u32), a (f32): 24 bytes packed.
kir::Kernel scale_kernel(const std::string& name = "kiln_test_scale") {
  kir::KernelBuilder b(name);
  Reg x = b.param("x", Type::u64), y = b.param("y", Type::u64), n = b.param("n", Type::u32);
  Reg a = b.param("a", Type::f32);
  Reg i = b.global_index_x();
  b.if_(b.setp(Cmp::lt, i, n), [&] {
    Reg v = b.ld(Space::global, Type::f32, b.address(x, i, 4));
    b.st(Space::global, Type::f32, b.address(y, i, 4), b.mul(Type::f32, a, v));
  });
  return b.finish();
}

uint64_t f32_bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Runs the scale kernel on x; returns y. Grid and block as given (default: enough 128-thread blocks).
std::vector<float> run_scale(Runtime& rt, const LoadedKernel& k, const std::vector<float>& x, float a,
                             uint32_t n_arg = 0, Dim3 block = {128, 1, 1}) {
  const size_t bytes = x.size() * sizeof(float);
  const uint32_t n = n_arg ? n_arg : static_cast<uint32_t>(x.size());
  CUdeviceptr dx = rt.alloc(bytes), dy = rt.alloc(bytes);
  rt.upload(dx, x.data(), bytes);
  rt.memset_zero(dy, bytes);
  std::vector<float> y(x.size());
  try {
    rt.launch(k, Dim3{(n + block.x - 1) / block.x, 1, 1}, block, {dx, dy, n, f32_bits(a)});
    rt.synchronize();
    rt.download(y.data(), dy, bytes);
  } catch (...) {
    rt.free(dx);
    rt.free(dy);
    throw;
  }
  rt.free(dx);
  rt.free(dy);
  return y;
}

std::vector<float> ramp(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.25f * static_cast<float>(i) - 7.0f;
  return x;
}

void expect_scaled(const std::vector<float>& y, const std::vector<float>& x, float a) {
  ASSERT_EQ(y.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], a * x[i]) << "element " << i;  // one f32 multiply: exact
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> cache_files(const std::string& dir) {
  std::vector<fs::path> files;
  if (!fs::exists(dir)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".cubin") files.push_back(e.path());
  return files;
}

// Each test gets a fresh directory (the module cache lives in dir/cache), removed afterwards.
class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kiln_runtime_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string cache_dir() const { return dir_ + "/cache"; }
  RuntimeOptions options() const { return RuntimeOptions{cache_dir(), ""}; }

  std::string dir_;
};

using FakeDriverTest = RuntimeTest;

// The fake driver with another compute capability: its attribute answers replaced, the rest kept.
int g_reported_major = 9, g_reported_minor = 0;
CUresult (*g_fake_get_attribute)(int*, int, CUdevice) = nullptr;

Driver driver_reporting_sm(int major, int minor) {
  Driver d = fake_driver();
  g_reported_major = major;
  g_reported_minor = minor;
  g_fake_get_attribute = d.api.cuDeviceGetAttribute;
  d.api.cuDeviceGetAttribute = [](int* value, int attribute, CUdevice dev) -> CUresult {
    if (attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) return *value = g_reported_major, CUDA_SUCCESS;
    if (attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) return *value = g_reported_minor, CUDA_SUCCESS;
    return g_fake_get_attribute(value, attribute, dev);
  };
  return d;
}

// The runtime takes the device's compute capability from the driver and prints its PTX for the
// newest target kiln has at or below it; a device older than sm_80 is refused by name.
TEST_F(FakeDriverTest, ThePtxTargetFollowsTheDevicesComputeCapability) {
  struct Case {
    int major, minor, target;
  };
  for (const Case& c : {Case{8, 0, 80}, Case{8, 6, 80}, Case{8, 9, 80}, Case{9, 0, 90}, Case{10, 0, 90}}) {
    const std::string dump = dir_ + "/ptx_" + std::to_string(c.major) + std::to_string(c.minor);
    Runtime rt(driver_reporting_sm(c.major, c.minor), RuntimeOptions{cache_dir(), dump});
    EXPECT_EQ(rt.sm(), 10 * c.major + c.minor);
    EXPECT_EQ(rt.ptx_target(), c.target) << "sm_" << rt.sm();
    rt.load(scale_kernel("kiln_target_check"));
    const std::string ptx = read_file(dump + "/kiln_target_check.ptx");
    EXPECT_NE(ptx.find(".target sm_" + std::to_string(c.target)), std::string::npos) << ptx;
  }
  Runtime old(driver_reporting_sm(7, 5), options());
  try {
    old.ptx_target();
    ADD_FAILURE() << "an sm_75 device was given PTX";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is sm_75; kiln's PTX needs sm_80 or newer"), std::string::npos) << e.what();
  }
}

TEST_F(RuntimeTest, ArenaReusesFreedBlocksOfTheSameSizeClass) {
  const size_t live_before = fake_device_state().memory->live_allocations();
  {
    Runtime rt(fake_driver(), options());
    const RuntimeStats& s = rt.stats();
    CUdeviceptr a = rt.alloc(1000);  // class 1024
    EXPECT_EQ(s.bytes_in_use, 1024u);
    EXPECT_EQ(s.device_allocations, 1);
    rt.free(a);
    EXPECT_EQ(s.bytes_in_use, 0u);
    CUdeviceptr b = rt.alloc(513);  // class 1024 again: the freed block
    EXPECT_EQ(b, a);
    EXPECT_EQ(s.device_allocations, 1);
    CUdeviceptr c = rt.alloc(0);  // class 256
    EXPECT_EQ(s.device_allocations, 2);
    CUdeviceptr d = rt.alloc(3 * kMiB + 1);  // class 4 MiB (a multiple of 1 MiB)
    CUdeviceptr e = rt.alloc(kMiB + 1);      // class 2 MiB
    EXPECT_EQ(s.bytes_in_use, 1024 + 256 + 4 * kMiB + 2 * kMiB);
    EXPECT_EQ(fake_device_state().memory->live_allocations(), live_before + 4);
    for (CUdeviceptr p : {b, c, d, e}) rt.free(p);
    EXPECT_EQ(s.bytes_in_use, 0u);
    EXPECT_EQ(s.peak_bytes_in_use, 1024 + 256 + 4 * kMiB + 2 * kMiB);
    EXPECT_THROW(rt.free(d), Error);  // freed twice
    EXPECT_THROW(rt.free(0x1234), Error);
    rt.free(0);  // like free(nullptr)
  }
  // The destructor gave every block back to the driver.
  EXPECT_EQ(fake_device_state().memory->live_allocations(), live_before);
}

TEST_F(RuntimeTest, UploadDownloadCopyAndZeroRoundTrip) {
  Runtime rt(fake_driver(), options());
  std::vector<float> x = ramp(300), y(300, 1.0f), z(300, 1.0f);
  const size_t bytes = x.size() * sizeof(float);
  CUdeviceptr a = rt.alloc(bytes), b = rt.alloc(bytes);
  rt.upload(a, x.data(), bytes);
  rt.copy(b, a, bytes);
  rt.download(y.data(), b, bytes);
  EXPECT_EQ(y, x);
  rt.memset_zero(b, bytes);
  rt.download(z.data(), b, bytes);
  EXPECT_EQ(z, std::vector<float>(300, 0.0f));
  // The block holds 2048 bytes (its class); the fake device checks every transfer against it.
  std::vector<char> big(4096);
  try {
    rt.upload(a, big.data(), big.size());
    ADD_FAILURE() << "an upload past the block's end succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("upload of 4096 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_INVALID_VALUE"), std::string::npos) << e.what();
  }
  rt.free(a);
  rt.free(b);
}

TEST_F(RuntimeTest, ScaleKernelLoadsAndRuns) {
  Runtime rt(fake_driver(), options());
  const kir::Kernel k = scale_kernel();
  const int64_t launches = fake_device_state().launches;
  LoadedKernel lk = rt.load(k);
  ASSERT_NE(lk.kernel, nullptr);
  EXPECT_NE(lk.kernel, &k);  // the runtime's own copy of the IR
  EXPECT_EQ(lk.kernel->name, k.name);
  EXPECT_GT(lk.registers, 0);
  const std::vector<float> x = ramp(300);  // not a multiple of the block
  expect_scaled(run_scale(rt, lk, x, 1.5f), x, 1.5f);
  EXPECT_EQ(rt.stats().launches, 1);
  EXPECT_EQ(rt.stats().modules_compiled, 1);
  EXPECT_EQ(fake_device_state().launches, launches + 1);
}

TEST_F(RuntimeTest, SecondLoadHitsTheMemoryCache) {
  Runtime rt(fake_driver(), options());
  const kir::Kernel k = scale_kernel();
  const FakeDeviceState before = fake_device_state();
  LoadedKernel a = rt.load(k);
  LoadedKernel b = rt.load(scale_kernel());  // an equal kernel: the same PTX text
  EXPECT_EQ(a.fn, b.fn);
  EXPECT_EQ(rt.stats().memory_cache_hits, 1);
  EXPECT_EQ(rt.stats().modules_compiled, 1);
  EXPECT_EQ(fake_device_state().jit_compiles, before.jit_compiles + 1);
  EXPECT_EQ(fake_device_state().modules_loaded, before.modules_loaded + 1);
}

TEST_F(RuntimeTest, SecondRuntimeHitsTheDiskCache) {
  const kir::Kernel k = scale_kernel();
  {
    Runtime rt(fake_driver(), options());
    rt.load(k);
    EXPECT_EQ(rt.stats().modules_compiled, 1);
    EXPECT_EQ(rt.stats().disk_cache_hits, 0);
  }
  ASSERT_EQ(cache_files(cache_dir()).size(), 1u);
  Runtime rt(fake_driver(), options());
  const int64_t jits = fake_device_state().jit_compiles;
  LoadedKernel lk = rt.load(k);
  EXPECT_EQ(rt.stats().disk_cache_hits, 1);
  EXPECT_EQ(rt.stats().modules_compiled, 0);
  EXPECT_EQ(fake_device_state().jit_compiles, jits);
  const std::vector<float> x = ramp(64);
  expect_scaled(run_scale(rt, lk, x, -2.0f), x, -2.0f);
}

TEST_F(RuntimeTest, CorruptCacheEntriesAreDetectedCountedAndRebuilt) {
  const kir::Kernel k = scale_kernel();
  struct Corruption {
    const char* what;
    void (*apply)(std::string& bytes);
  };
  const Corruption corruptions[] = {
      {"a flipped payload byte", [](std::string& b) { b.back() ^= 0x20; }},
      {"a truncated payload", [](std::string& b) { b.resize(b.size() - 7); }},
      {"a file shorter than the header", [](std::string& b) { b.resize(12); }},
      {"a wrong magic", [](std::string& b) { b[0] = 'X'; }},
  };
  for (const Corruption& c : corruptions) {
    SCOPED_TRACE(c.what);
    fs::remove_all(cache_dir());
    { Runtime(fake_driver(), options()).load(k); }
    const std::vector<fs::path> files = cache_files(cache_dir());
    ASSERT_EQ(files.size(), 1u);
    std::string bytes = read_file(files[0]);
    c.apply(bytes);
    std::ofstream(files[0], std::ios::binary | std::ios::trunc) << bytes;

    {
      Runtime rt(fake_driver(), options());
      LoadedKernel lk = rt.load(k);
      EXPECT_EQ(rt.stats().corrupt_cache_entries, 1);
      EXPECT_EQ(rt.stats().disk_cache_hits, 0);
      EXPECT_EQ(rt.stats().modules_compiled, 1);
      const std::vector<float> x = ramp(40);
      expect_scaled(run_scale(rt, lk, x, 3.0f), x, 3.0f);
    }
    Runtime rt(fake_driver(), options());  // the entry was rewritten
    rt.load(k);
    EXPECT_EQ(rt.stats().disk_cache_hits, 1);
    EXPECT_EQ(rt.stats().corrupt_cache_entries, 0);
  }
}

TEST_F(RuntimeTest, DiskCacheOffWritesNothing) {
  const kir::Kernel k = scale_kernel();
  for (int i = 0; i < 2; ++i) {
    Runtime rt(fake_driver(), RuntimeOptions{"off", ""});
    rt.load(k);
    EXPECT_EQ(rt.stats().modules_compiled, 1);
  }
}

TEST_F(RuntimeTest, UnwritableCacheDirectoryOnlyWarns) {
  std::ofstream(dir_ + "/file") << "a file, so that file/cache cannot be created";
  Runtime rt(fake_driver(), RuntimeOptions{dir_ + "/file/cache", ""});
  LoadedKernel lk = rt.load(scale_kernel());
  EXPECT_EQ(rt.stats().modules_compiled, 1);
  const std::vector<float> x = ramp(10);
  expect_scaled(run_scale(rt, lk, x, 0.5f), x, 0.5f);
}

TEST_F(RuntimeTest, JitFailureShowsTheDriverLogAndWritesThePtx) {
  Runtime rt(fake_driver(), options());
  const kir::Kernel k = scale_kernel("kiln_test_jit_failure");
  fake_driver_fail_next_jit("ptxas fatal   : test-injected failure");
  std::string message;
  try {
    rt.load(k);
  } catch (const Error& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "load() did not throw";
  EXPECT_NE(message.find("kiln_test_jit_failure"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA_ERROR_INVALID_PTX"), std::string::npos) << message;
  EXPECT_NE(message.find("test-injected failure"), std::string::npos) << message;
  const std::string marker = "PTX written to ";
  const size_t at = message.find(marker);
  ASSERT_NE(at, std::string::npos) << message;
  const fs::path ptx_file = message.substr(at + marker.size());
  EXPECT_NE(ptx_file.filename().string().find("kiln-failed-kiln_test_jit_failure-"), std::string::npos);
  ASSERT_TRUE(fs::exists(ptx_file)) << ptx_file;
  EXPECT_EQ(read_file(ptx_file), kir::print_ptx(k, rt.ptx_target()));
  fs::remove(ptx_file);
  EXPECT_TRUE(cache_files(cache_dir()).empty());
  rt.load(k);  // the hook fails one compilation only
  EXPECT_EQ(rt.stats().modules_compiled, 1);
}

TEST_F(RuntimeTest, PtxDumpWritesEveryLoadedKernel) {
  Runtime rt(fake_driver(), RuntimeOptions{cache_dir(), dir_ + "/dump/nested"});
  const kir::Kernel k = scale_kernel("kiln_test_dumped");
  rt.load(k);
  EXPECT_EQ(read_file(dir_ + "/dump/nested/kiln_test_dumped.ptx"), kir::print_ptx(k, rt.ptx_target()));
}

TEST_F(RuntimeTest, OutOfBoundsAccessFailsTheLaunchNamingTheKernel) {
  Runtime rt(fake_driver(), options());
  LoadedKernel lk = rt.load(scale_kernel("kiln_test_out_of_bounds"));
  const std::vector<float> x = ramp(64);  // 256-byte blocks; n = 1024 reads and writes past them
  try {
    run_scale(rt, lk, x, 2.0f, 1024, Dim3{1024, 1, 1});
    ADD_FAILURE() << "an out-of-bounds launch succeeded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("launch of kernel 'kiln_test_out_of_bounds' (grid 1x1x1, block 1024x1x1)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("CUDA_ERROR_LAUNCH_FAILED"), std::string::npos) << message;
    const std::string simulator = fake_driver_last_error();
    EXPECT_NE(simulator.find("kiln_test_out_of_bounds"), std::string::npos) << simulator;
    EXPECT_NE(message.find(simulator), std::string::npos) << message;
  }
  EXPECT_EQ(rt.stats().launches, 0);
  fake_driver_recover();  // the fault lost the fake device's context, as a GPU's
}

// A kernel fault is sticky, as on a GPU: the runtime refuses every later call with one message
// that says the process must restart (without calling the driver again), and the device fails
// every call of any runtime until the process (here: the test hook) starts anew.
TEST_F(RuntimeTest, AKernelFaultLosesTheContextForGood) {
  Runtime rt(fake_driver(), options());
  LoadedKernel lk = rt.load(scale_kernel("kiln_test_fault"));
  const std::vector<float> x = ramp(64);
  EXPECT_THROW(run_scale(rt, lk, x, 2.0f, 1024, Dim3{1024, 1, 1}), Error);
  EXPECT_TRUE(rt.lost());
  const std::string driver_error = fake_driver_last_error();
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      run_scale(rt, lk, x, 2.0f);
      ADD_FAILURE() << "a call after the fault succeeded";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("the CUDA context is lost"), std::string::npos) << message;
      EXPECT_NE(message.find("must restart"), std::string::npos) << message;
      EXPECT_NE(message.find("kiln_test_fault"), std::string::npos) << message;
    }
  }
  EXPECT_EQ(fake_driver_last_error(), driver_error) << "the runtime called the driver again";
  Runtime other(fake_driver(), options());  // device queries still answer
  try {
    other.alloc(256);
    ADD_FAILURE() << "an allocation on the lost device succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_LAUNCH_FAILED"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("must restart"), std::string::npos) << e.what();
  }
  fake_driver_recover();
  Runtime fresh(fake_driver(), options());
  expect_scaled(run_scale(fresh, fresh.load(scale_kernel("kiln_test_fault")), x, 2.0f), x, 2.0f);
}

// The driver's current context is per thread: the fake refuses a thread that never made it
// current, and a runtime makes it current on each thread that calls it.
TEST_F(RuntimeTest, EachThreadGetsTheContextMadeCurrent) {
  Runtime rt(fake_driver(), options());
  const Driver raw = fake_driver();
  CUresult without = CUDA_SUCCESS;
  std::vector<float> out;
  std::thread worker([&] {
    CUdeviceptr p = 0;
    without = raw.api.cuMemAlloc(&p, 256);  // no runtime call yet on this thread: no context
    LoadedKernel lk = rt.load(scale_kernel("kiln_test_thread"));
    out = run_scale(rt, lk, ramp(100), 3.0f);
  });
  worker.join();
  EXPECT_EQ(without, CUDA_ERROR_INVALID_CONTEXT);
  expect_scaled(out, ramp(100), 3.0f);
}

// A graph of a memset and two launches (y = 2x, then z = 3y) runs them in order, every time it
// is launched, with the parameters it was made with; a node that does not follow the one before
// it is refused (the fake runs chains, and without the dependency a driver may run both at once).
TEST_F(FakeDriverTest, GraphsRunTheirCommandsInOrderAndOnlyChains) {
  Runtime rt(fake_driver(), options());
  ASSERT_TRUE(rt.graphs_supported());
  LoadedKernel lk = rt.load(scale_kernel());
  const std::vector<float> x = ramp(300);
  const size_t bytes = x.size() * sizeof(float);
  CUdeviceptr dx = rt.alloc(bytes), dy = rt.alloc(bytes), dz = rt.alloc(bytes);
  rt.upload(dx, x.data(), bytes);
  const auto n = static_cast<uint64_t>(x.size());
  auto launch = [&](CUdeviceptr from, CUdeviceptr to, float a) {
    DeviceCommand c;
    c.kernel = &lk;
    c.grid = {3, 1, 1};
    c.block = {128, 1, 1};
    c.args = {from, to, n, f32_bits(a)};
    return c;
  };
  DeviceCommand zero;
  zero.dst = dz;
  zero.bytes = bytes;
  Runtime::Graph g = rt.make_graph({zero, launch(dx, dy, 2.0f), launch(dy, dz, 3.0f)});
  EXPECT_EQ(g.kernels, 2);
  const int64_t graph_launches = fake_device_state().graph_launches;
  for (int rep = 0; rep < 2; ++rep) {
    std::vector<float> wrong(x.size(), -1.0f);
    rt.upload(dz, wrong.data(), bytes);  // the memset node clears it
    rt.launch(g);
    rt.synchronize();
    std::vector<float> z(x.size());
    rt.download(z.data(), dz, bytes);
    expect_scaled(z, x, 6.0f);
  }
  EXPECT_EQ(fake_device_state().graph_launches, graph_launches + 2);
  EXPECT_EQ(rt.stats().graph_launches, 2);
  EXPECT_EQ(rt.stats().launches, 4);
  rt.destroy(g);
  rt.destroy(g);  // again: nothing left to destroy

  // Unchained: the second node lists no dependency.
  const DriverApi& api = rt.api();
  CUgraph graph = nullptr;
  ASSERT_EQ(api.cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CudaKernelNodeParams p;
  p.func = lk.fn;
  CUgraphNode first = nullptr, second = nullptr;
  EXPECT_EQ(api.cuGraphAddKernelNode(&first, graph, nullptr, 0, &p), CUDA_SUCCESS);
  EXPECT_EQ(api.cuGraphAddKernelNode(&second, graph, nullptr, 0, &p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(fake_driver_last_error().find("must depend on exactly the node added before it"), std::string::npos);
  EXPECT_EQ(api.cuGraphAddKernelNode(&second, graph, &first, 1, &p), CUDA_SUCCESS);
  CudaMemsetNodeParams m;
  m.dst = dz;
  m.elementSize = 4;
  m.width = x.size();
  CUgraphNode third = nullptr;
  EXPECT_EQ(api.cuGraphAddMemsetNode(&third, graph, &second, 1, &m, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(api.cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(api.cuGraphDestroy(graph), CUDA_ERROR_INVALID_HANDLE);
  rt.free(dx);
  rt.free(dy);
  rt.free(dz);
}

TEST_F(FakeDriverTest, ChecksTheParameterBufferAndLaunchDimensions) {
  Runtime rt(fake_driver(), options());
  LoadedKernel lk = rt.load(scale_kernel());
  CUdeviceptr x = rt.alloc(256), y = rt.alloc(256);
  alignas(8) unsigned char buffer[32] = {};
  const uint32_t n = 64;
  const float a = 2.0f;
  std::memcpy(buffer, &x, 8);
  std::memcpy(buffer + 8, &y, 8);
  std::memcpy(buffer + 16, &n, 4);
  std::memcpy(buffer + 20, &a, 4);
  size_t size = 16;
  void* buffer_ptr = buffer;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer_ptr, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  auto launch = [&](unsigned block_x, void** params) {
    return rt.api().cuLaunchKernel(lk.fn, 1, 1, 1, block_x, 1, 1, 0, nullptr, params, extra);
  };
  EXPECT_EQ(launch(64, nullptr), CUDA_ERROR_INVALID_VALUE);  // 16 bytes: the parameters pack to 24
  EXPECT_NE(fake_driver_last_error().find("pack to 24"), std::string::npos) << fake_driver_last_error();
  size = 24;
  extra[1] = buffer + 4;
  EXPECT_EQ(launch(64, nullptr), CUDA_ERROR_INVALID_VALUE);  // misaligned buffer
  EXPECT_NE(fake_driver_last_error().find("aligned"), std::string::npos) << fake_driver_last_error();
  extra[1] = buffer_ptr;
  void* params[] = {&x, &y};
  EXPECT_EQ(launch(64, params), CUDA_ERROR_INVALID_VALUE);  // kiln always packs into `extra`
  EXPECT_EQ(launch(2048, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(0, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(64, nullptr), CUDA_SUCCESS);
  rt.free(x);
  rt.free(y);
}

// y[t] = 2 x[(t + 1) % 256] for a block of 256 threads, through two 32 KiB shared arrays: 64
// KiB, over the static limit, so the arrays are carved from dynamic shared memory. Each value is
// stored at the start of `low` and at the end of `high` and read back from the neighbour's
// slots. (The simulator takes the arrays' offsets from the kernel IR, not from the PTX: the
// printed offsets are checked as text below, and by ptxas and the GPU tier.)
kir::Kernel wide_shared_kernel() {
  kir::KernelBuilder b("kiln_test_wide_shared");
  Reg x = b.param("x", Type::u64), y = b.param("y", Type::u64);
  Reg low = b.shared_addr(b.shared_array("low", 32 * 1024));
  Reg high = b.shared_addr(b.shared_array("high", 32 * 1024));
  constexpr int64_t kEnd = 31 * 1024;  // the last KiB of `high`
  Reg t = b.sreg(kir::SReg::tid_x);
  Reg v = b.ld(Space::global, Type::f32, b.address(x, t, 4));
  b.st(Space::shared, Type::f32, b.mad(Type::u32, t, kir::imm_u32(4), low), v);
  b.st(Space::shared, Type::f32, b.mad(Type::u32, t, kir::imm_u32(4), high), v, kEnd);
  b.bar();
  Reg next = b.rem(Type::u32, b.add(Type::u32, t, kir::imm_u32(1)), kir::imm_u32(256));
  Reg a = b.ld(Space::shared, Type::f32, b.mad(Type::u32, next, kir::imm_u32(4), low));
  Reg c = b.ld(Space::shared, Type::f32, b.mad(Type::u32, next, kir::imm_u32(4), high), kEnd);
  b.st(Space::global, Type::f32, b.address(y, t, 4), b.add(Type::f32, a, c));
  return b.finish();
}

TEST(DynamicShared, KernelsOverTheStaticLimitPrintOneExternArrayAndPassPtxas) {
  const kir::Kernel k = wide_shared_kernel();
  EXPECT_EQ(k.shared_bytes(), 64 * 1024);
  EXPECT_EQ(k.dynamic_shared_bytes(), 64 * 1024);
  EXPECT_EQ(scale_kernel().dynamic_shared_bytes(), 0);
  const std::string ptx = kir::print_ptx(k, 90);
  EXPECT_NE(ptx.find(".extern .shared .align 16 .b8 kiln_dynamic_shared[];"), std::string::npos) << ptx;
  EXPECT_NE(ptx.find("kiln_dynamic_shared+32768"), std::string::npos) << ptx;
  EXPECT_EQ(ptx.find(".shared .align 16 .b8 low"), std::string::npos) << ptx;
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (int sm : {80, 90}) {
    const PtxasResult r = run_ptxas(kir::print_ptx(k, sm), sm);
    EXPECT_TRUE(r.ok) << r.log;
    EXPECT_EQ(r.shared_bytes, 0) << r.log;  // nothing static: the launch passes it all
  }
}

TEST_F(FakeDriverTest, KernelsOverTheStaticSharedLimitTakeDynamicSharedMemory) {
  Runtime rt(fake_driver(), options());
  LoadedKernel lk = rt.load(wide_shared_kernel());
  const std::vector<float> x = ramp(256);
  const size_t bytes = x.size() * sizeof(float);
  CUdeviceptr dx = rt.alloc(bytes), dy = rt.alloc(bytes);
  rt.upload(dx, x.data(), bytes);
  auto expect_y = [&](const char* how) {
    std::vector<float> y(x.size());
    rt.download(y.data(), dy, bytes);
    for (size_t t = 0; t < x.size(); ++t) ASSERT_EQ(y[t], 2.0f * x[(t + 1) % 256]) << how << ", thread " << t;
  };
  rt.launch(lk, Dim3{1, 1, 1}, Dim3{256, 1, 1}, {dx, dy});
  rt.synchronize();
  expect_y("launched");
  rt.memset_zero(dy, bytes);
  DeviceCommand c;
  c.kernel = &lk;
  c.grid = {1, 1, 1};
  c.block = {256, 1, 1};
  c.args = {dx, dy};
  Runtime::Graph g = rt.make_graph({c});
  rt.launch(g);
  rt.synchronize();
  expect_y("in a graph");
  rt.destroy(g);

  // What the driver would refuse, and what the fake refuses besides (too little).
  alignas(8) unsigned char buffer[16] = {};
  std::memcpy(buffer, &dx, 8);
  std::memcpy(buffer + 8, &dy, 8);
  size_t size = 16;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  const DriverApi& api = rt.api();
  auto launch = [&](unsigned shared) {
    return api.cuLaunchKernel(lk.fn, 1, 1, 1, 256, 1, 1, shared, nullptr, nullptr, extra);
  };
  EXPECT_EQ(launch(0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(fake_driver_last_error().find("the kernel's arrays take 65536"), std::string::npos)
      << fake_driver_last_error();
  ASSERT_EQ(api.cuFuncSetAttribute(lk.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 48 * 1024), CUDA_SUCCESS);
  EXPECT_EQ(launch(64 * 1024), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(fake_driver_last_error().find("limit of 49152"), std::string::npos) << fake_driver_last_error();
  EXPECT_EQ(api.cuFuncSetAttribute(lk.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100 * 1024),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(api.cuFuncSetAttribute(lk.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 * 1024), CUDA_SUCCESS);
  EXPECT_EQ(launch(64 * 1024), CUDA_SUCCESS);
  rt.free(dx);
  rt.free(dy);
}

TEST_F(FakeDriverTest, ChecksFreesHandlesAndCopies) {
  Runtime rt(fake_driver(), options());  // initializes the fake driver
  const DriverApi& api = rt.api();
  EXPECT_EQ(api.cuMemFree(0xdead00), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr p = 0;
  ASSERT_EQ(api.cuMemAlloc(&p, 100), CUDA_SUCCESS);
  char host[128] = {};
  EXPECT_EQ(api.cuMemcpyHtoD(p, host, 100), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemcpyHtoD(p, host, 101), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api.cuMemcpyDtoH(host, p + 50, 51), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api.cuMemsetD8(p + 1, 0, 100), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api.cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(fake_driver_last_error().find("double free"), std::string::npos) << fake_driver_last_error();

  CUfunction fn = nullptr;
  EXPECT_EQ(api.cuModuleGetFunction(&fn, reinterpret_cast<CUmodule>(0x10), "x"), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(api.cuModuleUnload(reinterpret_cast<CUmodule>(0x10)), CUDA_ERROR_INVALID_HANDLE);
  int value = 0;
  EXPECT_EQ(api.cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, fn), CUDA_ERROR_INVALID_HANDLE);

  const char* text = nullptr;
  EXPECT_EQ(api.cuGetErrorString(CUDA_ERROR_INVALID_PTX, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "CUDA_ERROR_INVALID_PTX");
}

TEST_F(FakeDriverTest, ModulesLoadObservedPtxOnlyAndFindFunctionsByName) {
  Runtime rt(fake_driver(), options());
  const DriverApi& api = rt.api();
  const kir::Kernel k = scale_kernel("kiln_test_module");
  const std::string ptx = kir::print_ptx(k, 90);

  // PTX the driver was never told the IR of: INVALID_PTX, with the log cut to the buffer's size.
  char log[16];
  std::memset(log, 'x', sizeof log);
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log, reinterpret_cast<void*>(uintptr_t{sizeof log})};
  CUmodule module = nullptr;
  const std::string unknown = ptx + "// changed\n";
  EXPECT_EQ(api.cuModuleLoadDataEx(&module, unknown.c_str(), 2, options, values), CUDA_ERROR_INVALID_PTX);
  EXPECT_EQ(std::strlen(log), sizeof log - 1);

  rt.load(k);  // the runtime tells the driver the IR
  ASSERT_EQ(api.cuModuleLoadDataEx(&module, ptx.c_str(), 0, nullptr, nullptr), CUDA_SUCCESS);
  CUfunction fn = nullptr;
  EXPECT_EQ(api.cuModuleGetFunction(&fn, module, "another_name"), CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(api.cuModuleGetFunction(&fn, module, "kiln_test_module"), CUDA_SUCCESS);
  int registers = 0, local = -1;
  EXPECT_EQ(api.cuFuncGetAttribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, fn), CUDA_SUCCESS);
  EXPECT_EQ(api.cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn), CUDA_SUCCESS);
  int total = 0;
  for (int r : k.num_regs) total += r;
  EXPECT_EQ(registers, total);
  EXPECT_EQ(local, 0);
  EXPECT_EQ(api.cuModuleUnload(module), CUDA_SUCCESS);
  EXPECT_EQ(api.cuFuncGetAttribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, fn), CUDA_ERROR_INVALID_HANDLE);
}

// Both ways a machine can lack a driver, forced on any machine: no library, and a library
// without the driver's entry points (libm has none of them).
TEST(RuntimeDriver, LoadCudaDriverSaysWhyWhenTheLibraryOrASymbolIsMissing) {
  std::string why;
  EXPECT_FALSE(load_cuda_driver(&why, "libkiln_no_such_driver.so.1"));
  EXPECT_EQ(why.rfind("libkiln_no_such_driver.so.1 not found: ", 0), 0u) << why;
  why.clear();
  EXPECT_FALSE(load_cuda_driver(&why, "libm.so.6"));
  EXPECT_EQ(why, "libm.so.6 lacks cuInit");
}

// Where the system's driver loads, it is the real one with every required entry point.
TEST(RuntimeDriver, TheSystemDriverIsCompleteWhereItLoads) {
  std::string why;
  std::optional<Driver> driver = load_cuda_driver(&why);
  if (!driver) GTEST_SKIP() << "no CUDA driver on this machine: " << why;
  EXPECT_FALSE(driver->fake);
  EXPECT_NE(driver->api.cuLaunchKernel, nullptr);
  EXPECT_NE(driver->api.cuGetErrorString, nullptr);
}

// The GPU tier: the real driver, with a module cache of its own.
class GpuRuntime : public RuntimeTest {
 protected:
  void SetUp() override {
    KILN_GPU_OR_SKIP(rt);
    RuntimeTest::SetUp();
  }
};

TEST_F(GpuRuntime, ScaleKernelRunsAndCachesItsCubin) {
  const kir::Kernel k = scale_kernel();
  const std::vector<float> x = ramp(100000);
  {
    Runtime rt(*load_cuda_driver(nullptr), options());
    EXPECT_GE(rt.sm(), 80);
    LoadedKernel lk = rt.load(k);
    EXPECT_EQ(rt.stats().modules_compiled, 1);
    expect_scaled(run_scale(rt, lk, x, 1.5f), x, 1.5f);
  }
  Runtime rt(*load_cuda_driver(nullptr), options());
  LoadedKernel lk = rt.load(k);
  EXPECT_EQ(rt.stats().disk_cache_hits, 1);
  expect_scaled(run_scale(rt, lk, x, -0.75f), x, -0.75f);
}

}  // namespace
}  // namespace kiln::cuda

#if defined(KILN_HAVE_CUDA_H) && __has_include(<cuda.h>)
// The ABI check. cuda.h comes last: it defines macros (cuMemAlloc -> cuMemAlloc_v2,
// CU_LAUNCH_PARAM_END, ...) that would rewrite the code above. The launch-parameter markers are
// macros there, so kiln's are captured first under other names.
namespace {
void* const kKilnLaunchParamEnd = kiln::cuda::CU_LAUNCH_PARAM_END;
void* const kKilnLaunchParamBufferPointer = kiln::cuda::CU_LAUNCH_PARAM_BUFFER_POINTER;
void* const kKilnLaunchParamBufferSize = kiln::cuda::CU_LAUNCH_PARAM_BUFFER_SIZE;
}  // namespace

#include <cuda.h>

#define KILN_SAME_AS_CUDA_H(name) static_assert(static_cast<int>(kiln::cuda::name) == static_cast<int>(::name), #name)
KILN_SAME_AS_CUDA_H(CUDA_SUCCESS);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_INVALID_VALUE);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_OUT_OF_MEMORY);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_NOT_INITIALIZED);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_NO_DEVICE);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_INVALID_IMAGE);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_INVALID_CONTEXT);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_INVALID_HANDLE);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_ILLEGAL_ADDRESS);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_LAUNCH_TIMEOUT);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_HARDWARE_STACK_ERROR);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_ILLEGAL_INSTRUCTION);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_MISALIGNED_ADDRESS);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_INVALID_PC);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_NOT_FOUND);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_LAUNCH_FAILED);
KILN_SAME_AS_CUDA_H(CUDA_ERROR_INVALID_PTX);
KILN_SAME_AS_CUDA_H(CU_STREAM_NON_BLOCKING);
KILN_SAME_AS_CUDA_H(CU_STREAM_CAPTURE_MODE_RELAXED);
KILN_SAME_AS_CUDA_H(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
KILN_SAME_AS_CUDA_H(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
KILN_SAME_AS_CUDA_H(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
KILN_SAME_AS_CUDA_H(CU_JIT_INFO_LOG_BUFFER);
KILN_SAME_AS_CUDA_H(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
KILN_SAME_AS_CUDA_H(CU_JIT_ERROR_LOG_BUFFER);
KILN_SAME_AS_CUDA_H(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
KILN_SAME_AS_CUDA_H(CU_JIT_INPUT_PTX);
KILN_SAME_AS_CUDA_H(CU_FUNC_ATTRIBUTE_NUM_REGS);
KILN_SAME_AS_CUDA_H(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
KILN_SAME_AS_CUDA_H(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
#if CUDA_VERSION >= 12000  // tensor maps came with CUDA 12.0
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_DATA_TYPE_UINT8);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_DATA_TYPE_UINT16);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_DATA_TYPE_UINT32);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_DATA_TYPE_FLOAT16);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_INTERLEAVE_NONE);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_SWIZZLE_NONE);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_SWIZZLE_128B);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_L2_PROMOTION_NONE);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
KILN_SAME_AS_CUDA_H(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
// cuda.h declares 128-byte alignment from CUDA 13, 64 before (what the driver needs).
static_assert(sizeof(kiln::cuda::CUtensorMap) == sizeof(::CUtensorMap) &&
              alignof(kiln::cuda::CUtensorMap) >= alignof(::CUtensorMap));
#endif
#undef KILN_SAME_AS_CUDA_H
static_assert(sizeof(kiln::cuda::CUdeviceptr) == sizeof(::CUdeviceptr));
static_assert(sizeof(kiln::cuda::CUdevice) == sizeof(::CUdevice));
static_assert(sizeof(kiln::cuda::CUresult) == sizeof(::CUresult));
static_assert(sizeof(kiln::cuda::CUjit_option) == sizeof(::CUjit_option));
// The graph node parameters kiln fills: the layouts cuGraphAddKernelNode_v2 and
// cuGraphAddMemsetNode read.
#define KILN_SAME_FIELD(kiln_type, cuda_type, field)                                      \
  static_assert(offsetof(kiln::cuda::kiln_type, field) == offsetof(::cuda_type, field) && \
                    sizeof(kiln::cuda::kiln_type::field) == sizeof(::cuda_type::field),   \
                #cuda_type "." #field)
static_assert(sizeof(kiln::cuda::CudaKernelNodeParams) == sizeof(::CUDA_KERNEL_NODE_PARAMS_v2));
KILN_SAME_FIELD(CudaKernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, func);
KILN_SAME_FIELD(CudaKernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, gridDimX);
KILN_SAME_FIELD(CudaKernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, blockDimZ);
KILN_SAME_FIELD(CudaKernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, sharedMemBytes);
KILN_SAME_FIELD(CudaKernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, kernelParams);
KILN_SAME_FIELD(CudaKernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, extra);
KILN_SAME_FIELD(CudaKernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, kern);
KILN_SAME_FIELD(CudaKernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, ctx);
static_assert(sizeof(kiln::cuda::CudaMemsetNodeParams) == sizeof(::CUDA_MEMSET_NODE_PARAMS));
KILN_SAME_FIELD(CudaMemsetNodeParams, CUDA_MEMSET_NODE_PARAMS, dst);
KILN_SAME_FIELD(CudaMemsetNodeParams, CUDA_MEMSET_NODE_PARAMS, pitch);
KILN_SAME_FIELD(CudaMemsetNodeParams, CUDA_MEMSET_NODE_PARAMS, value);
KILN_SAME_FIELD(CudaMemsetNodeParams, CUDA_MEMSET_NODE_PARAMS, elementSize);
KILN_SAME_FIELD(CudaMemsetNodeParams, CUDA_MEMSET_NODE_PARAMS, width);
KILN_SAME_FIELD(CudaMemsetNodeParams, CUDA_MEMSET_NODE_PARAMS, height);
#undef KILN_SAME_FIELD

TEST(FakeDriverAbi, LaunchParameterMarkersMatchCudaH) {
  EXPECT_EQ(kKilnLaunchParamEnd, CU_LAUNCH_PARAM_END);
  EXPECT_EQ(kKilnLaunchParamBufferPointer, CU_LAUNCH_PARAM_BUFFER_POINTER);
  EXPECT_EQ(kKilnLaunchParamBufferSize, CU_LAUNCH_PARAM_BUFFER_SIZE);
}
#endif
