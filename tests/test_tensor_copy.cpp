// Known-answer tests of sm_90's tensor copies (kir::Opc::TensorCopy, cp.async.bulk.tensor) and
// the mbarriers they complete on, in the SIMT simulator through the fake driver's
// cuTensorMapEncodeTiled, on a GPU (T5, an H100 or H200) and in ptxas; and the misuses the
// simulator must report. The expected shared images are written here from the CUDA
// documentation's words, not from the simulator's formulas:
//  - a box lands row after row (dimension 0 innermost), elements outside the tensor as zeros;
//  - with the 128-byte swizzle, rows are 128 bytes and in row r the 16-byte chunk c sits at chunk
//    position c XOR (r % 8) (the K-major layout test_wgmma.cpp builds by hand).
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/cuda/driver/driver_api.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/kir/ptxas.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/cuda/runtime/device_program.hpp>
#include <kiln/cuda/runtime/runtime.hpp>
#include <kiln/cuda/sim/tensor_map.hpp>

#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "ptxas_skip.hpp"
#include "scoped_target.hpp"
#include "sim_test_util.hpp"

namespace kiln::cuda {
namespace {

using kir::Cmp;
using kir::imm_s32;
using kir::imm_u32;
using kir::Reg;
using kir::Space;
using kir::Type;

constexpr uint32_t kThreads = 128;

// A tensor of `dims` elements (innermost first) of `bytes` each, rows padded to `pitch` bytes,
// and two boxes copied from it one after the other into the same shared buffer.
struct Case {
  std::string name;
  uint32_t element_bytes = 2;
  std::vector<uint64_t> dims;  // 2 or 3 of them
  uint64_t pitch = 0;          // bytes between rows (dimension 1); dimension 2 follows rows densely
  std::vector<uint32_t> box;
  bool swizzle = false;
  std::vector<std::vector<int32_t>> origins;  // per copy, the box's first element
  // Planted misuses, each of which the simulator must report.
  bool no_map_fence = false;             // no fence.proxy.tensormap before the map's first use
  bool barrier_instead_of_wait = false;  // a bar.sync, not the mbarrier, before the box is read
  bool expect_too_much = false;          // expect_tx names 16 bytes more than the box
  bool no_init_fence = false;            // no fence.mbarrier_init after the init
  bool second_wait_parity_0 = false;     // the second copy waited for with parity 0 (the first phase's)
  bool refill_without_barrier = false;   // the second copy issued with no bar.sync after the first's reads
  uint64_t box_bytes() const {
    uint64_t n = element_bytes;
    for (uint32_t b : box) n *= b;
    return n;
  }
  uint64_t tensor_bytes() const {
    uint64_t n = pitch * dims[1];
    return dims.size() > 2 ? n * dims[2] : n;
  }
};

// Element values: distinct and nonzero inside the tensor (so a zero means "outside").
uint64_t value(const Case& c, const std::array<uint64_t, 3>& at) {
  const uint64_t v = 1 + at[0] * 3 + at[1] * 1031 + at[2] * 65537;
  return c.element_bytes == 2 ? (v % 65521) + 1 : v;
}

std::vector<std::byte> tensor(const Case& c) {
  std::vector<std::byte> t(c.tensor_bytes());
  const uint64_t planes = c.dims.size() > 2 ? c.dims[2] : 1;
  for (uint64_t z = 0; z < planes; ++z)
    for (uint64_t y = 0; y < c.dims[1]; ++y)
      for (uint64_t x = 0; x < c.dims[0]; ++x) {
        const uint64_t v = value(c, {x, y, z});
        std::memcpy(t.data() + (z * c.dims[1] + y) * c.pitch + x * c.element_bytes, &v, c.element_bytes);
      }
  return t;
}

// The shared image of copy `i`, from the documentation's words (see the top of the file).
std::vector<std::byte> expected_box(const Case& c, size_t i) {
  std::vector<std::byte> img(c.box_bytes());
  const uint32_t planes = c.box.size() > 2 ? c.box[2] : 1, row_bytes = c.box[0] * c.element_bytes;
  for (uint32_t z = 0; z < planes; ++z)
    for (uint32_t y = 0; y < c.box[1]; ++y)
      for (uint32_t x = 0; x < c.box[0]; ++x) {
        const std::vector<int32_t>& o = c.origins[i];
        const int64_t gx = o[0] + x, gy = o[1] + y, gz = c.box.size() > 2 ? o[2] + z : 0;
        const uint64_t gplanes = c.dims.size() > 2 ? c.dims[2] : 1;
        const bool inside = gx >= 0 && gx < static_cast<int64_t>(c.dims[0]) && gy >= 0 &&
                            gy < static_cast<int64_t>(c.dims[1]) && gz >= 0 && gz < static_cast<int64_t>(gplanes);
        const uint64_t v =
            inside ? value(c, {static_cast<uint64_t>(gx), static_cast<uint64_t>(gy), static_cast<uint64_t>(gz)}) : 0;
        const uint32_t row = z * c.box[1] + y, byte = x * c.element_bytes;
        const uint32_t chunk = c.swizzle ? (byte / 16) ^ (row % 8) : byte / 16;
        std::memcpy(img.data() + row * row_bytes + chunk * 16 + byte % 16, &v, c.element_bytes);
      }
  return img;
}

// Thread 0 initializes the barrier and issues each copy; every thread waits for the copy's phase
// and then stores the shared box, word by word, to out[copy][word].
kir::Kernel copy_kernel(const Case& c) {
  kir::KernelBuilder b("tensor_copy_" + c.name);
  Reg map = b.param("map", Type::u64), out = b.param("out", Type::u64);
  b.declare_block_threads(kThreads);
  const int box = b.shared_array("box", static_cast<int64_t>(c.box_bytes()), 1024);
  const int bar = b.shared_array("bar", 8, 8);
  Reg tid = b.sreg(kir::SReg::tid_x), sbox = b.shared_addr(box), sbar = b.shared_addr(bar);
  Reg first = b.setp(Cmp::eq, tid, imm_u32(0));
  b.if_(first, [&] {
    if (!c.no_map_fence) b.fence_proxy_tensormap(map);
    b.mbarrier_init(sbar, imm_u32(1));
    if (!c.no_init_fence) b.fence_mbarrier_init();
  });
  b.bar();
  const auto words = static_cast<uint32_t>(c.box_bytes() / 4);
  for (size_t i = 0; i < c.origins.size(); ++i) {
    if (i > 0 && !c.refill_without_barrier) b.bar();  // every thread's reads of the last box are done
    b.if_(first, [&] {
      b.mbarrier_arrive_expect_tx(sbar, imm_u32(static_cast<uint32_t>(c.box_bytes()) + (c.expect_too_much ? 16 : 0)));
      std::vector<kir::Operand> coords;
      for (int32_t o : c.origins[i]) coords.push_back(imm_s32(o));
      b.tensor_copy(sbox, map, sbar, coords);
    });
    const uint32_t parity = c.second_wait_parity_0 ? 0 : static_cast<uint32_t>(i % 2);
    if (c.barrier_instead_of_wait) {
      b.bar();  // orders the copy's issue, not its landing
    } else {
      b.mbarrier_wait(sbar, imm_u32(parity));
    }
    b.for_(tid, imm_u32(words), imm_u32(kThreads), [&](Reg w) {
      Reg v = b.ld(Space::shared, Type::u32, b.mad(Type::u32, w, imm_u32(4), sbox));
      b.st(Space::global, Type::u32, b.address(out, b.add(Type::u32, w, imm_u32(static_cast<uint32_t>(i) * words)), 4),
           v);
    });
  }
  return b.finish();
}

// The map through the runtime's driver (the fake's cuTensorMapEncodeTiled, or the GPU's).
CUtensorMap encode(const Runtime& rt, const Case& c, CUdeviceptr address) {
  CUtensorMap m{};
  const auto rank = static_cast<uint32_t>(c.dims.size());
  std::vector<uint64_t> strides = {c.pitch};
  if (rank > 2) strides.push_back(c.pitch * c.dims[1]);
  const std::vector<uint32_t> ones(rank, 1);
  const int type = c.element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const CUresult r = rt.api().cuTensorMapEncodeTiled(
      &m, type, rank, reinterpret_cast<void*>(address), c.dims.data(), strides.data(), c.box.data(), ones.data(),
      CU_TENSOR_MAP_INTERLEAVE_NONE, c.swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EXPECT_EQ(r, CUDA_SUCCESS) << c.name;
  return m;
}

std::vector<std::byte> run_copies(Runtime& rt, const Case& c) {
  const std::vector<std::byte> t = tensor(c);
  const size_t out_bytes = c.box_bytes() * c.origins.size();
  CUdeviceptr dt = rt.alloc(t.size()), dmap = rt.alloc(sizeof(CUtensorMap)), dout = rt.alloc(out_bytes);
  rt.upload(dt, t.data(), t.size());
  const CUtensorMap m = encode(rt, c, dt);
  rt.upload(dmap, &m, sizeof(m));
  const LoadedKernel k = rt.load(copy_kernel(c));
  rt.launch(k, Dim3{1, 1, 1}, Dim3{kThreads, 1, 1}, {dmap, dout});
  rt.synchronize();
  std::vector<std::byte> out(out_bytes);
  rt.download(out.data(), dout, out_bytes);
  for (CUdeviceptr p : {dt, dmap, dout}) rt.free(p);
  return out;
}

// bf16 boxes of 64 x 24 in 128-byte swizzled rows, from a 100 x 40 tensor (rows padded to 208
// bytes): inside, over the right and bottom edges, and before the first row and column; f32
// boxes of 4 x 3 x 2 without swizzle from a 6 x 5 x 3 tensor.
std::vector<Case> known_answer_cases() {
  Case swizzled{.name = "bf16_swizzled",
                .element_bytes = 2,
                .dims = {100, 40},
                .pitch = 208,
                .box = {64, 24},
                .swizzle = true,
                .origins = {{8, 3}, {64, 30}, {-5, -2}}};
  Case plain{.name = "f32_3d",
             .element_bytes = 4,
             .dims = {6, 5, 3},
             .pitch = 32,
             .box = {4, 3, 2},
             .swizzle = false,
             .origins = {{1, 1, 0}, {4, 3, 2}}};
  return {swizzled, plain};
}

void expect_known_answers(Runtime& rt) {
  for (const Case& c : known_answer_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<std::byte> out = run_copies(rt, c);
    for (size_t i = 0; i < c.origins.size(); ++i) {
      const std::vector<std::byte> want = expected_box(c, i);
      for (size_t byte = 0; byte < want.size(); byte += c.element_bytes) {
        uint32_t got = 0, expect = 0;
        std::memcpy(&got, out.data() + i * c.box_bytes() + byte, c.element_bytes);
        std::memcpy(&expect, want.data() + byte, c.element_bytes);
        ASSERT_EQ(got, expect) << "copy " << i << ", shared byte " << byte;
      }
    }
  }
}

TEST(TensorCopy, KnownAnswersInTheSimulator) { expect_known_answers(testing::fake_runtime()); }

TEST(TensorCopy, GpuKnownAnswers) {
  KILN_GPU_OR_SKIP(rt);
  if (rt->sm() != 90) GTEST_SKIP() << "tensor copies are printed for sm_90a; this GPU is sm_" << rt->sm();
  if (!rt->api().cuTensorMapEncodeTiled) GTEST_SKIP() << "the driver has no cuTensorMapEncodeTiled";
  expect_known_answers(*rt);
}

TEST(TensorCopy, KernelsPassPtxasForSm90aOnly) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (const Case& c : known_answer_cases()) {
    const kir::Kernel k = copy_kernel(c);
    const std::string ptx = kir::print_ptx(k, 90);
    const PtxasResult r = run_ptxas(ptx, 90);
    EXPECT_TRUE(r.ok) << k.name << ":\n" << r.log << "\n" << ptx;
    EXPECT_NE(ptx.find("cp.async.bulk.tensor." + std::to_string(c.dims.size()) + "d"), std::string::npos);
    EXPECT_NE(ptx.find("trap;"), std::string::npos) << "a wait that never completes must not hang the GPU";
    EXPECT_THROW(kir::print_ptx(k, 80), Error) << k.name << " printed for sm_80";
  }
}

// The misuses, each reported: a read of the box by threads that did not wait for its phase (a
// bar.sync after the copy's issue instead); a map in global memory used without the tensor-map
// proxy fence; a phase expecting more bytes than land (every waiter waits forever); a copy
// completing on a barrier whose init was not fenced; the second box waited for with the first
// phase's parity (which has already completed: the wait passes before the bytes land); and the
// second copy issued while other threads may still read the first box.
TEST(TensorCopy, SimulatorReportsMisuses) {
  const Case base = known_answer_cases().front();
  sim::DeviceMemory mem;
  const std::vector<std::byte> t = tensor(base);
  const uint64_t dt = mem.alloc(t.size()), dmap = mem.alloc(sim::kTensorMapBytes),
                 dout = mem.alloc(base.box_bytes() * base.origins.size());
  mem.write(dt, t.data(), t.size());
  sim::TensorMap m{.address = dt,
                   .rank = 2,
                   .element_bytes = 2,
                   .dims = {100, 40},
                   .strides = {2, 208},
                   .box = {64, 24},
                   .swizzle = sim::TensorSwizzle::b128};
  ASSERT_EQ(sim::tensor_map_problem(m), "");
  const auto bytes = sim::encode_tensor_map(m);
  mem.write(dmap, bytes.data(), bytes.size());
  auto run = [&](const Case& c) { sim::simulate(copy_kernel(c), {1}, {kThreads}, {dmap, dout}, mem); };
  // Where the schedule decides which of two faults shows first (threads that read before the
  // copy lands race with it; those after it read bytes they did not wait for), either will do.
  auto expect_either = [&](const Case& c, const std::string& one, const std::string& other) {
    try {
      run(c);
      ADD_FAILURE() << c.name << ": no error; expected '" << one << "' or '" << other << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find(one) != std::string::npos || msg.find(other) != std::string::npos) << msg;
    }
  };
  run(base);  // as written, it runs
  Case c = base;
  c.barrier_instead_of_wait = true;
  sim::testing::expect_error([&] { run(c); }, {"that a tensor copy", "which this thread has not waited for"});
  c = base;
  c.no_map_fence = true;
  sim::testing::expect_error([&] { run(c); }, {"no fence.proxy.tensormap::generic.acquire"});
  c = base;
  c.expect_too_much = true;
  sim::testing::expect_error([&] { run(c); }, {"deadlock", "mbarrier phases that cannot complete"});
  c = base;
  c.no_init_fence = true;
  sim::testing::expect_error([&] { run(c); }, {"no fence.mbarrier_init"});
  c = base;
  c.second_wait_parity_0 = true;
  expect_either(c, "phase 1 of the mbarrier", "shared-memory race");
  c = base;
  c.refill_without_barrier = true;
  // Thread 0 races the other threads' reads of the first box, or, where it runs first, completes
  // both phases before they wait for the first: they then wait for a third that never comes.
  expect_either(c, "shared-memory race", "deadlock");
  // A map the fake did not write.
  const std::vector<std::byte> junk(sim::kTensorMapBytes, std::byte{7});
  mem.write(dmap, junk.data(), junk.size());
  sim::testing::expect_error([&] { run(base); }, {"is not one cuTensorMapEncodeTiled"});
}

// A device program encodes its tensor maps over each run's buffers, again only where one moved:
// the fake runtime reuses a freed block of the same size, so the bf16 casts' outputs stay put
// from run to run, until blocks of their sizes are held between runs. The product is right
// every time (tensor-copies=on: a's and b's maps).
TEST(TensorCopy, DeviceProgramsEncodeMapsWhereBuffersMoved) {
  testing::Harness h({testing::f32({130, 64}), testing::f32({77, 64})}, [](Builder& b, const std::vector<ValueId>& x) {
    return b.matmul(b.cast(x[0], DType::bf16), b.cast(x[1], DType::bf16), false, true);
  });
  const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  Runtime& rt = testing::fake_runtime();
  DeviceProgram dp(h.circuit, {h.output}, rt,
                   testing::with_matmul(device_target(rt), "bf16-mma=on,wgmma=on,tensor-copies=on"));
  ASSERT_NE(dp.dump().find("tensor-copy stages"), std::string::npos) << dp.dump();
  const int64_t before = rt.stats().tensor_maps_encoded;
  auto run = [&](int64_t encoded, const char* what) {
    EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), 1e-5) << what;
    EXPECT_EQ(rt.stats().tensor_maps_encoded - before, encoded) << what;
  };
  run(2, "first run");
  run(2, "second run, the same buffers");
  std::vector<CUdeviceptr> held{rt.alloc(130 * 64 * 2), rt.alloc(77 * 64 * 2)};  // the casts' blocks
  run(4, "third run, both operands elsewhere");
  run(4, "fourth run, the same buffers as the third");
  for (CUdeviceptr p : held) rt.free(p);
  // Back to whichever blocks the arena gives now: the first run's (their maps kept), the third
  // run's, or new ones; right in every case.
  EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), 1e-5) << "fifth run";
  EXPECT_LE(rt.stats().tensor_maps_encoded - before, 6);
}

// The fake driver refuses what the real one documents as invalid, naming the rule.
TEST(TensorCopy, FakeDriverChecksTensorMapArguments) {
  Runtime& rt = testing::fake_runtime();
  const CUdeviceptr p = rt.alloc(4096);
  auto try_encode = [&](uint64_t address, uint64_t stride, uint32_t box0, uint32_t box1, int swizzle) {
    CUtensorMap m{};
    const uint64_t dims[2] = {64, 16}, strides[1] = {stride};
    const uint32_t box[2] = {box0, box1}, ones[2] = {1, 1};
    return rt.api().cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, reinterpret_cast<void*>(address),
                                           dims, strides, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                           CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  EXPECT_EQ(try_encode(p, 128, 64, 16, CU_TENSOR_MAP_SWIZZLE_128B), CUDA_SUCCESS);
  EXPECT_EQ(try_encode(p + 8, 128, 64, 16, CU_TENSOR_MAP_SWIZZLE_128B), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(fake_driver_last_error().find("not 16-byte aligned"), std::string::npos) << fake_driver_last_error();
  EXPECT_EQ(try_encode(p, 120, 64, 16, CU_TENSOR_MAP_SWIZZLE_128B), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(fake_driver_last_error().find("a multiple of 16"), std::string::npos) << fake_driver_last_error();
  EXPECT_EQ(try_encode(p, 128, 64, 257, CU_TENSOR_MAP_SWIZZLE_NONE), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(fake_driver_last_error().find("1 to 256"), std::string::npos) << fake_driver_last_error();
  EXPECT_EQ(try_encode(p, 128, 4, 16, CU_TENSOR_MAP_SWIZZLE_NONE), CUDA_ERROR_INVALID_VALUE);  // 8-byte rows
  EXPECT_NE(fake_driver_last_error().find("rows are 8 bytes"), std::string::npos) << fake_driver_last_error();
  EXPECT_EQ(try_encode(p, 128, 128, 16, CU_TENSOR_MAP_SWIZZLE_128B),
            CUDA_ERROR_INVALID_VALUE);  // over the swizzle span
  EXPECT_EQ(try_encode(p, 128, 32, 16, CU_TENSOR_MAP_SWIZZLE_NONE), CUDA_SUCCESS);
  rt.free(p);
}

}  // namespace
}  // namespace kiln::cuda
