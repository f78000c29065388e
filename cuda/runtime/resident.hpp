// ResidentBuffers: device copies of persistent tensors (parameters, gradients, optimizer state)
// kept between steps, so a step on the GPU uploads only its inputs and downloads only the values
// asked for. Each copy is keyed by the engine's arena slot and knows which side is newer: a step
// that assigns a tensor writes its spare buffer and flips it in (the host copy is then stale
// until something on the host reads it), and a host write drops the device copies (uploaded
// again when next needed). Two fixed buffers per assigned tensor: the addresses a step uses
// alternate between two sets, and no step allocates once both exist.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <kiln/circuit/ir/host_tensor.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

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
  // The second buffer of `key` (allocated on first use, as long as the device copy): a step
  // writes the tensor's next contents there while the current copy may still be read.
  CUdeviceptr spare(int32_t key);
  // After a step succeeded: key's spare becomes its device copy and the old copy the spare (so
  // a failed step, which never flips, leaves the copy as it was); the host copy is stale.
  void flip(int32_t key);
  // Makes `host` current: downloads key's device copy into it when that copy is newer.
  void sync_host(int32_t key, const HostTensor& host);
  // The host copy was written (or the key is no longer used): the device copy is dropped.
  void forget(int32_t key);
  // Keys whose host copies are stale, in increasing order.
  std::vector<int32_t> stale_keys() const;

 private:
  struct Entry {
    CUdeviceptr ptr = 0, spare = 0;
    size_t bytes = 0;
    bool host_stale = false;
  };
  Runtime& rt_;
  std::unordered_map<int32_t, Entry> entries_;
};

}  // namespace kiln::cuda
