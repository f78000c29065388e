// gradcheck: record f in a recording of its own, then check the Circuit.
#include <map>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/gradcheck.hpp>

namespace kiln {

namespace {

// Checks f's inputs, and the f64 parameters it reads: all of them (named by their slots) when
// `named` is null and check_parameters, else those `named` lists, by its names.
ad::GradCheckResult run_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                  const std::vector<HostTensor>& inputs, const ad::GradCheckOptions& opts,
                                  bool check_parameters, const std::vector<std::pair<std::string, Tensor>>* named) {
  Engine& e = Engine::current();
  std::map<int32_t, std::string> wanted;  // parameter slot -> name
  if (named)
    for (const auto& [name, p] : *named)
      if (p.is_persistent()) wanted[p.impl()->slot] = name;
  Engine::Recording outer = e.take_recording();
  Engine::Recording rec;
  try {
    std::vector<Tensor> args;
    for (const HostTensor& h : inputs) {
      HostTensor x = h;
      if (h.dtype() == DType::f32) {
        x = HostTensor::zeros(DType::f64, h.shape());
        for (int64_t i = 0; i < h.numel(); ++i) x.set(i, h.get(i));
      }
      args.push_back(Tensor::from_host(x));
    }
    Tensor out = f(args);
    std::vector<ValueId> wrt;
    std::vector<std::string> names;
    for (size_t k = 0; k < args.size(); ++k)
      if (args[k].dtype() == DType::f64) {
        wrt.push_back(e.value_of(args[k]));
        names.push_back("input " + std::to_string(k));
      }
    ValueId out_id = e.value_of(out);
    rec = e.take_recording();
    std::vector<HostTensor> binds = e.prepare_run(rec);
    for (size_t i = 0; i < binds.size(); ++i) {
      const int32_t slot = rec.external_slot[i];
      if (slot < 0) continue;
      binds[i] = binds[i].clone();  // perturb copies, never the parameters themselves
      if (binds[i].dtype() != DType::f64 || e.arenas().slot(slot).kind != ArenaKind::Param) continue;
      if (named ? wanted.count(slot) > 0 : check_parameters) {
        wrt.push_back(rec.circuit.externals()[i]);
        names.push_back(named ? wanted[slot] : e.arenas().slot(slot).name);
      }
    }
    ad::GradCheckResult r = ad::check_gradients(rec.circuit, out_id, wrt, binds, opts, names);
    e.restore_recording(std::move(outer));
    return r;
  } catch (...) {
    e.restore_recording(std::move(outer));
    throw;
  }
}

}  // namespace

ad::GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<HostTensor>& inputs, const ad::GradCheckOptions& opts,
                              bool check_parameters) {
  return run_gradcheck(f, inputs, opts, check_parameters, nullptr);
}

ad::GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<HostTensor>& inputs,
                              const std::vector<std::pair<std::string, Tensor>>& parameters,
                              const ad::GradCheckOptions& opts) {
  for (const auto& [name, p] : parameters)
    if (p.dtype() != DType::f64)
      throw Error("gradcheck: parameter '" + name + "' is " + dtype_name(p.dtype()) +
                  "; convert the model with Module::to(DType::f64) first");
  return run_gradcheck(f, inputs, opts, true, &parameters);
}

}  // namespace kiln
