// The fake driver: the DriverApi table implemented on the CPU. Every call is checked (handles,
// allocation bounds, double frees, parameter buffer size and alignment against the kernel's
// parameters, launch dimensions and shared memory) and a launched kernel runs in the SIMT
// simulator on the fake device's memory; graphs (chains of kernel and memset nodes) run their
// nodes in order. As the real driver: a thread must make the context current before using it,
// and a kernel fault loses the context (every later call fails). It reports itself as an sm_90
// device. It does not
// parse PTX: a PTX text compiles when Driver::observe_kernel was given its IR, and cuLinkComplete
// returns a "fake cubin" ("KILNFAKECUBIN\n", the PTX text, a NUL) that loads the same way.
#pragma once

#include <map>
#include <string>

#include <kiln/cuda/driver/driver_api.hpp>
#include <kiln/cuda/sim/simulator.hpp>

namespace kiln::cuda {

// The fake driver's table. All tables share one process-wide fake device.
Driver fake_driver();

// The fake device's state, for tests: its memory and counters.
struct FakeDeviceState {
  sim::DeviceMemory* memory;
  int64_t launches;
  int64_t modules_loaded;  // cuModuleLoadDataEx calls that succeeded
  int64_t jit_compiles;    // PTX compilations: cuLinkAddData of PTX, cuModuleLoadDataEx of PTX text
  int64_t graph_launches;  // cuGraphLaunch calls that succeeded (their kernels count as launches too)
};
FakeDeviceState fake_device_state();

// Test hook: the next PTX compilation (cuLinkAddData of PTX, or cuModuleLoadDataEx of PTX text)
// fails with CUDA_ERROR_INVALID_PTX and `log` as the driver's error log.
void fake_driver_fail_next_jit(std::string log);

// Test hook: the fake device after a kernel fault as a new process would find it (the fault
// is sticky: every later call fails until then).
void fake_driver_recover();

// Tools and tests: from now on (until switched off) every launch counts its shared-memory bank
// conflicts and the instructions it executed in the simulator (slower), summed per kernel name.
// With blocks sampled (fake_driver_sample_blocks) the counts are the sampled blocks' scaled to the
// whole grid (count * grid blocks / blocks run).
struct FakeKernelStats {
  int64_t launches = 0;
  int64_t shared_requests = 0;    // warp-level shared-memory requests
  int64_t shared_wavefronts = 0;  // the wavefronts they took
  int64_t bank_conflicts = 0;     // wavefronts beyond one per request phase
  int64_t instructions = 0;       // kernel-IR instructions executed, by all threads
  int64_t barriers = 0;           // block-wide barrier completions
  int64_t fp32_flops = 0;         // sim::SimStats' work counts
  int64_t tensor_flops = 0;
  int64_t tf32_tensor_flops = 0;
  int64_t global_load_bytes = 0;
  int64_t global_store_bytes = 0;
  int64_t tensor_copy_bytes = 0;
  int64_t global_requests = 0;
  int64_t global_sectors = 0;
};
void fake_driver_count_bank_conflicts(bool on);
// Tools: from now on (until 0) every launch runs only `blocks` blocks spread over its grid
// (sim::SimOptions::sample_blocks), without race checks, and its work is counted as above (bank
// conflicts included). What the other blocks would write is not written: the values are
// meaningless, the counts of kernels whose work does not depend on them are not.
void fake_driver_sample_blocks(uint64_t blocks);
// fake_driver_sample_blocks(blocks) for its lifetime (0: nothing), off again however it ends.
class ScopedSampledBlocks {
 public:
  explicit ScopedSampledBlocks(uint64_t blocks) : on_(blocks > 0) {
    if (on_) fake_driver_sample_blocks(blocks);
  }
  ~ScopedSampledBlocks() {
    if (on_) fake_driver_sample_blocks(0);
  }
  ScopedSampledBlocks(const ScopedSampledBlocks&) = delete;
  ScopedSampledBlocks& operator=(const ScopedSampledBlocks&) = delete;

 private:
  bool on_;
};
std::map<std::string, FakeKernelStats> fake_driver_kernel_stats();

// The message of the last failed fake-driver call (the simulator's report for a failed launch),
// empty when none failed; the runtime puts it in its exceptions.
std::string fake_driver_last_error();

}  // namespace kiln::cuda
