// Option parsing for the kiln CLI.
#include "args.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include <kiln/circuit/ir/error.hpp>

namespace kiln::cli {

Args::Args(const std::vector<std::string>& argv, std::map<std::string, std::string> known, std::string usage,
           std::set<std::string> switches)
    : known_(std::move(known)), switches_(std::move(switches)), usage_(std::move(usage)) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) throw Error("unexpected argument '" + a + "' (options are --name value)");
    std::string name = a.substr(2);
    if (!known_.count(name)) throw Error("unknown option --" + name + " (see --help)");
    if (switches_.count(name)) {
      values_[name] = "1";
      continue;
    }
    if (i + 1 >= argv.size()) throw Error("option --" + name + " needs a value");
    values_[name] = argv[++i];
  }
}

void Args::print_help() const {
  std::printf("%s\n\noptions:\n", usage_.c_str());
  for (const auto& [name, text] : known_) std::printf("  --%-14s %s\n", name.c_str(), text.c_str());
}

std::string Args::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw Error("option --" + name + " is required (see --help)");
  return it->second;
}

namespace {
// The whole value must convert (std::stoll / std::stod), else an error naming the option.
template <class T, class Convert>
T parse_number(const std::map<std::string, std::string>& values, const std::string& name, T fallback, Convert convert,
               const char* what) {
  auto it = values.find(name);
  if (it == values.end()) return fallback;
  try {
    size_t used = 0;
    T v = convert(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error("option --" + name + ": '" + it->second + "' is not " + what);
}
}  // namespace

int64_t Args::integer(const std::string& name, int64_t fallback) const {
  return parse_number<int64_t>(
      values_, name, fallback, [](const std::string& s, size_t* used) { return std::stoll(s, used); }, "an integer");
}

int64_t Args::integer(const std::string& name, int64_t fallback, int64_t min) const {
  const int64_t v = integer(name, fallback);
  if (v < min)
    throw Error("option --" + name + ": expected an integer of at least " + std::to_string(min) + ", received " +
                std::to_string(v));
  return v;
}

double Args::real(const std::string& name, double fallback, double lo, double hi, bool lo_inclusive) const {
  const double v = real(name, fallback);
  if (!std::isfinite(v) || v < lo || (!lo_inclusive && v == lo) || v >= hi) {
    std::ostringstream range;
    range << (lo_inclusive ? "[" : "(") << lo << ", " << hi << ")";
    throw Error("option --" + name + ": expected a finite number in " + range.str() + ", received " + values_.at(name));
  }
  return v;
}

double Args::real(const std::string& name, double fallback) const {
  return parse_number<double>(
      values_, name, fallback, [](const std::string& s, size_t* used) { return std::stod(s, used); }, "a number");
}

}  // namespace kiln::cli
