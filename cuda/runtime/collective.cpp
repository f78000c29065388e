// Device collectives: the host-staged one over a CPU communicator and the NCCL one (see
// collective.hpp).
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/driver/nccl_api.hpp>
#include <kiln/cuda/runtime/collective.hpp>

namespace kiln::cuda {

namespace {

std::shared_ptr<DeviceCollective>& installed() {
  static std::shared_ptr<DeviceCollective> c;
  return c;
}
uint64_t generation = 0;  // set_device_world calls

class HostStaged final : public DeviceCollective {
 public:
  explicit HostStaged(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  std::string backend() const override { return "host memory and " + comm_.backend(); }
  bool capturable() const override { return false; }
  bool in_place() const override { return false; }
  // The same arithmetic as the all_reduce Prim's reference: the sum over ranks, then times 1/size.
  void all_reduce_mean(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream) override {
    rt.synchronize();
    staged_.resize(static_cast<size_t>(n));
    rt.download(staged_.data(), in, staged_.size() * sizeof(float));
    comm_.all_reduce_sum(staged_.data(), n);
    const float inv = 1.0f / static_cast<float>(comm_.size());
    for (float& v : staged_) v *= inv;
    rt.upload(out, staged_.data(), staged_.size() * sizeof(float));
  }
  // As the reduce_scatter and all_gather Prims' references: the communicator's in-place
  // collectives over every rank's chunks side by side.
  void reduce_scatter_mean(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream) override {
    rt.synchronize();
    staged_.resize(static_cast<size_t>(n * comm_.size()));
    rt.download(staged_.data(), in, staged_.size() * sizeof(float));
    comm_.reduce_scatter_sum(staged_.data(), n * comm_.size());
    float* own = staged_.data() + comm_.rank() * n;
    const float inv = 1.0f / static_cast<float>(comm_.size());
    for (int64_t i = 0; i < n; ++i) own[i] *= inv;
    rt.upload(out, own, static_cast<size_t>(n) * sizeof(float));
  }
  void all_gather(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream) override {
    rt.synchronize();
    staged_.resize(static_cast<size_t>(n * comm_.size()));
    rt.download(staged_.data() + comm_.rank() * n, in, static_cast<size_t>(n) * sizeof(float));
    comm_.all_gather(staged_.data(), n * comm_.size());
    rt.upload(out, staged_.data(), staged_.size() * sizeof(float));
  }

 private:
  Communicator& comm_;
  std::vector<float> staged_;
};

class NcclCollective final : public DeviceCollective {
 public:
  NcclCollective(Nccl nccl, NcclComm comm, int size, double timeout_s)
      : nccl_(std::move(nccl)), comm_(comm), size_(size), timeout_s_(timeout_s) {}
  ~NcclCollective() override {
    if (comm_) nccl_.api.ncclCommDestroy(comm_);
  }
  int size() const override { return size_; }
  // Forgets the communicator, which a helper thread may still be using (a first all-reduce past
  // the timeout): the destructor leaves it alone.
  void abandon() { comm_ = nullptr; }
  std::string backend() const override {
    return fmt::format("NCCL {}.{}.{} ({})", nccl_.version / 10000, nccl_.version / 100 % 100, nccl_.version % 100,
                       nccl_.library);
  }
  bool capturable() const override { return true; }
  // In place, after the lowering's copy kernel: out of place (in != out), the loss that ends a
  // bucket of 816000 gradients came back as 0 on an H100 with NCCL 2.28.3 over one rank while
  // the gradients were right (GpuCollective.NcclInPlaceLeavesEveryElementRight prints that case).
  bool in_place() const override { return true; }
  void all_reduce_mean(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream stream) override {
    if (!comm_) throw Error("NCCL: the communicator was aborted after an earlier error");
    rt.make_current();
    check(nccl_.api.ncclAllReduce(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out),
                                  static_cast<size_t>(n), NCCL_FLOAT32, NCCL_AVG, comm_, stream),
          fmt::format("ncclAllReduce of {} floats", n));
  }
  // Out of place (NCCL's in-place forms would need the chunk at the input's rank offset). These
  // two have not run on a GPU yet: `kiln train --shard-optimizer` takes them only when asked
  // (--collectives nccl).
  void reduce_scatter_mean(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream stream) override {
    if (!comm_) throw Error("NCCL: the communicator was aborted after an earlier error");
    rt.make_current();
    check(nccl_.api.ncclReduceScatter(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out),
                                      static_cast<size_t>(n), NCCL_FLOAT32, NCCL_AVG, comm_, stream),
          fmt::format("ncclReduceScatter of {} floats a rank", n));
  }
  void all_gather(Runtime& rt, CUdeviceptr in, CUdeviceptr out, int64_t n, CUstream stream) override {
    if (!comm_) throw Error("NCCL: the communicator was aborted after an earlier error");
    rt.make_current();
    check(nccl_.api.ncclAllGather(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out),
                                  static_cast<size_t>(n), NCCL_FLOAT32, comm_, stream),
          fmt::format("ncclAllGather of {} floats a rank", n));
  }
  // A rank that died or hangs leaves its peers' NCCL kernels spinning: the wait ends in an error
  // after the timeout (NCCL aborted, which frees the device) or at NCCL's asynchronous error.
  void synchronize(Runtime& rt) override {
    try {
      wait_within(
          rt.detached_synchronize(), timeout_s_,
          [this] {
            NcclResult async = NCCL_SUCCESS;
            if (comm_ && nccl_.api.ncclCommGetAsyncError(comm_, &async) == NCCL_SUCCESS && async != NCCL_SUCCESS &&
                async != NCCL_IN_PROGRESS)
              abort_with(fmt::format("NCCL reported an asynchronous error: {}", nccl_.api.ncclGetErrorString(async)));
          },
          [this] {
            abort_with(
                fmt::format("the step's work, its collectives included, took more than {:.0f} s (a rank died "
                            "or hangs; KILN_COLLECTIVE_TIMEOUT sets the limit)",
                            timeout_s_));
          });
    } catch (const Error&) {
      if (comm_) rt.synchronize();  // a driver error: reported by the runtime (a lost context)
      throw;
    }
  }

 private:
  [[noreturn]] void abort_with(const std::string& why) {
    if (comm_) nccl_.api.ncclCommAbort(comm_);
    comm_ = nullptr;
    throw Error(fmt::format("NCCL collective on {} ranks: {}", size_, why));
  }
  void check(NcclResult r, const std::string& what) {
    if (r != NCCL_SUCCESS) throw Error(fmt::format("{}: NCCL error {}: {}", what, r, nccl_.api.ncclGetErrorString(r)));
  }

  Nccl nccl_;
  NcclComm comm_ = nullptr;
  int size_ = 1;
  double timeout_s_ = 300;
};

}  // namespace

void run_collective(Runtime& rt, const DeviceCommand& c, CUstream stream) {
  DeviceCollective& d = *c.collective;
  const auto floats = static_cast<int64_t>(c.bytes / sizeof(float));  // of the output
  switch (c.rank_collective) {
    case RankCollective::all_reduce_mean: d.all_reduce_mean(rt, c.src, c.dst, floats, stream); return;
    case RankCollective::reduce_scatter_mean: d.reduce_scatter_mean(rt, c.src, c.dst, floats, stream); return;
    case RankCollective::all_gather: d.all_gather(rt, c.src, c.dst, floats / d.size(), stream); return;
    case RankCollective::none: break;
  }
  throw Error("run_collective: a command with a device collective but no collective named");
}

void wait_within(const std::function<void()>& wait, double timeout_s, const std::function<void()>& check,
                 const std::function<void()>& on_timeout) {
  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> finished = done->get_future();
  std::thread([wait, done] {
    try {
      wait();
      done->set_value("");
    } catch (const std::exception& e) {
      done->set_value(e.what());
    } catch (...) {
      done->set_value("the wait failed (an exception of unknown type)");
    }
  }).detach();
  const auto start = std::chrono::steady_clock::now();
  while (finished.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    check();
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      on_timeout();
      throw Error("wait_within: on_timeout returned");  // it must throw; never wait on
    }
  }
  if (const std::string error = finished.get(); !error.empty()) throw Error(error);
}

DeviceCollective* device_world() { return installed().get(); }

void set_device_world(std::shared_ptr<DeviceCollective> c) {
  installed() = std::move(c);
  ++generation;
}

uint64_t device_world_generation() { return generation; }

std::shared_ptr<DeviceCollective> host_staged_collective(Communicator& comm) {
  return std::make_shared<HostStaged>(comm);
}

std::shared_ptr<DeviceCollective> connect_nccl(Runtime& rt, Communicator& comm, double timeout_s) {
  if (!rt.capture_supported())
    throw Error("NCCL: the CUDA driver (" + std::string(rt.fake() ? "the fake driver" : "libcuda") +
                ") lacks stream capture, which puts NCCL's collectives inside kiln's step graphs");
  std::string why;
  std::optional<Nccl> nccl = load_nccl(&why);
  if (!nccl) throw Error("NCCL: " + why);
  return connect_nccl_library(std::move(*nccl), rt, comm, timeout_s);
}

namespace {

// What a blocking NCCL call returned: its result and the communicator it made, if any.
struct NcclOutcome {
  NcclResult result = NCCL_SUCCESS;
  NcclComm made = nullptr;
};

// An NCCL call that blocks until every rank has come (the communicator's set-up, the first
// all-reduce), on a helper thread watched for timeout_s. On the timeout, `on_timeout` runs and
// its message is thrown; a communicator the call made is aborted, here when it came back before
// the timeout was noticed, else by the helper when it does (a late rank's half-made state is
// never used). The helper shares only `state` and copies with this frame, which may be gone when
// it returns.
NcclOutcome call_within(const NcclApi& api, double timeout_s, const std::function<NcclOutcome()>& call,
                        const std::function<std::string()>& on_timeout) {
  struct State {
    std::mutex m;
    bool abandoned = false;
    NcclOutcome outcome;
  };
  auto state = std::make_shared<State>();
  wait_within(
      [state, call, abort = api.ncclCommAbort] {
        const NcclOutcome outcome = call();
        std::lock_guard<std::mutex> lock(state->m);
        if (state->abandoned && outcome.made) abort(outcome.made);
        if (!state->abandoned) state->outcome = outcome;
      },
      timeout_s, [] {},
      [&] {
        std::lock_guard<std::mutex> lock(state->m);
        state->abandoned = true;
        if (state->outcome.made) api.ncclCommAbort(state->outcome.made);  // came back just now
        throw Error(on_timeout());
      });
  std::lock_guard<std::mutex> lock(state->m);
  return state->outcome;
}

}  // namespace

std::shared_ptr<DeviceCollective> connect_nccl_library(Nccl nccl, Runtime& rt, Communicator& comm, double timeout_s) {
  NcclUniqueId id{};
  if (comm.rank() == 0) {
    const NcclResult r = nccl.api.ncclGetUniqueId(&id);
    if (r != NCCL_SUCCESS) throw Error(fmt::format("NCCL: ncclGetUniqueId failed: {}", nccl.api.ncclGetErrorString(r)));
  }
  comm.broadcast(&id, sizeof id, 0);
  const NcclApi api = nccl.api;
  const int size = comm.size(), rank = comm.rank();
  const std::string who = fmt::format("rank {} of {}", rank, size);
  const std::string hint =
      fmt::format("within {:g} s (a rank died or never started; KILN_COLLECTIVE_TIMEOUT sets the limit)", timeout_s);
  // The helpers make rt's context current on their own thread (NCCL works on the calling
  // thread's device).
  const NcclOutcome init = call_within(
      api, timeout_s,
      [api, size, id, rank, make_current = rt.detached_make_current()] {
        make_current();
        NcclOutcome out;
        out.result = api.ncclCommInitRank(&out.made, size, id, rank);
        return out;
      },
      [&] { return fmt::format("NCCL: ncclCommInitRank ({}) did not finish {}", who, hint); });
  if (init.result != NCCL_SUCCESS)
    throw Error(fmt::format("NCCL: ncclCommInitRank ({}) failed: {}", who, api.ncclGetErrorString(init.result)));
  const NcclComm c = init.made;
  auto collective = std::make_shared<NcclCollective>(std::move(nccl), c, size, timeout_s);
  // The first all-reduce opens the connections between ranks and blocks until the others reach
  // theirs: run here, outside any graph, in place on four floats, within the timeout.
  rt.make_current();
  const CUdeviceptr probe = rt.alloc(4 * sizeof(float));
  const std::vector<float> zeros(4, 0.0f);
  rt.upload(probe, zeros.data(), zeros.size() * sizeof(float));
  // On the timeout the probe stays allocated: the abandoned all-reduce may still be reading it.
  const NcclOutcome first = call_within(
      api, timeout_s,
      [api, c, probe, sync = rt.detached_synchronize(), make_current = rt.detached_make_current()] {
        make_current();
        NcclOutcome out;
        out.result = api.ncclAllReduce(reinterpret_cast<const void*>(probe), reinterpret_cast<void*>(probe), 4,
                                       NCCL_FLOAT32, NCCL_AVG, c, nullptr);
        if (out.result == NCCL_SUCCESS) sync();
        return out;
      },
      [&] {
        // NCCL's calls on one communicator are not thread-safe and the helper may still be inside
        // this one: the communicator is left to it (and to the process's exit), neither aborted
        // nor destroyed here.
        collective->abandon();
        return fmt::format("NCCL: the first all-reduce ({}) did not finish {}", who, hint);
      });
  rt.free(probe);
  if (first.result != NCCL_SUCCESS)
    throw Error(fmt::format("NCCL: the first all-reduce ({}) failed: {}", who, api.ncclGetErrorString(first.result)));
  return collective;
}

CollectiveChoice parse_collective_choice(const std::string& text) {
  if (text == "auto") return CollectiveChoice::automatic;
  if (text == "nccl") return CollectiveChoice::nccl;
  if (text == "host") return CollectiveChoice::host;
  throw Error("--collectives: expected auto, nccl, host or noop, received '" + text + "'");
}

std::shared_ptr<DeviceCollective> connect_device_collective(Runtime& rt, Communicator& comm, double timeout_s,
                                                            CollectiveChoice choice) {
  if (choice == CollectiveChoice::host) return host_staged_collective(comm);
  if (choice == CollectiveChoice::nccl) return connect_nccl(rt, comm, timeout_s);
  // Every rank must pick the same backend: NCCL only where it loads on all of them. (A rank
  // whose NCCL then fails to connect throws, and the job ends.)
  std::string why;
  const bool usable_here = rt.capture_supported() && load_nccl(&why).has_value();
  if (!rt.capture_supported()) why = "the CUDA driver lacks stream capture";
  double usable = usable_here ? 1.0 : 0.0;
  comm.all_reduce_sum(&usable, 1);
  if (usable == comm.size()) return connect_nccl(rt, comm, timeout_s);
  spdlog::warn(
      "NCCL {}; averaging gradients through host memory instead (slower: the step synchronizes and is not "
      "replayed as one graph)",
      usable_here ? fmt::format("is missing on {} of {} ranks", comm.size() - static_cast<int>(usable), comm.size())
                  : "is not usable here: " + why);
  return host_staged_collective(comm);
}

}  // namespace kiln::cuda
