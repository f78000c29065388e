// The MPI communicator: non-blocking collectives (MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier)
// polled against a deadline, so that a rank that died or hangs stops the others with an error
// instead of a hang; the launcher (mpirun) then ends the job. Without MPI at build time,
// connect_mpi says how to get it.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/error.hpp>

#if KILN_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (the C++ bindings need a library of their own)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace kiln {

#if KILN_HAVE_MPI
namespace {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) : timeout_s_(timeout_s) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      std::atexit(finalize);
      if (provided < MPI_THREAD_FUNNELED)
        throw Error("the MPI library offers no MPI_THREAD_FUNNELED (kiln's OpenMP threads run beside MPI)");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    library_ = std::string(version, static_cast<size_t>(length));
    if (const size_t cut = library_.find_first_of(",\n"); cut != std::string::npos) library_.resize(cut);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "MPI (" + library_ + ")"; }
  void all_reduce_sum(float* data, int64_t n) override { all_reduce(data, n, MPI_FLOAT, "f32"); }
  void all_reduce_sum(double* data, int64_t n) override { all_reduce(data, n, MPI_DOUBLE, "f64"); }
  void broadcast(void* data, int64_t n, int root) override {
    for (int64_t at = 0; at < n; at += kChunk) {
      MPI_Request r;
      check(MPI_Ibcast(static_cast<char*>(data) + at, static_cast<int>(std::min(kChunk, n - at)), MPI_BYTE, root,
                       MPI_COMM_WORLD, &r),
            "MPI_Ibcast");
      wait(r, fmt::format("broadcast of {} bytes from rank {}", n, root));
    }
  }
  void barrier() override {
    MPI_Request r;
    check(MPI_Ibarrier(MPI_COMM_WORLD, &r), "MPI_Ibarrier");
    wait(r, "barrier");
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return on OpenMPI; this keeps the promise elsewhere
  }

 private:
  static constexpr int64_t kChunk = int64_t{1} << 30;  // MPI counts are int

  static void finalize() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  void check(int status, const char* call) const {
    if (status == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(status, text, &length);
    throw Error(fmt::format("{} failed on rank {}: {}", call, rank_, std::string(text, static_cast<size_t>(length))));
  }
  template <class T>
  void all_reduce(T* data, int64_t n, MPI_Datatype type, const char* dtype) {
    for (int64_t at = 0; at < n; at += kChunk) {
      MPI_Request r;
      check(MPI_Iallreduce(MPI_IN_PLACE, data + at, static_cast<int>(std::min(kChunk, n - at)), type, MPI_SUM,
                           MPI_COMM_WORLD, &r),
            "MPI_Iallreduce");
      wait(r, fmt::format("all-reduce of {} {} values", n, dtype));
    }
  }
  // Polls until the request completes, spinning briefly and then sleeping (the ranks' OpenMP
  // teams may share the cores), up to the timeout.
  void wait(MPI_Request& r, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_)
        throw Error(fmt::format(
            "{} on rank {} of {}: the other ranks did not join within {:.0f} s (KILN_COLLECTIVE_TIMEOUT); a rank "
            "died or hangs, so this one stops",
            what, rank_, size_, timeout_s_));
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  double timeout_s_;
  int rank_ = 0, size_ = 1;
  std::string library_;
};

}  // namespace

std::shared_ptr<Communicator> connect_mpi(double timeout_s) { return std::make_shared<MpiCommunicator>(timeout_s); }

#else

std::shared_ptr<Communicator> connect_mpi(double) {
  throw Error(
      "this kiln was built without MPI, so it cannot join an MPI job: install OpenMPI (apt-get install "
      "libopenmpi-dev openmpi-bin) and rebuild (scripts/setup.sh)");
}

#endif

}  // namespace kiln
