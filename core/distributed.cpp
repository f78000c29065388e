// Data parallelism at the Tensor level: gradient buckets and the parameters' broadcast.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/cuda/runtime/collective.hpp>

namespace kiln {

std::vector<Tensor> average_over_ranks(const std::vector<Tensor>& xs, size_t bucket_bytes) {
  // One process records nothing, unless a device collective is installed (a one-rank NCCL run,
  // which tests the GPU path of the op).
  if (world().size() == 1 && !cuda::device_world()) return xs;
  Engine& engine = Engine::current();
  std::vector<Tensor> out(xs.size());
  std::map<DType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < xs.size(); ++i) by_dtype[xs[i].dtype()].push_back(i);
  // In the order the recording makes them (the backward makes the last layer's gradients
  // first): a bucket fills with gradients made near each other, and can start early.
  std::vector<int32_t> producer(xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    producer[i] = engine.builder().circuit().value(engine.value_of(xs[i])).producer;
  for (auto& [dtype, members] : by_dtype) {
    std::stable_sort(members.begin(), members.end(), [&](size_t a, size_t b) { return producer[a] < producer[b]; });
    const auto bucket_elements =
        std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / static_cast<size_t>(dtype_size(dtype))));
    // Consecutive members while the bucket has room (a value larger than a bucket is one alone).
    for (size_t first = 0; first < members.size();) {
      size_t last = first;
      int64_t elements = xs[members[first]].numel();
      while (last + 1 < members.size() && elements + xs[members[last + 1]].numel() <= bucket_elements)
        elements += xs[members[++last]].numel();
      std::vector<Tensor> flat;
      std::vector<int64_t> sizes;
      for (size_t k = first; k <= last; ++k) {
        const Tensor& x = xs[members[k]];
        flat.push_back(reshape(x, Shape{x.numel()}));
        sizes.push_back(x.numel());
      }
      Tensor bucket = flat.size() == 1 ? flat[0] : concat(flat, 0);
      const ValueId in = engine.value_of(bucket);
      const Tensor averaged = engine.wrap(engine.builder().circuit().add_op(PrimId::all_reduce, {}, {in})[0]);
      std::vector<Tensor> pieces = flat.size() == 1 ? std::vector<Tensor>{averaged} : split(averaged, 0, sizes);
      for (size_t k = first; k <= last; ++k) out[members[k]] = reshape(pieces[k - first], xs[members[k]].shape());
      first = last + 1;
    }
  }
  return out;
}

namespace {
Tensor collective(PrimId prim, const Tensor& x) {
  Engine& engine = Engine::current();
  Params p;
  p.ints = {world().size()};
  return engine.wrap(engine.builder().circuit().add_op(prim, p, {engine.value_of(x)})[0]);
}
}  // namespace

Tensor reduce_scatter_mean(const Tensor& x) { return collective(PrimId::reduce_scatter, x); }
Tensor all_gather(const Tensor& x) { return collective(PrimId::all_gather, x); }

void connect_device_collective_if_needed(const DeviceSelection& device, cuda::CollectiveChoice choice) {
  if (device.device != Device::CUDA || (world().size() == 1 && choice == cuda::CollectiveChoice::automatic)) return;
  cuda::set_device_world(
      cuda::connect_device_collective(*device.runtime, world(), settings().collective_timeout, choice));
  spdlog::info("data parallel on the GPU: gradients averaged through {}", cuda::device_world()->backend());
}

void broadcast_from_rank0(const std::vector<Tensor>& params) {
  Communicator& comm = world();
  if (comm.size() == 1) return;
  for (const Tensor& p : params) {
    HostTensor h = p.to_host().clone();
    comm.broadcast(h.raw(), static_cast<int64_t>(h.nbytes()), 0);
    Engine::current().write_persistent(*p.impl(), h);
  }
}

}  // namespace kiln
