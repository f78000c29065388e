// A kernel's work for the performance model (estimate.hpp) from what the fake driver counted
// while the kernel ran in the SIMT simulator (blocks sampled: cuda::fake_driver_sample_blocks).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/perf/estimate.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

namespace kiln::perf {

// The bytes op `op` must move at least: its distinct inputs and its outputs, once each.
double compulsory_bytes(const Circuit& c, const Op& op);

// One launch's work: `s`'s counts over its s.launches launches of the kernel `launch` runs (its
// grid, block and shared memory), `registers` a thread (ptxas's; 0 unknown) and the bytes its
// op must move at least (its inputs and outputs, over the op's launches).
KernelWork work_per_launch(const cuda::FakeKernelStats& s, const cuda::Launch& launch, int registers,
                           double compulsory_bytes);

struct KernelRowEstimate {
  std::string kernel, prims;  // the kernel's name; the Prims whose ops launch it
  int64_t launches = 0;       // in one run of the program
  KernelWork work;            // a launch's
  KernelEstimate estimate;    // a launch's
};
// Every kernel `program` launches, each estimated on `d` from `counted` (the fake driver's counts
// of runs of the program, blocks sampled: averaged over the launches counted); registers from
// ptxas for `sm` where it is on PATH (else unknown). Ordered by the time they take in a run,
// longest first.
std::vector<KernelRowEstimate> estimate_program(const cuda::DeviceProgram& program,
                                                const std::map<std::string, cuda::FakeKernelStats>& counted,
                                                const DeviceLimits& d, int sm);

}  // namespace kiln::perf
