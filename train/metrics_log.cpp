// MetricsLog: JSON lines out, and a reader for exactly the lines it writes.
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/metrics_log.hpp>

namespace kiln {

namespace {
// A JSON number (the shortest form that reads back as the same double), or null for NaN and
// infinities.
std::string number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

// The fields of one flat JSON object of numbers (or null), "event": "start" and a start line's
// "target" string; throws a message saying what is wrong (the caller adds the file and line).
std::map<std::string, std::optional<double>> parse_object(const std::string& s, bool& is_start, std::string& target) {
  std::map<std::string, std::optional<double>> fields;
  size_t i = 0;
  auto skip = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) ++i;
  };
  auto expect = [&](char c) {
    skip();
    if (i >= s.size() || s[i] != c) throw Error(fmt::format("expected '{}' at column {}", c, i + 1));
    ++i;
  };
  auto string = [&] {
    expect('"');
    const size_t end = s.find('"', i);
    if (end == std::string::npos) throw Error(fmt::format("unterminated string at column {}", i));
    std::string out = s.substr(i, end - i);
    i = end + 1;
    return out;
  };
  is_start = false;
  expect('{');
  skip();
  if (i < s.size() && s[i] == '}') throw Error("an empty object");
  for (;;) {
    const std::string key = string();
    expect(':');
    skip();
    if (i < s.size() && s[i] == '"') {
      const std::string value = string();
      if (key == "target")
        target = value;
      else if (key == "event" && value == "start")
        is_start = true;
      else
        throw Error(fmt::format("unexpected \"{}\": \"{}\" (the string fields are \"event\": \"start\" and \"target\")",
                                key, value));
    } else if (s.compare(i, 4, "null") == 0) {
      fields[key] = std::nullopt;
      i += 4;
    } else {
      const char* begin = s.c_str() + i;
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(begin, &end);
      if (end == begin || errno == ERANGE)
        throw Error(fmt::format("expected a number or null for \"{}\" at column {}", key, i + 1));
      fields[key] = v;
      i += static_cast<size_t>(end - begin);
    }
    skip();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    expect('}');
    skip();
    if (i != s.size()) throw Error(fmt::format("text after the object at column {}", i + 1));
    return fields;
  }
}
}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) throw Error("cannot open the metrics log '" + path + "' for writing: " + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::line(const std::string& json) {
  // Flushed per line: a run that is killed keeps every line written before.
  if (std::fputs(json.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF || std::fflush(file_) != 0)
    throw Error("cannot write the metrics log '" + path_ + "': " + std::strerror(errno));
}

void MetricsLog::start(int64_t step, int64_t steps, int64_t tokens_per_step, const std::string& target) {
  if (target.find_first_of("\"\\") != std::string::npos)
    throw Error("metrics log: a Target text holds a quote or backslash: " + target);
  line(fmt::format(R"({{"event": "start", "step": {}, "steps": {}, "tokens_per_step": {}, "target": "{}"}})", step,
                   steps, tokens_per_step, target));
}

void MetricsLog::train_step(int64_t step, double loss, double lr, double grad_norm, double ms_per_step,
                            double tokens_per_s) {
  line(fmt::format(R"({{"step": {}, "loss": {}, "lr": {}, "grad_norm": {}, "ms_per_step": {}, "tokens_per_s": {}}})",
                   step, number(loss), number(lr), number(grad_norm), number(ms_per_step), number(tokens_per_s)));
}

void MetricsLog::validation(int64_t step, double val_loss) {
  line(fmt::format(R"({{"step": {}, "val_loss": {}}})", step, number(val_loss)));
}

std::vector<MetricsRecord> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open the metrics log '" + path + "': " + std::strerror(errno));
  std::vector<MetricsRecord> out;
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      bool is_start = false;
      MetricsRecord r;
      auto fields = parse_object(text, is_start, r.target);
      if (!is_start && !r.target.empty()) throw Error("\"target\" on a line that is not a start line");
      r.start = is_start;
      auto step = fields.find("step");
      if (step == fields.end() || !step->second || *step->second < 0 || *step->second != std::floor(*step->second))
        throw Error("no \"step\" (a count from 0)");
      r.step = static_cast<int64_t>(*step->second);
      const std::map<std::string, std::optional<double>*> known = {{"loss", &r.loss},
                                                                   {"lr", &r.lr},
                                                                   {"grad_norm", &r.grad_norm},
                                                                   {"ms_per_step", &r.ms_per_step},
                                                                   {"tokens_per_s", &r.tokens_per_s},
                                                                   {"val_loss", &r.val_loss}};
      for (const auto& [key, value] : fields) {
        if (key == "step" || (is_start && (key == "steps" || key == "tokens_per_step"))) continue;
        auto k = known.find(key);
        if (k == known.end()) throw Error("unknown field \"" + key + "\"");
        *k->second = value.has_value() ? value : std::optional<double>(std::nan(""));
      }
      out.push_back(r);
    } catch (const Error& e) {
      throw Error(fmt::format("the metrics log '{}', line {}: {}", path, number, e.what()));
    }
  }
  return out;
}

}  // namespace kiln
