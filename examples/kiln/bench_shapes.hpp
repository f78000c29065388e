// Shape lists of `kiln bench --gemm` and `--attention`, and the step times they report.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {
class TracedStep;
}

namespace kiln::cli {

// "AxBx...,CxD..." -> one list of positive sizes per comma-separated item. `flag` and `expected`
// name the option and its form in the error for anything else (e.g. "--gemm", "N or MxNxK").
std::vector<std::vector<int64_t>> parse_shape_list(const std::string& spec, const std::string& flag,
                                                   const std::string& expected);

// The median device-work time (Engine::stats().last_work_ms) of `runs` runs of `step`, after three
// warm-up runs; each run reads back its first output, if it has any.
double median_work_ms(TracedStep& step, int64_t runs);

}  // namespace kiln::cli
