// Option parsing for the kiln CLI.
#include "args.hpp"

#include <cstdio>

#include "circuit/error.hpp"

namespace kiln::cli {

Args::Args(const std::vector<std::string>& argv, std::map<std::string, std::string> known, std::string usage)
    : known_(std::move(known)), usage_(std::move(usage)) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) throw Error("unexpected argument '" + a + "' (options are --name value)");
    std::string name = a.substr(2);
    if (!known_.count(name)) throw Error("unknown option --" + name + " (see --help)");
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

int64_t Args::integer(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error("option --" + name + ": '" + it->second + "' is not an integer");
}

double Args::real(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    double v = std::stod(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error("option --" + name + ": '" + it->second + "' is not a number");
}

}  // namespace kiln::cli
