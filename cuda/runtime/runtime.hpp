// The CUDA runtime of kiln: one device, one context, a caching memory arena, modules compiled
// from kiln's own PTX (cached in memory and on disk), and checked launches. It runs over a
// Driver table: the real driver (libcuda loaded at run time) or the fake driver, which runs
// kernels in the SIMT simulator so that everything here is tested without a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <kiln/circuit/ir/target.hpp>
#include <kiln/cuda/driver/driver_api.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/lower/rank_collective.hpp>

namespace kiln::cuda {

using Dim3 = kir::Dim3;
class DeviceCollective;

struct RuntimeOptions {
  // Directory of the on-disk module cache; empty: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln,
  // else ~/.cache/kiln. "off" disables the disk cache.
  std::string cache_dir;
  // Directory to write every kernel's PTX to; empty: $KILN_PTX_DUMP (unset: no dump).
  std::string ptx_dump_dir;
  // Blocks of exactly the requested size, reused only for equal sizes: with the fake driver the
  // simulator's bounds checks then see every byte past an end, which a size class's slack hides.
  bool exact_block_sizes = false;
};

struct RuntimeStats {
  int64_t launches = 0;
  int64_t modules_compiled = 0;   // PTX JIT-compiled by the driver
  int64_t disk_cache_hits = 0;    // modules loaded from a cached cubin
  int64_t memory_cache_hits = 0;  // function() calls served from memory
  int64_t corrupt_cache_entries = 0;
  int64_t device_allocations = 0;  // cuMemAlloc calls made by the arena
  int64_t graphs_built = 0, graph_launches = 0;
  size_t bytes_in_use = 0, peak_bytes_in_use = 0;
  size_t bytes_uploaded = 0, bytes_downloaded = 0;  // host <-> device copies
  int64_t uploads = 0, downloads = 0;               // ... and how many (each a driver call)
  int64_t tensor_maps_encoded = 0;                  // cuTensorMapEncodeTiled calls
};

// A loaded kernel: the driver function and the IR it was printed from (its parameter types
// define how launch() packs arguments).
struct LoadedKernel {
  CUfunction fn = nullptr;
  const kir::Kernel* kernel = nullptr;
  int registers = -1;  // from the driver, -1 when unknown
};

// One piece of a device program's work, in order: zero `bytes` at `dst` (no kernel, no
// collective), run `collective`'s `rank_collective` from `src` into the `bytes` at `dst`
// (cuda/runtime/collective.hpp's run_collective), or launch `kernel` over grid x block with
// `args` (one raw value per parameter, as Runtime::launch takes).
struct DeviceCommand {
  const LoadedKernel* kernel = nullptr;
  DeviceCollective* collective = nullptr;
  RankCollective rank_collective = RankCollective::none;  // which of its collectives
  CUdeviceptr src = 0;                                    // a collective's input
  uint64_t generation = 0;  // a collective's device_world_generation()
  CUdeviceptr dst = 0;
  size_t bytes = 0;
  Dim3 grid, block;
  std::vector<uint64_t> args;
  int tag = -1;  // the caller's, for its errors (a device program: the op index, -1 none)
};

class Runtime {
 public:
  // Initializes the driver, takes device 0's primary context and logs device, driver and arch.
  // Throws kiln::Error (with the driver's message) when any of that fails.
  explicit Runtime(Driver driver, RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The process's runtime over the real driver, created on first use; nullptr when no usable
  // GPU exists (then *why, when given, says why: no libcuda, no device, ...).
  static Runtime* system(std::string* why = nullptr);

  int sm() const { return sm_; }  // compute capability as 10*major+minor (80, 90)
  int ptx_target() const;         // the PTX target used for this device: 80 or 90
  const std::string& device_name() const { return device_name_; }
  int driver_version() const { return driver_version_; }
  bool fake() const { return driver_.fake; }
  bool exact_block_sizes() const { return options_.exact_block_sizes; }
  const DriverApi& api() const { return driver_.api; }

  // Memory: a caching arena over cuMemAlloc (freed blocks are kept for reuse by size class).
  // Sizes round up to a class (unless options.exact_block_sizes): powers of two from 256 bytes to 1 MiB, then multiples
  // of 1 MiB; bytes_in_use counts classes. When cuMemAlloc runs out, the cached free blocks are released and it is
  // tried once more. free(0) does nothing; freeing anything but a live block throws.
  CUdeviceptr alloc(size_t bytes);
  void free(CUdeviceptr ptr);
  void upload(CUdeviceptr dst, const void* src, size_t bytes);
  void download(void* dst, CUdeviceptr src, size_t bytes);
  void copy(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
  void memset_zero(CUdeviceptr dst, size_t bytes);

  // The kernel compiled and loaded: from memory, else from the disk cache (a cubin keyed by
  // hash(PTX text, target, driver version, generator version, fake or real driver), written
  // atomically with a checksummed header; a corrupt entry is detected, counted and rebuilt),
  // else JIT-compiled from PTX (the failing PTX is written to a file and the driver's error log
  // is in the thrown message). The runtime keeps a copy of the IR: the LoadedKernel's `kernel`
  // points at it and lives as long as the runtime.
  LoadedKernel load(const kir::Kernel& k);

  // A tensor map for cp.async.bulk.tensor (cuTensorMapEncodeTiled) over the global `address`:
  // dims innermost first, byte strides for dims 1.., the box a copy moves, in 128-byte swizzled
  // rows or plain ones, zeros outside the tensor. Throws naming `what` where the driver lacks the
  // entry point (CUDA 12.0) or refuses the arguments.
  CUtensorMap encode_tensor_map(const std::string& what, CUdeviceptr address, uint32_t element_bytes,
                                const std::vector<uint64_t>& dims, const std::vector<uint64_t>& strides,
                                const std::vector<uint32_t>& box, bool swizzle_128);

  // Packs `args` (one raw value per kernel parameter, in the parameter's type; a 32-bit one takes
  // the low 32 bits) into one buffer with natural alignment and launches; checks the launch's
  // result (with the fake driver, a fault the simulator found fails the launch itself).
  void launch(const LoadedKernel& k, Dim3 grid, Dim3 block, const std::vector<uint64_t>& args);
  void synchronize();
  // Makes the context current on the calling thread, for libraries that run on it (NCCL).
  void make_current() const { enter(); }
  // A blocking wait for the device's work that touches no state of the runtime (copies of the
  // context and of two driver entry points), for a helper thread that may outlive the call that
  // started it (cuda/runtime/collective.hpp's wait_within); throws on a driver error, after
  // which the caller's own synchronize() reports it properly.
  std::function<void()> detached_synchronize() const;
  // Makes the runtime's context current on the calling thread, touching no state of the runtime
  // (the same copies), for such a helper thread before it calls a library that works on the
  // current context (NCCL).
  std::function<void()> detached_make_current() const;

  // CUDA graphs, when the driver has them: `commands` recorded as one graph (a chain: each node
  // after the one before) and launched with one call. Every address is baked in.
  bool graphs_supported() const { return driver_.api.cuGraphCreate != nullptr; }
  // Whether a graph may hold collectives: their library's calls are captured from a stream into
  // a child graph (the real driver; the fake one runs collectives between graphs' commands).
  bool capture_supported() const { return graphs_supported() && driver_.api.cuStreamBeginCapture != nullptr; }
  struct Graph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    int64_t kernels = 0;
  };
  Graph make_graph(const std::vector<DeviceCommand>& commands);
  void launch(const Graph& graph);
  void destroy(Graph& graph);  // a destroyed (or empty) graph may be destroyed again

  const RuntimeStats& stats() const { return stats_; }
  // True after a kernel fault lost the context: every call fails; only a new process recovers.
  bool lost() const { return !lost_.empty(); }
  // Expires when the runtime is destroyed: an object holding device memory of this runtime
  // (a compiled program's workspace) that may outlive it frees that memory only while it lives.
  std::weak_ptr<const void> lifetime() const { return lifetime_; }

 private:
  // Throws on failure. A sticky error (a kernel fault) loses the context: the runtime then
  // refuses every later call with the same message, without calling the driver again.
  void check(CUresult r, const std::string& what) const;
  // Before each driver call: refuses a lost context, and makes the context current on the
  // calling thread (the driver keeps a current context per thread; the engine is per thread).
  void enter() const;
  // The launch parameters packed as the driver wants them in `extra`: each at its natural
  // alignment in 8-byte words; returns the byte size. `what` names the launch in errors.
  size_t pack_params(const kir::Kernel& kernel, const std::vector<uint64_t>& args, std::vector<uint64_t>& words,
                     const std::string& what) const;
  std::string error_text(CUresult r) const;  // name, the driver's description, the fake's message
  std::string cache_path(uint64_t key) const;
  CUmodule load_module(const kir::Kernel& k, const std::string& ptx, uint64_t key);
  std::string jit_compile(const kir::Kernel& k, const std::string& ptx, uint64_t key);
  void write_cache(const std::string& path, uint64_t key, const std::string& image);
  void release_free_blocks();
  // A child graph node holding c's collective, captured from a stream of its own.
  CUgraphNode add_collective_node(CUgraph graph, CUgraphNode after, const DeviceCommand& c, size_t i);

  Driver driver_;
  RuntimeOptions options_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  int sm_ = 0;
  int driver_version_ = 0;
  std::string device_name_;
  RuntimeStats stats_;
  bool cache_write_warned_ = false;  // an unwritable cache directory is reported once
  mutable std::string lost_;         // why the context is lost; empty while it is usable

  std::multimap<size_t, CUdeviceptr> free_blocks_;       // size class -> free block
  std::unordered_map<CUdeviceptr, size_t> live_blocks_;  // block -> size class
  struct Module {
    CUmodule module = nullptr;
    std::unique_ptr<kir::Kernel> ir;  // the runtime's copy, which kernel.kernel points at
    LoadedKernel kernel;
  };
  std::unordered_map<std::string, Module> modules_;  // by PTX text
  std::shared_ptr<const void> lifetime_ = std::make_shared<int>(0);
};

// The Target of rt's device (its sm, fake or real) with the default choices.
Target device_target(const Runtime& rt);

}  // namespace kiln::cuda
