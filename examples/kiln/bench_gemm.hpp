// `kiln bench --gemm SHAPES`: the rate of kiln's own matmul kernel alone on the selected device.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::cli {

// `shapes`: comma-separated "N" (N x N x N) or "MxNxK" (an M x K by K x N product). Prints one
// line per shape: the median device time of the product over `runs` runs, and its TFLOP/s.
int bench_gemm(const std::string& shapes, int64_t runs);

}  // namespace kiln::cli
