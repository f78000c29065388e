// The Eigen reference executor: runs any Circuit on the host in f32 or f64 through each
// Prim's reference. A Program is a Circuit prepared once (verified, with the point after which
// each intermediate is dead) and run many times with new bindings.
#pragma once

#include <vector>

#include "circuit/circuit.hpp"

namespace kiln {

class Program {
 public:
  // `outputs` are the values run() returns, in order.
  Program(Circuit circuit, std::vector<ValueId> outputs);

  // `bindings` holds one tensor per circuit().externals(), in order; each must match the
  // external's dtype and shape exactly (an error names the value otherwise). Persistent
  // externals are written in place by assign ops, all at the end of a run that succeeded.
  std::vector<HostTensor> run(const std::vector<HostTensor>& bindings) const;

  const Circuit& circuit() const { return circuit_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }

 private:
  Circuit circuit_;
  std::vector<ValueId> outputs_;
  std::vector<std::vector<ValueId>> free_after_;  // per op: intermediates dead after it runs
};

// Throws kiln::Error (prefixed with `who`) unless `bindings` holds one tensor per external of c,
// each with the external's dtype and shape; the message names the value.
void check_bindings(const Circuit& c, const std::vector<HostTensor>& bindings, const std::string& who);

// One-shot convenience: Program(c, outputs).run(bindings).
std::vector<HostTensor> execute(const Circuit& c, const std::vector<HostTensor>& bindings,
                                const std::vector<ValueId>& outputs);

}  // namespace kiln
