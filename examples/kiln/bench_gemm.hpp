// `kiln bench --gemm SHAPES`: the rate of kiln's own matmul kernel alone on the selected device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "bench_estimate.hpp"

namespace kiln::cli {

// `shapes`: comma-separated "N" (N x N x N) or "MxNxK" (an M x K by K x N product). Prints one
// line per shape: the median device time of the product over `runs` runs, and its TFLOP/s; with
// `estimate`, the product's estimated time on that GPU instead (bench_estimate.hpp).
int bench_gemm(const std::string& shapes, int64_t runs, const std::optional<EstimateRequest>& estimate = {});

}  // namespace kiln::cli
