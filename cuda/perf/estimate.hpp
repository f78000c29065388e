// A kernel's time on a GPU, estimated without one: from the work the SIMT simulator counts
// (sim::SimStats, summed per kernel by the fake driver), the launch's shape and occupancy
// (registers from ptxas, shared memory), and the device's published limits. Each limit gives the
// time the kernel needs at least (a roofline over several limits), divided by the fraction of
// that limit kiln's kernels reach (fitted to kernel times measured on H100s and H200s by
// scripts/perf_model_calibration.py); the estimate is the largest, and the binding limit names it.
//   dram    the bytes the kernel's op must move at least (its inputs and outputs, once; no more
//           than its threads move: a gather reads part of its table)
//   l2      the global bytes its threads load and store, in whole 32-byte sectors (L1 and L2 serve
//           the reuse; a request whose lanes scatter moves a sector each)
//   tensor  mma.sync and wgmma FLOPs                } on the busiest SM: ceil(blocks / SMs) of
//   fp32    f32 adds, multiplies and FMAs           } the grid's blocks (a grid of few blocks
//   issue   warp instructions, 4 a clock an SM      } uses few SMs' rates)
//   shared  shared-memory wavefronts, 1 a clock an SM
//   latency a thread's instructions one after another (its dependent chain), a wave of resident
//           blocks at a time
//   launch  the shortest kernel a GPU runs
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace kiln::perf {

enum class Limit { dram, l2, tensor, fp32, issue, shared, latency, launch };
constexpr int kLimits = 8;
const char* limit_name(Limit l);  // "dram", "l2", ...

// A GPU's published limits, and the fraction of each that kiln's kernels reach (calibrated).
struct DeviceLimits {
  std::string name;  // "H100 SXM"
  int sms = 0;
  double clock_hz = 0;             // the boost clock the peaks below are quoted at
  double dram_bytes_per_s = 0;     // HBM
  double l2_bytes_per_s = 0;       // L2 to the SMs (not published: an assumption the fit scales)
  double bf16_tensor_flops = 0;    // dense, per second
  double tf32_tensor_flops = 0;    // dense, per second
  double fp32_flops = 0;           // non-tensor, per second
  int registers_per_sm = 65536;
  int64_t shared_bytes_per_sm = 0;  // usable by blocks (the driver reserves 1 KiB a block more)
  int threads_per_sm = 2048;
  int blocks_per_sm = 32;
  double launch_s = 0;           // the shortest kernel's time
  double latency_cycles = 0;     // cycles an instruction of a thread's chain takes (calibrated)
  std::array<double, kLimits> reached{1, 1, 1, 1, 1, 1, 1, 1};  // fraction of each limit reached
};

const DeviceLimits& h100_sxm();
const DeviceLimits& h200();
// "h100" or "h200" (any case); nullopt for another name.
std::optional<DeviceLimits> device_limits(const std::string& name);

// One launch's work (counts for the whole grid).
struct KernelWork {
  uint64_t blocks = 1;
  uint32_t threads = 32;  // a block's
  int registers = 32;     // a thread's, from ptxas (0: unknown, taken as 32)
  int64_t shared_bytes = 0;
  double instructions = 0;  // executed by all threads
  double fp32_flops = 0;
  double tensor_flops = 0;       // bf16 and f16
  double tf32_tensor_flops = 0;  // tf32 (half the rate)
  double global_bytes = 0;      // through L2: the 32-byte sectors of threads' requests, copies, tensor copies
  double shared_wavefronts = 0;
  double compulsory_bytes = 0;  // the op's inputs and outputs
};

struct KernelEstimate {
  double seconds = 0;
  Limit binding = Limit::launch;
  std::array<double, kLimits> raw_s{};    // each limit's time at the whole of it (latency: at d's cycles)
  std::array<double, kLimits> bound_s{};  // raw_s divided by the fraction of the limit reached
  int blocks_per_sm = 0;                  // resident at once (occupancy)
  double waves = 0;                       // whole waves of blocks over the SMs
};

// Blocks of `w` resident on one SM at once: threads, registers (allocated 256 a warp), shared
// memory and the block limit; at least 1.
int blocks_per_sm(const KernelWork& w, const DeviceLimits& d);
KernelEstimate estimate(const KernelWork& w, const DeviceLimits& d);

}  // namespace kiln::perf
