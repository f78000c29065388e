// Shape lists of `kiln bench --gemm` and `--attention`, and their timed runs.
#include "bench_shapes.hpp"

#include <algorithm>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/traced_step.hpp>

namespace kiln::cli {

std::vector<std::vector<int64_t>> parse_shape_list(const std::string& spec, const std::string& flag,
                                                   const std::string& expected) {
  std::vector<std::vector<int64_t>> out;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t end = std::min(spec.find(',', start), spec.size());
    const std::string item = spec.substr(start, end - start);
    std::vector<int64_t> dims;
    size_t p = 0;
    while (p < item.size()) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(item.substr(p), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || v < 1)
        throw Error(flag + ": expected " + expected + " with positive sizes, received '" + item + "'");
      dims.push_back(v);
      p += used;
      if (p < item.size() && item[p] == 'x') ++p;
    }
    if (dims.empty()) throw Error(flag + ": expected " + expected + ", received '" + item + "'");
    out.push_back(std::move(dims));
    start = end + 1;
  }
  return out;
}

double median_work_ms(TracedStep& step, int64_t runs) {
  auto run = [&] {
    const std::vector<Tensor>& out = step.run({});
    if (!out.empty()) out[0].item();
  };
  for (int i = 0; i < 3; ++i) run();  // warm up
  std::vector<double> ms;
  for (int64_t i = 0; i < runs; ++i) {
    run();
    ms.push_back(Engine::current().stats().last_work_ms);
  }
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0 : ms[ms.size() / 2];
}

}  // namespace kiln::cli
