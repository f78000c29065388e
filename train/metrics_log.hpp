// The metrics log of a training run: JSON lines (one object per line), written as the run goes
// and flushed line by line, so that a run cut short keeps every step it finished.
//   {"event": "start", "step": 0, "steps": 2000, "tokens_per_step": 1024, "target": "cpu avx2 fma f32"}
//                                                            a run (or a resume), and its Target
//   {"step": 50, "loss": 2.91, "lr": 1e-3, "grad_norm": 0.84, "ms_per_step": 28.1, "tokens_per_s": 36400}
//   {"step": 250, "val_loss": 2.61}
// Non-finite numbers are written as null (JSON has no NaN). `kiln plot` draws them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

class MetricsLog {
 public:
  // Opens `path` for writing: appended to when `append` (a resumed run), else replaced. A file
  // that cannot be opened is an error naming it.
  MetricsLog(const std::string& path, bool append);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // `target`: Target::str() of the engine the run trains on (no quotes or backslashes).
  void start(int64_t step, int64_t steps, int64_t tokens_per_step, const std::string& target);
  void train_step(int64_t step, double loss, double lr, double grad_norm, double ms_per_step, double tokens_per_s);
  void validation(int64_t step, double val_loss);
  const std::string& path() const { return path_; }

 private:
  void line(const std::string& json);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// One line of a metrics log, as read back: the fields a line has (a start line has none of the
// optional ones).
struct MetricsRecord {
  int64_t step = 0;
  bool start = false;
  std::string target;  // a start line's Target ("" in logs written before it was recorded)
  std::optional<double> loss, lr, grad_norm, ms_per_step, tokens_per_s, val_loss;
};

// Reads a metrics log. A line that is not one of the objects above is an error naming the file
// and the line; so is a missing file.
std::vector<MetricsRecord> read_metrics(const std::string& path);

}  // namespace kiln
