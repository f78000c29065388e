// ScopedEval: replaces a Prim's reference by wrap(original reference) for the guard's lifetime
// (tests that plant a broken or counting reference), restoring it also when a failed ASSERT
// leaves the scope early.
#pragma once

#include <functional>
#include <string>

#include <kiln/circuit/ir/prim.hpp>

namespace kiln::testing {

class ScopedEval {
 public:
  ScopedEval(const std::string& prim, const std::function<EvalFn(EvalFn)>& wrap)
      : def_(PrimRegistry::instance().mutable_find(prim)), saved_(def_.eval) {
    def_.eval = wrap(saved_);
  }
  ~ScopedEval() { def_.eval = saved_; }
  ScopedEval(const ScopedEval&) = delete;
  ScopedEval& operator=(const ScopedEval&) = delete;

 private:
  PrimDef& def_;
  EvalFn saved_;
};

}  // namespace kiln::testing
