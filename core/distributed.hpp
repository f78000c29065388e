// Data parallelism at the Tensor level: what a step records so that every rank of world()
// (circuit/comm/communicator.hpp) trains the same model on its own shard of the batch.
#pragma once

#include <vector>

#include <kiln/core/device.hpp>
#include <kiln/core/tensor.hpp>
#include <kiln/cuda/runtime/collective.hpp>

namespace kiln {

// The element-wise mean over the ranks of each of xs (same shapes and dtypes back): the values
// of a dtype, in the order the recording made them, flattened side by side into buckets of at
// most bucket_bytes (a larger value is one alone), one all_reduce op (one collective) per bucket.
// With one rank, xs themselves (nothing is recorded) unless a device collective is installed
// (cuda::set_device_world).
// (AdamWOptions::bucket_bytes is the training default.)
std::vector<Tensor> average_over_ranks(const std::vector<Tensor>& xs, size_t bucket_bytes);

// ZeRO-1's collectives over world()'s N ranks (recorded ops: reduce_scatter, all_gather).
// reduce_scatter_mean: x, a vector of N S values, -> [S], this rank's chunk (rank r: [r S, (r + 1) S))
// of x's element-wise mean over the ranks. all_gather: x [S] -> [N S], every rank's x, rank r's at
// [r S, (r + 1) S). Every element is summed in rank order, as average_over_ranks sums it.
Tensor reduce_scatter_mean(const Tensor& x);
Tensor all_gather(const Tensor& x);

// Steps on the GPU with several ranks (or with a collective chosen, in one process) get a device
// collective to average their gradients (cuda/runtime/collective.hpp: NCCL where it loads, else
// through host memory, unless `choice` forces one); logs which. Nothing for the CPU, or one
// process left alone.
void connect_device_collective_if_needed(const DeviceSelection& device,
                                         cuda::CollectiveChoice choice = cuda::CollectiveChoice::automatic);

// Makes every rank's values of `params` rank 0's (at the start of a run; host copies, now).
void broadcast_from_rank0(const std::vector<Tensor>& params);

}  // namespace kiln
