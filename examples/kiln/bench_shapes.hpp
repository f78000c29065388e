// Shape lists of `kiln bench --gemm` and `--attention`, and the medians they report.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cli {

// "AxBx...,CxD..." -> one list of positive sizes per comma-separated item. `flag` and `expected`
// name the option and its form in the error for anything else (e.g. "--gemm", "N or MxNxK").
std::vector<std::vector<int64_t>> parse_shape_list(const std::string& spec, const std::string& flag,
                                                   const std::string& expected);

double median(std::vector<double> v);

}  // namespace kiln::cli
