// ScopedTarget and ScopedPipeline: the thread's engine plans for another Target (or with other
// pipeline options: passes switched off, another recompute mode) for a scope, and for what it
// planned before when the scope ends, also when a failed ASSERT leaves it early. Plans are keyed
// by both, so nothing needs clearing.
#pragma once

#include <functional>
#include <string>

#include <kiln/circuit/ir/target.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/core/engine.hpp>

namespace kiln::testing {

class ScopedTarget {
 public:
  // The engine's Target with `change` applied.
  explicit ScopedTarget(const std::function<void(Target&)>& change) : saved_(Engine::current().target()) {
    Target t = saved_;
    change(t);
    Engine::current().set_target(t);
  }
  ~ScopedTarget() { Engine::current().set_target(saved_); }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;

 private:
  Target saved_;
};

// A change for ScopedTarget: `--matmul` text ("tile=128x256,stages=3") over the matmul policy.
inline std::function<void(Target&)> matmul(const std::string& text) {
  return [text](Target& t) { t.matmul = parse_matmul_policy(text, t.matmul); };
}

class ScopedPipeline {
 public:
  // The engine's pipeline options with `change` applied.
  explicit ScopedPipeline(const std::function<void(PipelineOptions&)>& change) : saved_(Engine::current().pipeline()) {
    PipelineOptions p = saved_;
    change(p);
    Engine::current().set_pipeline(p);
  }
  // `--passes` text: "-cse,-fuse_rows".
  explicit ScopedPipeline(const std::string& passes)
      : ScopedPipeline([&](PipelineOptions& p) { p.disabled = parse_pipeline_options(passes).disabled; }) {}
  ~ScopedPipeline() { Engine::current().set_pipeline(saved_); }
  ScopedPipeline(const ScopedPipeline&) = delete;
  ScopedPipeline& operator=(const ScopedPipeline&) = delete;

 private:
  PipelineOptions saved_;
};

// A change for ScopedPipeline: this recompute mode, and memory budget (0: none).
inline std::function<void(PipelineOptions&)> recompute(RecomputeMode mode, size_t budget = 0) {
  return [mode, budget](PipelineOptions& p) {
    p.recompute = mode;
    p.memory_budget = budget;
  };
}

// `target` with the matmul policy `text` applied (for tests that lower with a Target of their own).
inline Target with_matmul(Target target, const std::string& text) {
  target.matmul = parse_matmul_policy(text, target.matmul);
  return target;
}

}  // namespace kiln::testing
