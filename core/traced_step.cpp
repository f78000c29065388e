// TracedStep: trace once through the engine, then replay with substituted input bindings.
#include <algorithm>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/traced_step.hpp>

namespace kiln {

namespace {
std::string describe_input(size_t i, const std::string& name) {
  return "input " + std::to_string(i) + (name.empty() ? "" : " ('" + name + "')");
}
}  // namespace

TracedStep::TracedStep(const std::vector<Tensor>& inputs, const std::function<std::vector<Tensor>()>& step) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined() || !inputs[i].is_realized() || inputs[i].is_persistent())
      throw Error("traced step: input " + std::to_string(i) +
                  " must be a realized tensor made from host data (not a pending value or a parameter)");
  Engine& engine = Engine::current();
  engine.begin_trace();
  try {
    outputs_ = step();
  } catch (...) {
    try {
      engine.end_trace();
    } catch (const Error&) {  // the step's own error is the one to report
    }
    throw;
  }
  trace_ = engine.end_trace();
  // Each input is found by the handle the recording bound it through.
  const Circuit& circuit = trace_.rec.circuit;
  const std::vector<ValueId>& externals = circuit.externals();
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto it = trace_.rec.realized_inputs.find(inputs[i].impl().get());
    if (it == trace_.rec.realized_inputs.end())
      throw Error("traced step: " + describe_input(i, inputs[i].name()) + " is not read by the step");
    auto pos = std::find(externals.begin(), externals.end(), it->second.second);
    input_external_.push_back(static_cast<size_t>(pos - externals.begin()));
  }
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const TensorImpl* impl = outputs_[i].impl().get();
    bool traced = std::any_of(trace_.results.begin(), trace_.results.end(),
                              [&](const std::weak_ptr<TensorImpl>& w) { return w.lock().get() == impl; });
    if (!traced)
      throw Error("traced step: output " + std::to_string(i) +
                  " was not computed by the traced step (it was realized before it, or is an input)");
  }
}

const std::vector<Tensor>& TracedStep::run(const std::vector<HostTensor>& inputs) {
  if (inputs.size() != input_external_.size())
    throw Error("traced step: " + std::to_string(inputs.size()) + " inputs given, traced with " +
                std::to_string(input_external_.size()));
  const Circuit& circuit = trace_.rec.circuit;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ValueId id = circuit.externals()[input_external_[i]];
    const ValueInfo& info = circuit.info(id);
    if (inputs[i].shape() != info.shape || inputs[i].dtype() != info.dtype)
      throw Error("traced step: " + describe_input(i, circuit.value(id).name) + " was traced as " +
                  dtype_name(info.dtype) + info.shape.str() + ", received " + dtype_name(inputs[i].dtype()) +
                  inputs[i].shape().str());
  }
  for (size_t i = 0; i < inputs.size(); ++i) trace_.rec.bound[input_external_[i]] = inputs[i];
  Engine::current().replay(trace_);
  return outputs_;
}

}  // namespace kiln
