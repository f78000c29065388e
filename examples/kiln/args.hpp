// A small option parser for the kiln CLI: `--name value` pairs, switches (`--name` alone) and `--help`. Unknown
// options, missing values and malformed numbers are errors naming the option.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace kiln::cli {

class Args {
 public:
  // `known` maps each option name (without --) to its help line; `usage` is printed by --help.
  // `switches` are the known options that take no value.
  Args(const std::vector<std::string>& argv, std::map<std::string, std::string> known, std::string usage,
       std::set<std::string> switches = {});
  bool help() const { return help_; }
  void print_help() const;
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name, const std::string& fallback) const;
  std::string required(const std::string& name) const;
  int64_t integer(const std::string& name, int64_t fallback) const;
  double real(const std::string& name, double fallback) const;
  // The same, refusing values below `min` (integers) or outside [lo, hi) and non-finite ones
  // (reals; above lo only, when !lo_inclusive), with an error naming the option, the range and
  // the value received.
  int64_t integer(const std::string& name, int64_t fallback, int64_t min) const;
  double real(const std::string& name, double fallback, double lo, double hi, bool lo_inclusive = true) const;

 private:
  std::map<std::string, std::string> known_, values_;
  std::set<std::string> switches_;
  std::string usage_;
  bool help_ = false;
};

}  // namespace kiln::cli
