// TracedStep: a step (forward, backward, optimizer update) recorded once and then run again
// with new input values, without running the code that recorded it: no recording, no
// structural hash, no cache lookup on the hot path.
//
// The contract, as for any trace: a replay does what the first run did, with the declared
// inputs' new values. Values host code makes per step must be made per run (Tensor::
// per_run_scalar, Engine::on_each_run): AdamW's step count and scalars and the random streams
// are. Any other host value the step read keeps the value it had when traced. The objects the
// step's code captured (model, optimizer) must outlive the TracedStep.
#pragma once

#include <functional>
#include <vector>

#include <kiln/core/engine.hpp>

namespace kiln {

class TracedStep {
 public:
  // Runs `step` once, recording it, and realizes it: that is the first run. `inputs` are realized
  // tensors the step reads (e.g. a batch's tokens and targets); `step` returns the tensors wanted
  // back from each run (e.g. the loss). The step must realize exactly once (an optimizer's
  // step() does) and record nothing after it.
  TracedStep(const std::vector<Tensor>& inputs, const std::function<std::vector<Tensor>()>& step);

  // Runs the traced step again with new values for its inputs (same shapes and dtypes, in the
  // order given at construction); the outputs (and every handle the step realized that is still
  // alive) take this run's values.
  const std::vector<Tensor>& run(const std::vector<HostTensor>& inputs);

  // The outputs of the latest run.
  const std::vector<Tensor>& outputs() const { return outputs_; }

 private:
  Engine::Trace trace_;
  std::vector<size_t> input_external_;  // per input: its external in the traced recording
  std::vector<Tensor> outputs_;
};

}  // namespace kiln
