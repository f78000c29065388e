// The MPI communicator: non-blocking collectives (all-reduces of its own over MPI_Isend and
// MPI_Irecv, MPI_Ibcast, MPI_Ibarrier) polled against a deadline, so that a rank that died or hangs stops the others
// with an error instead of a hang; the launcher (mpirun) then ends the job. Without MPI at build time, connect_mpi says
// how to get it.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

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

void check(int status, const char* call, int rank) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(status, text, &length);
  throw Error(fmt::format("{} failed on rank {}: {}", call, rank, std::string(text, static_cast<size_t>(length))));
}

// Sums over the ranks of data[0, n) split into N chunks, chunk k = [k n / N, (k + 1) n / N) kept
// by rank k, in two phases over nonblocking point-to-point messages:
//   reduce: each rank sends chunk q to rank q and receives its own chunk from every other rank,
//           then sums it in rank order, x_0 + x_1 + ... + x_{N-1}, into its chunk;
//   gather: each rank sends its summed chunk to every other rank and receives theirs in place.
// An all-reduce is both (each rank moves 2 (N - 1) / N of the buffer and adds (N - 1) / N of it,
// as a ring does, in N - 1 concurrent messages a phase); ZeRO's reduce-scatter is the first and its
// all-gather the second. Every element is summed in rank order wherever its chunk boundaries fall,
// so results do not depend on how the values were bucketed, and every rank holds the same bits.
// (OpenMPI 4's nonblocking all-reduce, for fewer than 4 ranks or in place, reduces the whole
// buffer on one rank and broadcasts it: that rank moves and adds all of it while the other waits,
// CPU time a step overlapped with it does not get back.) advance() moves it on as far as its
// messages have arrived; messages carry `tag` (exchanges in flight at once have tags of their own).
enum class Phases { reduce, gather, both };

template <class T>
class ChunkExchange {
 public:
  ChunkExchange(T* data, int64_t n, Phases phases, MPI_Datatype type, int rank, int size, int tag,
                std::vector<T> scratch)
      : data_(data),
        n_(n),
        phases_(phases),
        type_(type),
        rank_(rank),
        p_(size),
        tag_(tag),
        scratch_(std::move(scratch)) {
    reducing_ = phases_ != Phases::gather;
    if (reducing_) scratch_.resize(static_cast<size_t>(p_ - 1) * static_cast<size_t>(n_ / p_ + 1));
    post();
  }
  // True once every phase is done.
  bool advance() {
    for (;;) {
      if (requests_.empty()) return true;
      int done = 0;
      check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
            "MPI_Testall", rank_);
      if (!done) return false;
      requests_.clear();
      if (!reducing_) return true;
      sum_in_rank_order();
      reducing_ = false;
      if (phases_ == Phases::both) post();
    }
  }
  std::vector<T> take_scratch() { return std::move(scratch_); }

 private:
  int64_t begin(int k) const { return static_cast<int64_t>(k) * n_ / p_; }
  int64_t length(int k) const { return begin(k + 1) - begin(k); }
  // Where rank q's part of this rank's chunk arrives (a slot per other rank).
  T* slot(int q) {
    return scratch_.data() + static_cast<size_t>(q < rank_ ? q : q - 1) * static_cast<size_t>(n_ / p_ + 1);
  }
  void post() {
    requests_.assign(2 * static_cast<size_t>(p_ - 1), MPI_REQUEST_NULL);
    size_t at = 0;
    for (int q = 0; q < p_; ++q) {
      if (q == rank_) continue;
      // reduce: my chunk from q into its slot, q's chunk to q; gather: q's chunk from q in place, mine to q
      T* into = reducing_ ? slot(q) : data_ + begin(q);
      const int from_chunk = reducing_ ? rank_ : q, to_chunk = reducing_ ? q : rank_;
      check(MPI_Irecv(into, static_cast<int>(length(from_chunk)), type_, q, tag_, MPI_COMM_WORLD, &requests_[at++]),
            "MPI_Irecv", rank_);
      check(MPI_Isend(data_ + begin(to_chunk), static_cast<int>(length(to_chunk)), type_, q, tag_, MPI_COMM_WORLD,
                      &requests_[at++]),
            "MPI_Isend", rank_);
    }
  }
  void sum_in_rank_order() {
    T* mine = data_ + begin(rank_);
    const int64_t count = length(rank_);
    for (int64_t i = 0; i < count; ++i) {
      T acc = rank_ == 0 ? mine[i] : slot(0)[i];
      for (int q = 1; q < p_; ++q) acc += q == rank_ ? mine[i] : slot(q)[i];
      mine[i] = acc;
    }
  }

  T* data_;
  int64_t n_;
  Phases phases_;
  MPI_Datatype type_;
  int rank_, p_, tag_;
  std::vector<T> scratch_;  // per other rank, the chunk it sent in the reduce phase
  bool reducing_ = true;
  std::vector<MPI_Request> requests_;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) : timeout_s_(timeout_s) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread", -1);
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
  // A blocking sum is a started one finished at once: the same algorithm for the same buffer,
  // so that overlapped and blocking runs agree to the bit.
  void all_reduce_sum(float* data, int64_t n) override { now(data, n, Phases::both); }
  void all_reduce_sum(double* data, int64_t n) override { now(data, n, Phases::both); }
  void start_all_reduce_sum(float* data, int64_t n) override { start(data, n, Phases::both); }
  void start_all_reduce_sum(double* data, int64_t n) override { start(data, n, Phases::both); }
  void reduce_scatter_sum(float* data, int64_t n) override { now(data, n, Phases::reduce); }
  void reduce_scatter_sum(double* data, int64_t n) override { now(data, n, Phases::reduce); }
  void all_gather(float* data, int64_t n) override { now(data, n, Phases::gather); }
  void all_gather(double* data, int64_t n) override { now(data, n, Phases::gather); }
  void finish_all_reduce(const void* data) override {
    auto it = std::find_if(in_flight_.begin(), in_flight_.end(), [&](const InFlight& f) { return f.data == data; });
    if (it == in_flight_.end())
      throw Error(
          fmt::format("rank {}: no all-reduce was started on this buffer (a plan's start and finish "
                      "are out of step)",
                      rank_));
    wait([&] { return advance(*it); }, it->what);
    if (it->f32_exchange) f32_scratch_.push_back(it->f32_exchange->take_scratch());
    if (it->f64_exchange) f64_scratch_.push_back(it->f64_exchange->take_scratch());
    in_flight_.erase(it);
  }
  double seconds_waited() const override { return seconds_waited_; }
  void finish_all_started() override {
    while (!in_flight_.empty()) finish_all_reduce(in_flight_.front().data);
  }
  void progress() override {
    for (InFlight& f : in_flight_) advance(f);
  }
  void broadcast(void* data, int64_t n, int root) override {
    for (int64_t at = 0; at < n; at += kChunk) {
      MPI_Request r;
      check(MPI_Ibcast(static_cast<char*>(data) + at, static_cast<int>(std::min(kChunk, n - at)), MPI_BYTE, root,
                       MPI_COMM_WORLD, &r),
            "MPI_Ibcast", rank_);
      wait([&] { return test(r); }, fmt::format("broadcast of {} bytes from rank {}", n, root));
    }
  }
  void barrier() override {
    MPI_Request r;
    check(MPI_Ibarrier(MPI_COMM_WORLD, &r), "MPI_Ibarrier", rank_);
    wait([&] { return test(r); }, "barrier");
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return on OpenMPI; this keeps the promise elsewhere
  }

 private:
  static constexpr int64_t kChunk = int64_t{1} << 30;  // MPI counts are int
  static constexpr int kFirstTag = 1000, kTags = 16384;

  static void finalize() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  bool test(MPI_Request& r) const {
    int done = 0;
    check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test", rank_);
    return done != 0;
  }
  // A started all-reduce: a chunk exchange, or MPI's own requests (one per kChunk: chunks of more
  // elements than an int counts), and what a timeout names.
  struct InFlight {
    const void* data;
    std::string what;
    std::vector<MPI_Request> requests;
    std::unique_ptr<ChunkExchange<float>> f32_exchange;
    std::unique_ptr<ChunkExchange<double>> f64_exchange;
  };
  bool advance(InFlight& f) {
    if (f.f32_exchange) return f.f32_exchange->advance();
    if (f.f64_exchange) return f.f64_exchange->advance();
    int done = 0;
    check(MPI_Testall(static_cast<int>(f.requests.size()), f.requests.data(), &done, MPI_STATUSES_IGNORE),
          "MPI_Testall", rank_);
    return done != 0;
  }
  template <class T>
  void now(T* data, int64_t n, Phases phases) {
    start(data, n, phases);
    finish_all_reduce(data);
  }
  template <class T>
  void start(T* data, int64_t n, Phases phases) {
    constexpr bool f32 = std::is_same_v<T, float>;
    const MPI_Datatype type = f32 ? MPI_FLOAT : MPI_DOUBLE;
    const char* dtype = f32 ? "f32" : "f64";
    std::vector<std::vector<T>>& scratch = [this]() -> std::vector<std::vector<T>>& {
      if constexpr (f32)
        return f32_scratch_;
      else
        return f64_scratch_;
    }();
    const char* what = phases == Phases::both     ? "all-reduce"
                       : phases == Phases::reduce ? "reduce-scatter"
                                                  : "all-gather";
    InFlight f{data, fmt::format("{} of {} {} values", what, n, dtype), {}, nullptr, nullptr};
    if (phases != Phases::both && n / size_ + 1 >= std::numeric_limits<int>::max())
      throw Error(
          fmt::format("{} of {} values over {} ranks: a rank's chunk is more than an MPI count holds", what, n, size_));
    if (n / size_ + 1 < std::numeric_limits<int>::max()) {
      const int tag = kFirstTag + static_cast<int>(started_++ % kTags);
      std::vector<T> buffer;
      if (!scratch.empty()) {
        buffer = std::move(scratch.back());
        scratch.pop_back();
      }
      auto exchange = std::make_unique<ChunkExchange<T>>(data, n, phases, type, rank_, size_, tag, std::move(buffer));
      if constexpr (f32)
        f.f32_exchange = std::move(exchange);
      else
        f.f64_exchange = std::move(exchange);
    } else {
      for (int64_t at = 0; at < n; at += kChunk) {
        f.requests.emplace_back();
        check(MPI_Iallreduce(MPI_IN_PLACE, data + at, static_cast<int>(std::min(kChunk, n - at)), type, MPI_SUM,
                             MPI_COMM_WORLD, &f.requests.back()),
              "MPI_Iallreduce", rank_);
      }
    }
    in_flight_.push_back(std::move(f));
  }
  // Polls until done() (which tests the requests) says so, spinning briefly and then sleeping
  // (the ranks' OpenMP teams may share the cores), up to the timeout.
  template <class Done>
  void wait(Done done, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      const bool finished = done();
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (finished) {
        seconds_waited_ += waited;
        return;
      }
      if (waited > timeout_s_)
        throw Error(fmt::format(
            "{} on rank {} of {}: the other ranks did not join within {:.0f} s (KILN_COLLECTIVE_TIMEOUT); a rank "
            "died or hangs, so this one stops",
            what, rank_, size_, timeout_s_));
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  double timeout_s_;
  std::vector<InFlight> in_flight_;  // in start order
  // Finished exchanges' scratch buffers, for the next ones (no allocation a step).
  std::vector<std::vector<float>> f32_scratch_;
  std::vector<std::vector<double>> f64_scratch_;
  uint64_t started_ = 0;  // exchanges started: their tags
  double seconds_waited_ = 0;
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
