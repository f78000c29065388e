// Collectives over device memory, for data-parallel training on GPUs: the all_reduce op's
// lowering (cuda/lower/all_reduce.cpp) marks its output to be averaged over the ranks, and the
// device program (device_program.hpp) hands that buffer to the process's DeviceCollective.
//   NCCL         device to device, enqueued on a stream: a CUDA graph captures it, so the
//                averaging sits inside the step's graph (the default where libnccl loads).
//   host staged  download, the CPU communicator's all-reduce (world(): MPI), upload: works with
//                any GPU and the fake driver, but synchronizes and leaves the step unreplayed.
// A single process with no device collective installed averages over one rank: a copy.
// ZeRO-1's reduce_scatter and all_gather ops over several ranks (cuda/lower/all_reduce.cpp) are
// the collective's reduce_scatter_mean and all_gather, always from input into output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/cuda/driver/nccl_api.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

namespace kiln::cuda {

class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "NCCL 2.28.3 (libnccl.so.2)", "host memory and MPI (...)"
  // Whether all_reduce_mean only enqueues device work on `stream` (then a graph may capture it).
  virtual bool capturable() const = 0;
  // Whether all_reduce_mean is called with in == out only (the lowering's copy kernel runs first).
  virtual bool in_place() const = 0;
  // out[0, n) becomes the element-wise mean over the ranks of in[0, n) (f32 on rt's device;
  // in == out allowed), ordered after the work before it on `stream` (nullptr: the legacy
  // default stream kiln launches on).
  virtual void all_reduce_mean(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream stream) = 0;
  // out[0, n) becomes this rank's chunk (rank r: [r n, (r + 1) n)) of the element-wise mean over
  // the ranks of in[0, size() n); in != out. Ordered on `stream` as all_reduce_mean.
  virtual void reduce_scatter_mean(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream stream) = 0;
  // out[r n, (r + 1) n) becomes rank r's in[0, n), for every rank r; in != out.
  virtual void all_gather(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream stream) = 0;
  // Waits for the device's work; NCCL's waits at most its timeout for the step's work (the other
  // ranks' part included), then throws kiln::Error saying so, and the communicator is unusable
  // after that. (Connecting and NCCL's first call are not timed: a rank that dies then hangs the
  // others until the launcher ends them.)
  virtual void synchronize(Runtime& rt) { rt.synchronize(); }
};

// Runs command `c`'s collective (c.collective, of kind c.rank_collective, from c.src into c.dst,
// c.bytes of output) on `stream`.
void run_collective(Runtime& rt, const DeviceCommand& c, CUstream stream);

// Runs `wait` (a blocking wait: the driver's synchronize) on a helper thread and returns when it
// does, with its error as kiln::Error; meanwhile calls `check` every 100 ms (it may throw), and
// `on_timeout` (which throws) once timeout_s have passed. The wait ends with the work (a poll
// ends up to a sleep later), and the calling thread stays free to watch the timeout. The helper
// is detached and may outlive the call: `wait` must own what it uses (Runtime::detached_synchronize).
void wait_within(const std::function<void()>& wait, double timeout_s, const std::function<void()>& check,
                 const std::function<void()>& on_timeout);

// The device collective device programs use; nullptr (the default) for one process. With one
// installed, an all_reduce op runs as its collective (after the lowering's copy for an in-place
// one); without, as the copy alone (one process).
DeviceCollective* device_world();
void set_device_world(std::shared_ptr<DeviceCollective> c);
// Counts set_device_world calls: a graph captured with one collective is never replayed with
// another (even one at the same address).
uint64_t device_world_generation();

// Averages through `comm` (world() by default) with a copy through host memory.
std::shared_ptr<DeviceCollective> host_staged_collective(Communicator& comm);
// An NCCL communicator over comm's ranks on rt's device: rank 0's unique id reaches the others
// by comm.broadcast. Throws kiln::Error naming what is missing (libnccl, stream capture) or
// what NCCL said. Every wait is bounded by `timeout_s`: the communicator's set-up and its first
// all-reduce (which opens the connections between ranks; both block until every rank has come)
// run on helper threads and end in an error when they outlast it, and the collectives wait at
// most that long in synchronize (then NCCL is aborted).
std::shared_ptr<DeviceCollective> connect_nccl(Runtime& rt, Communicator& comm, double timeout_s);
// connect_nccl past its checks of the driver, with the library given: a loaded libnccl, or a
// test's table of entry points.
std::shared_ptr<DeviceCollective> connect_nccl_library(Nccl nccl, Runtime& rt, Communicator& comm, double timeout_s);
// Which device collective a data-parallel run on the GPU takes (`--collectives`): automatic
// (NCCL where it loads on every rank, agreed through comm, else host staged with a warning
// saying why), or one of them forced.
enum class CollectiveChoice { automatic, nccl, host };
CollectiveChoice parse_collective_choice(const std::string& text);  // "auto" | "nccl" | "host"
// What `kiln train` installs for a data-parallel run on the GPU.
std::shared_ptr<DeviceCollective> connect_device_collective(Runtime& rt, Communicator& comm, double timeout_s,
                                                            CollectiveChoice choice = CollectiveChoice::automatic);

}  // namespace kiln::cuda
