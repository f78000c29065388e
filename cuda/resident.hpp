// ResidentBuffers: device copies of persistent tensors (parameters, gradients, optimizer state)
// kept between steps, so a step on the GPU uploads only its inputs and downloads only the values
// asked for. Each copy is keyed by the engine's arena slot and knows which side is newer: a step
// that assigns a tensor replaces its device copy (the host copy is then stale until something on
// the host reads it), and a host write drops the device copy (uploaded again when next needed).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "circuit/host_tensor.hpp"
#include "cuda/runtime.hpp"

namespace kiln::cuda {

class ResidentBuffers {
 public:
  explicit ResidentBuffers(Runtime& rt) : rt_(rt) {}
  ~ResidentBuffers();
  ResidentBuffers(const ResidentBuffers&) = delete;
  ResidentBuffers& operator=(const ResidentBuffers&) = delete;

  Runtime& runtime() const { return rt_; }
  // The device copy of `key`, uploaded from `host` when there is none.
  CUdeviceptr on_device(int32_t key, const HostTensor& host);
  // `ptr` (allocated from the runtime; owned from now on) holds key's new contents, `bytes` long;
  // the previous device copy is freed and the host copy is stale.
  void replace(int32_t key, CUdeviceptr ptr, size_t bytes);
  bool host_stale(int32_t key) const;
  // Makes `host` current: downloads key's device copy into it when that copy is newer.
  void sync_host(int32_t key, const HostTensor& host);
  // The host copy was written (or the key is no longer used): the device copy is dropped.
  void forget(int32_t key);
  // Keys whose host copies are stale, in increasing order.
  std::vector<int32_t> stale_keys() const;
  size_t device_bytes() const;

 private:
  struct Entry {
    CUdeviceptr ptr = 0;
    size_t bytes = 0;
    bool host_stale = false;
  };
  Runtime& rt_;
  std::unordered_map<int32_t, Entry> entries_;
};

}  // namespace kiln::cuda
