// ScopedEnv: sets an environment variable for a scope and restores what was there (its old
// value, or its absence) when the scope ends, also when a failed ASSERT leaves it early, so
// that one test's setting never leaks into the next.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace kiln::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace kiln::testing
