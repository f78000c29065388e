// `kiln bench --attention SHAPES`: causal attention forward and backward alone, as a model
// records it (q kᵀ, mask, softmax, · v through the heads' permutes), on the selected device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "bench_estimate.hpp"

namespace kiln::cli {

// `shapes`: comma-separated "BxHxTxD". Prints one line per shape: the median device time of a
// forward and backward over `runs` runs (fused by fuse_attention unless `--passes -fuse_attention`
// switches it off), and the rate of its matmul-equivalent FLOPs (causal: half of 4 B H T^2 D forward,
// 8 B H T^2 D backward counted as PyTorch's benchmarks count them). With `estimate`, the estimated
// time on that GPU instead (bench_estimate.hpp).
int bench_attention(const std::string& shapes, int64_t runs, const std::optional<EstimateRequest>& estimate = {});

}  // namespace kiln::cli
