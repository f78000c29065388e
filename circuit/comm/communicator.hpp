// The processes one training run spans (data parallelism): each rank runs the same step on its
// own shard of every global batch, and the step's all_reduce op (circuit/prims/all_reduce.cpp)
// averages the gradients through the current communicator. A single process needs no
// communicator (world() is then one rank); `mpirun -np N kiln train` gets an MPI one
// (connect_mpi, which kiln was built with when CMake found an MPI library).
//
// Every collective waits at most the communicator's timeout: a rank that died or hangs makes the
// others stop with an error naming the collective, its size and the waiting rank, never hang.
// After such an error the communicator is unusable (the collective may still be in flight, and
// the ranks' sequences of collectives are out of step): end the job (abort), as the CLI does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace kiln {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "single process", "MPI (OpenMPI 4.1.4)", ...
  // data[0, n) becomes the element-wise sum over the ranks (each passes n elements).
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  virtual void all_reduce_sum(double* data, int64_t n) = 0;
  // Nonblocking sums: start_all_reduce_sum begins the same sum as all_reduce_sum and returns;
  // data must be left alone until finish_all_reduce(data) has returned (the sum is then there).
  // Every rank starts its collectives in the same order; progress() lets those in flight advance
  // (MPI moves a nonblocking collective on only inside its calls: the executor calls it between
  // ops). Here: the blocking sum at the start, nothing at the finish.
  virtual void start_all_reduce_sum(float* data, int64_t n) { all_reduce_sum(data, n); }
  virtual void start_all_reduce_sum(double* data, int64_t n) { all_reduce_sum(data, n); }
  virtual void finish_all_reduce(const void* /*data*/) {}
  virtual void progress() {}
  // Waits for every started collective (a run that failed between a start and its finish: their
  // buffers are about to be reused). Throws, as a finish does, when the other ranks do not come.
  virtual void finish_all_started() {}
  // Seconds this rank has spent waiting for collectives to complete, since it joined.
  virtual double seconds_waited() const { return 0.0; }
  // ZeRO's halves of an all-reduce over data[0, n) cut in size() chunks, chunk k = [k n / size(),
  // (k + 1) n / size()) kept by rank k. reduce_scatter_sum: this rank's chunk becomes the sum over
  // the ranks (the rest is left undefined); all_gather: every rank's chunk reaches every rank's
  // data. Here: an all-reduce of the whole buffer, and an all-reduce of the buffer with every
  // chunk but this rank's zeroed (x + 0 is x).
  virtual void reduce_scatter_sum(float* data, int64_t n) { all_reduce_sum(data, n); }
  virtual void reduce_scatter_sum(double* data, int64_t n) { all_reduce_sum(data, n); }
  virtual void all_gather(float* data, int64_t n) { gather_by_all_reduce(data, n); }
  virtual void all_gather(double* data, int64_t n) { gather_by_all_reduce(data, n); }
  // Rank `root`'s bytes [0, n) reach every rank's data.
  virtual void broadcast(void* data, int64_t n, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job now (after an error on this one: the others may be waiting in a
  // collective); does not return.
  [[noreturn]] virtual void abort(int code) = 0;

 private:
  template <class T>
  void gather_by_all_reduce(T* data, int64_t n) {
    const int64_t begin = rank() * n / size(), end = (rank() + 1) * n / size();
    for (int64_t i = 0; i < n; ++i)
      if (i < begin || i >= end) data[i] = T(0);
    all_reduce_sum(data, n);
  }
};

// The communicator steps use: one rank unless set_world installed another.
Communicator& world();
std::shared_ptr<Communicator> shared_world();  // the same, to wrap or keep
void set_world(std::shared_ptr<Communicator> c);

// `comm` whose sums and gathers (all-reduces, started or whole, reduce-scatters, all-gathers)
// are local no-ops of the same size: each rank's data stays its own (a step's mean is then its
// own values divided by N, the scaling still run), so that `--collectives noop` measures a
// step's exposed communication time: the step's time less this one's. Broadcasts and barriers
// still reach the other ranks (a run's start stays in step).
std::shared_ptr<Communicator> with_noop_collectives(std::shared_ptr<Communicator> comm);

// Whether an MPI launcher (mpirun, srun) started this process as one of several.
bool launched_by_mpi_with_several_ranks();
// Joins the MPI job this process was launched in (MPI_Init_thread, funneled: OpenMP threads
// never call MPI), with `timeout_s` for every collective. Throws kiln::Error when kiln was built
// without MPI, naming the package to install.
std::shared_ptr<Communicator> connect_mpi(double timeout_s);

}  // namespace kiln
