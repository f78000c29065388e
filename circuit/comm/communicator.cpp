// The single-process communicator and the current one.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/settings.hpp>

namespace kiln {
namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single process"; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_reduce_sum(double*, int64_t) override {}
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

class NoopCollectives final : public Communicator {
 public:
  explicit NoopCollectives(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend() + " with no-op collectives"; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_reduce_sum(double*, int64_t) override {}
  void start_all_reduce_sum(float*, int64_t) override {}
  void start_all_reduce_sum(double*, int64_t) override {}
  void reduce_scatter_sum(float*, int64_t) override {}
  void reduce_scatter_sum(double*, int64_t) override {}
  // The other chunks get this rank's own (the same bytes moved; finite values for the update).
  void all_gather(float* data, int64_t n) override { fill_with_own_chunk(data, n); }
  void all_gather(double* data, int64_t n) override { fill_with_own_chunk(data, n); }
  void broadcast(void* data, int64_t n, int root) override { inner_->broadcast(data, n, root); }
  void barrier() override { inner_->barrier(); }
  [[noreturn]] void abort(int code) override {
    inner_->abort(code);
    std::_Exit(code);  // not reached: the inner abort does not return
  }

 private:
  template <class T>
  void fill_with_own_chunk(T* data, int64_t n) {
    const int p = size();
    const int64_t own = rank() * n / p, length = (rank() + 1) * n / p - own;
    for (int k = 0; k < p; ++k) {
      const int64_t begin = k * n / p, count = std::min(length, (k + 1) * n / p - begin);
      if (k != rank()) std::copy(data + own, data + own + count, data + begin);
    }
  }
  std::shared_ptr<Communicator> inner_;
};

std::shared_ptr<Communicator>& current() {
  static std::shared_ptr<Communicator> c = std::make_shared<SingleProcess>();
  return c;
}

}  // namespace

Communicator& world() { return *current(); }
std::shared_ptr<Communicator> shared_world() { return current(); }

void set_world(std::shared_ptr<Communicator> c) { current() = c ? std::move(c) : std::make_shared<SingleProcess>(); }

std::shared_ptr<Communicator> with_noop_collectives(std::shared_ptr<Communicator> comm) {
  return std::make_shared<NoopCollectives>(std::move(comm));
}

bool launched_by_mpi_with_several_ranks() { return settings().launcher_several_ranks; }

}  // namespace kiln
