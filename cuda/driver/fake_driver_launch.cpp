// The fake driver's kernel launches and what they are built from: cuLaunchKernel (its checks and
// the simulator run), graphs of kernel and memset nodes, and tiled tensor maps. The other entry
// points and the table are in fake_driver.cpp; the shared device in fake_driver_state.hpp.
#include <spdlog/fmt/fmt.h>

#include <cstring>
#include <string>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/driver/fake_driver_state.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/sim/tensor_map.hpp>

namespace kiln::cuda::fake {

namespace {

constexpr uint64_t kMaxBlockThreads = 1024;
constexpr size_t kParamBufferAlignment = 8;

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
    const bool counting = d.count_bank_conflicts || d.sample_blocks > 0;
    options.count_requests = counting;
    options.sample_blocks = d.sample_blocks;
    options.check_races = d.sample_blocks == 0;
    const sim::SimStats stats = sim::simulate(*kernel.prepared, grid, block, values, d.memory, options);
    if (counting) {
      FakeKernelStats& s = d.kernel_stats[k.name];
      const auto whole = static_cast<int64_t>(grid.count());
      auto scaled = [&](int64_t count) { return count / stats.blocks * whole + count % stats.blocks * whole / stats.blocks; };
      ++s.launches;
      s.shared_requests += scaled(stats.shared_requests);
      s.shared_wavefronts += scaled(stats.shared_wavefronts);
      s.bank_conflicts += scaled(stats.bank_conflicts);
      s.instructions += scaled(stats.instructions);
      s.barriers += scaled(stats.barriers);
      s.fp32_flops += scaled(stats.fp32_flops);
      s.tensor_flops += scaled(stats.tensor_flops);
      s.tf32_tensor_flops += scaled(stats.tf32_tensor_flops);
      s.global_load_bytes += scaled(stats.global_load_bytes);
      s.global_store_bytes += scaled(stats.global_store_bytes);
      s.tensor_copy_bytes += scaled(stats.tensor_copy_bytes);
      s.global_requests += scaled(stats.global_requests);
      s.global_sectors += scaled(stats.global_sectors);
    }
  } catch (const Error& e) {
    d.sticky = CUDA_ERROR_LAUNCH_FAILED;
    d.sticky_message = "the context was lost when kernel '" + k.name + "' faulted: " + e.what();
    return fail(CUDA_ERROR_LAUNCH_FAILED, api + ": " + std::string(e.what()));
  }
  ++d.launches;
  return CUDA_SUCCESS;
}

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace kiln::cuda::fake
