// ResidentBuffers: the device side of persistent tensors and which copy is newer.
#include <algorithm>
#include <string>
#include <utility>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/runtime/resident.hpp>

namespace kiln::cuda {

ResidentBuffers::~ResidentBuffers() {
  for (auto& [key, e] : entries_) {
    try {
      rt_.free(e.ptr);
      rt_.free(e.spare);
    } catch (...) {  // a destructor frees what it can
    }
  }
}

CUdeviceptr ResidentBuffers::on_device(int32_t key, const HostTensor& host) {
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second.ptr;
  Entry e;
  e.bytes = std::max<size_t>(host.nbytes(), 4);
  e.ptr = rt_.alloc(e.bytes);
  try {
    rt_.upload(e.ptr, host.raw(), host.nbytes());
  } catch (...) {
    rt_.free(e.ptr);
    throw;
  }
  entries_[key] = e;
  return e.ptr;
}

CUdeviceptr ResidentBuffers::spare(int32_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) throw Error("resident buffers: no device copy of slot " + std::to_string(key));
  if (!it->second.spare) it->second.spare = rt_.alloc(it->second.bytes);
  return it->second.spare;
}

void ResidentBuffers::flip(int32_t key) {
  Entry& e = entries_.at(key);
  std::swap(e.ptr, e.spare);
  e.host_stale = true;
}

void ResidentBuffers::sync_host(int32_t key, const HostTensor& host) {
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.host_stale) return;
  rt_.download(host.raw(), it->second.ptr, host.nbytes());
  it->second.host_stale = false;
}

void ResidentBuffers::forget(int32_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  rt_.free(it->second.ptr);
  rt_.free(it->second.spare);
  entries_.erase(it);
}

std::vector<int32_t> ResidentBuffers::stale_keys() const {
  std::vector<int32_t> keys;
  for (const auto& [key, e] : entries_)
    if (e.host_stale) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace kiln::cuda
