// ProcessCounters (see process_counters.hpp).
#include <sys/resource.h>

#include <kiln/circuit/ir/host_tensor.hpp>
#include <kiln/core/process_counters.hpp>

namespace kiln {

ProcessCounters ProcessCounters::now() {
  ProcessCounters c;
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0) c.minor_faults = static_cast<uint64_t>(u.ru_minflt);
  const StorageAllocations a = host_storage_allocations();
  c.storage_allocations = a.count;
  c.storage_bytes = a.bytes;
  return c;
}

uint64_t peak_resident_bytes() {
  rusage u{};
  return getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<uint64_t>(u.ru_maxrss) * 1024 : 0;  // ru_maxrss is in KiB
}

ProcessCounters ProcessCounters::operator-(const ProcessCounters& before) const {
  return {minor_faults - before.minor_faults, storage_allocations - before.storage_allocations,
          storage_bytes - before.storage_bytes};
}

}  // namespace kiln
