// gradcheck: record f in a recording of its own, then check the Circuit.
#include "core/gradcheck.hpp"

#include "circuit/ir/error.hpp"
#include "core/engine.hpp"

namespace kiln {

ad::GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<HostTensor>& inputs, const ad::GradCheckOptions& opts,
                              bool check_parameters) {
  Engine& e = Engine::current();
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
    for (const Tensor& a : args)
      if (a.dtype() == DType::f64) wrt.push_back(e.value_of(a));
    ValueId out_id = e.value_of(out);
    rec = e.take_recording();
    std::vector<HostTensor> binds = e.prepare_run(rec);
    for (size_t i = 0; i < binds.size(); ++i) {
      if (rec.external_slot[i] < 0) continue;
      binds[i] = binds[i].clone();  // perturb copies, never the parameters themselves
      if (check_parameters && binds[i].dtype() == DType::f64 &&
          e.arenas().slot(rec.external_slot[i]).kind == ArenaKind::Param)
        wrt.push_back(rec.circuit.externals()[i]);
    }
    ad::GradCheckResult r = ad::check_gradients(rec.circuit, out_id, wrt, binds, opts);
    e.restore_recording(std::move(outer));
    return r;
  } catch (...) {
    e.restore_recording(std::move(outer));
    throw;
  }
}

}  // namespace kiln
