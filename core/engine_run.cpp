// Engine, running: realizing the pending Circuit through the plan cache on the engine's device,
// handing results to live handles, and traced steps (record once, replay).
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/tuning.hpp>

namespace kiln {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

std::vector<HostTensor> Engine::prepare_run(Recording& rec, bool on_device) {
  for (const auto& hook : rec.run_hooks) hook();
  for (const auto& [external, write] : rec.computed) {
    HostTensor& value = rec.bound[external];
    // The same buffer each run, unless something still shares the previous value.
    if (value.storage_shared()) value = HostTensor::zeros(value.dtype(), value.shape());
    write(value);
  }
  std::vector<HostTensor> out = rec.bound;
  for (size_t i = 0; i < out.size(); ++i)
    if (rec.external_slot[i] >= 0)
      out[i] = on_device ? arenas_.view(rec.external_slot[i]) : host_view(rec.external_slot[i]);
  return out;
}

void Engine::realize() {
  if (!rec_.traced_for.empty())
    throw Error(rec_.traced_for +
                " asked for a value (item, to_vector, to_host, an optimizer step): it is traced "
                "into the step's Circuit, so it may only record Tensor operations on its arguments");
  if (rec_.circuit.ops().empty()) {
    take_recording();
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<TensorImpl>> live;
  std::vector<ValueId> requested;
  for (const auto& w : rec_.handles)
    if (auto h = w.lock()) {
      live.push_back(h);
      requested.push_back(h->pending);
    }
  Recording rec = take_recording();
  try {
    uint64_t hash = rec.circuit.structural_hash();
    std::shared_ptr<const Plan> plan = cache_.find(hash, rec.circuit, requested, target_, pipeline_);
    double plan_ms = 0;
    if (plan) {
      ++stats_.cache_hits;
    } else {
      auto tp = std::chrono::steady_clock::now();
      if (tune_next_plan_ && !plan_only_) {
        // The plan's kernels the cache lacks are tuned first, and the plan is made with the choices.
        tune_next_plan_ = false;
        if (device_ == Device::CPU && !target_.deterministic) {
          target_ = tune_missing_kernels(rec.circuit, requested, target_, pipeline_);
          plan = cache_.find(hash, rec.circuit, requested, target_, pipeline_);
        }
      }
      if (!plan) plan = cache_.build(hash, rec.circuit, requested, target_, pipeline_);
      plan_ms = ms_since(tp);
      ++stats_.plans_built;
      spdlog::debug("plan built: {} recorded ops -> {} ops in {:.2f} ms ({} plans cached)", plan->recorded_ops,
                    plan->optimized_ops, plan_ms, cache_.size());
      if (settings().dump_circuits)
        std::fprintf(stderr, "%s%s", rec.circuit.dump("recorded (forward, backward, updates)").c_str(),
                     plan->program->circuit().dump("optimized (CSE, DCE, fusion)").c_str());
    }
    if (plan_only_) {
      last_plan_ = plan;
      return;
    }
    const ProcessCounters before = ProcessCounters::now();
    std::vector<HostTensor> binds = prepare_run(rec, device_ == Device::CUDA);
    stats_.last_hash_bind_ms = ms_since(t0) - plan_ms;
    stats_.last_plan_ms = plan_ms;
    execute(*plan, binds, rec.external_slot, live);
    stats_.last_counters = ProcessCounters::now() - before;
    last_plan_ = plan;
    if (tracing_) {
      ++traced_realizations_;
      trace_ = Trace{plan, std::move(rec), {}, device_, runtime_};
      for (const auto& h : live) trace_.results.push_back(h);
    }
  } catch (const Error& e) {
    // One error, saying what became of the step, rather than a log line beside it.
    throw Error(std::string(e.what()) + " (the step's pending values are discarded)");
  }
}

void Engine::execute(const Plan& plan, const std::vector<HostTensor>& binds, const std::vector<int32_t>& external_slot,
                     const std::vector<std::shared_ptr<TensorImpl>>& live) {
  auto tr = std::chrono::steady_clock::now();
  std::vector<HostTensor> results;
  if (device_ == Device::CUDA) {
    // A plan lowered for another runtime (a test's fake device, then the GPU) is lowered again.
    if (!plan.device || &plan.device->runtime() != runtime_ || !plan.device->runtime_alive()) {
      auto tl = std::chrono::steady_clock::now();
      plan.device = std::make_unique<cuda::DeviceProgram>(plan.program->circuit(), plan.program->outputs(), *runtime_,
                                                          plan.target);
      spdlog::debug("plan lowered for {}: {} kernels in {:.1f} ms", runtime_->device_name(),
                    plan.device->kernels().size(), ms_since(tl));
      if (settings().dump_circuits) std::fprintf(stderr, "%s", plan.device->dump().c_str());
    }
    results = plan.device->run(binds, cuda::Residency{resident_.get(), external_slot});
  } else {
    results = plan.program->run(binds);
  }
  stats_.last_run_ms = ms_since(tr);
  stats_.last_work_ms = device_ == Device::CUDA ? plan.device->last_run().device_ms : stats_.last_run_ms;
  stats_.last_recorded_ops = plan.recorded_ops;
  stats_.last_executed_ops = plan.optimized_ops;
  ++stats_.realizations;
  for (size_t i = 0; i < live.size(); ++i) {
    if (!live[i]) continue;
    // A result that views storage owned elsewhere (an arena slot, or an input's buffer
    // through a reshape) is snapshotted: the handle keeps the value it had in this step.
    live[i]->data = results[i].owns_storage() ? results[i] : results[i].clone();
    live[i]->pending = kNoValue;
  }
}

void Engine::begin_trace() {
  if (tracing_) throw Error("traced step: a step is already being traced (a trace cannot hold another)");
  realize();  // work recorded before the trace is not part of it
  tracing_ = true;
  traced_realizations_ = 0;
  trace_ = Trace{};
}

Engine::Trace Engine::end_trace() {
  tracing_ = false;
  Trace t = std::move(trace_);
  trace_ = Trace{};
  if (traced_realizations_ != 1)
    throw Error("traced step: the step realized " + std::to_string(traced_realizations_) +
                " times (reading a value mid-step realizes it); a trace replays exactly one realized step");
  if (!rec_.circuit.ops().empty())
    throw Error("traced step: ops were recorded after the step realized; they would not be replayed");
  return t;
}

void Engine::replay(Trace& trace) {
  realize();
  if (trace.device != device_ || trace.runtime != runtime_ || trace.plan->target != target_ ||
      trace.plan->pipeline != pipeline_)
    throw Error(trace.device != device_ || trace.runtime != runtime_
                    ? std::string("traced step: traced on ") + device_name(trace.device) + ", the engine is now on " +
                          device_name(device_) + "; trace it again"
                    : "traced step: traced for the Target '" + trace.plan->target.str() + "', the engine's is now '" +
                          target_.str() + "'" +
                          (trace.plan->pipeline != pipeline_ ? " with other passes switched off" : "") +
                          "; trace it again");
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<TensorImpl>> live;
  for (const auto& w : trace.results) live.push_back(w.lock());
  const ProcessCounters before = ProcessCounters::now();
  std::vector<HostTensor> binds = prepare_run(trace.rec, device_ == Device::CUDA);
  stats_.last_hash_bind_ms = ms_since(t0);
  stats_.last_plan_ms = 0;
  try {
    execute(*trace.plan, binds, trace.rec.external_slot, live);
    stats_.last_counters = ProcessCounters::now() - before;
  } catch (const Error& e) {
    throw Error(std::string(e.what()) +
                " (the replayed step is discarded: persistent tensors keep their values from "
                "before it)");
  }
  last_plan_ = trace.plan;
  ++stats_.replays;
}

}  // namespace kiln
