// Counters of this process that show whether a step touches fresh memory: minor page faults
// (getrusage, all threads) and tensor storage allocations (HostTensor::zeros). A planned CPU
// step after the first should add neither; `kiln train --stats` and `kiln bench` print them.
#pragma once

#include <cstdint>

namespace kiln {

struct ProcessCounters {
  uint64_t minor_faults = 0;
  uint64_t storage_allocations = 0, storage_bytes = 0;

  static ProcessCounters now();
  ProcessCounters operator-(const ProcessCounters& before) const;
};

// The most memory this process has held resident so far, in bytes (getrusage's ru_maxrss).
uint64_t peak_resident_bytes();

}  // namespace kiln
