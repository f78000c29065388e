// Engine: recording state, persistent tensors, gradients, and realization through the plan
// cache and the Eigen executor.
#include "core/engine.hpp"

#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ad/backward.hpp"
#include "circuit/ir/error.hpp"
#include "circuit/ir/options.hpp"

namespace kiln {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Engine& Engine::current() {
  thread_local Engine engine;
  return engine;
}

Engine::Engine() {
  rec_.epoch = next_epoch_++;
  static const bool logging_configured = [] {
    spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug shows plan builds
    return true;
  }();
  (void)logging_configured;
}

Builder Engine::builder() { return Builder(rec_.circuit, scope_path_); }

ValueId Engine::add_input(HostTensor data, const std::string& name) {
  ValueId id = rec_.circuit.add_external({data.shape(), data.dtype()}, ValueRole::Input, name);
  rec_.bound.push_back(std::move(data));
  rec_.external_slot.push_back(-1);
  return id;
}

ValueId Engine::value_of(const Tensor& t) {
  if (!t.defined()) throw Error("use of an undefined Tensor (default-constructed or moved from)");
  TensorImpl& impl = *t.impl();
  if (impl.engine != this)
    throw Error("a Tensor made by another thread's engine is used here; tensors belong to the thread that made them");
  if (impl.slot >= 0) {
    auto it = rec_.slot_version.find(impl.slot);
    if (it != rec_.slot_version.end()) return it->second;
    ValueId id = rec_.circuit.add_external(impl.info, ValueRole::Persistent, impl.name);
    rec_.bound.emplace_back();
    rec_.external_slot.push_back(impl.slot);
    rec_.slot_version[impl.slot] = id;
    return id;
  }
  if (impl.pending != kNoValue) {
    if (impl.epoch != rec_.epoch)
      throw Error("a Tensor from a step that failed or was set aside is used in another step");
    return impl.pending;
  }
  auto it = rec_.realized_inputs.find(&impl);
  if (it != rec_.realized_inputs.end()) return it->second.second;
  ValueId id = add_input(impl.data, impl.name);
  rec_.realized_inputs[&impl] = {t.impl(), id};
  return id;
}

Tensor Engine::wrap(ValueId id, bool deliver) {
  auto impl = std::make_shared<TensorImpl>();
  impl->engine = this;
  impl->info = rec_.circuit.info(id);
  impl->epoch = rec_.epoch;
  impl->pending = id;
  if (deliver) rec_.handles.push_back(impl);
  return Tensor(impl);
}

void Engine::assign(const Tensor& t, const Tensor& value) {
  if (!t.defined() || t.impl()->slot < 0)
    throw Error("assign: the target must be a persistent tensor (a parameter or optimizer state)");
  ValueId target = value_of(t), v = value_of(value);
  rec_.slot_version[t.impl()->slot] = builder().assign(target, v);
}

std::pair<ValueId, ValueId> Engine::next_random_stream() {
  // Made per run: a replayed step draws fresh streams from the seed of the moment, in the order
  // the streams were recorded, as re-recording it would.
  ValueId key = add_computed_input({Shape{2}, DType::i32}, "rng_key", [this](HostTensor& k) {
    k.data<int32_t>()[0] = static_cast<int32_t>(static_cast<uint32_t>(seed_));
    k.data<int32_t>()[1] = static_cast<int32_t>(static_cast<uint32_t>(seed_ >> 32));
  });
  ValueId offset = add_computed_input({Shape{}, DType::i32}, "rng_offset", [this](HostTensor& o) {
    o.data<int32_t>()[0] = static_cast<int32_t>(static_cast<uint32_t>(random_counter_++));
  });
  return {key, offset};
}

ValueId Engine::add_computed_input(ValueInfo info, const std::string& name, InputWriter write) {
  ValueId id = add_input(HostTensor::zeros(info.dtype, info.shape), name);
  rec_.computed.emplace_back(rec_.bound.size() - 1, std::move(write));
  return id;
}

void Engine::on_each_run(std::function<void()> hook) { rec_.run_hooks.push_back(std::move(hook)); }

Tensor Engine::new_persistent(ArenaKind kind, const std::string& name, const HostTensor& init, bool requires_grad) {
  if (requires_grad && !(init.dtype() == DType::f32 || init.dtype() == DType::f64))
    throw Error("parameter '" + name + "': only f32/f64 parameters can require gradients, received " +
                dtype_name(init.dtype()));
  auto persistent = [&](ArenaKind k, const std::string& n) {  // zero-filled slot
    auto t = std::make_shared<TensorImpl>();
    t->engine = this;
    t->info = {init.shape(), init.dtype()};
    t->name = n;
    t->slot = arenas_.allocate(k, init.dtype(), init.shape(), n);
    return t;
  };
  auto impl = persistent(kind, name);
  if (init.nbytes()) std::memcpy(arenas_.view(impl->slot).raw(), init.raw(), init.nbytes());
  impl->requires_grad = requires_grad;
  owners_[impl->slot] = impl;
  if (requires_grad) impl->grad = persistent(ArenaKind::Grad, name + ".grad");
  return Tensor(impl);
}

namespace {
void require_scalar_loss(const Circuit& c, ValueId out, const char* op, const std::string& scope) {
  const ValueInfo& info = c.info(out);
  if (info.shape.numel() != 1)
    fail(op, scope,
         "needs a scalar loss (one element), received " + std::string(dtype_name(info.dtype)) + info.shape.str());
}
}  // namespace

std::vector<Tensor> Engine::grad(const Tensor& loss, const std::vector<Tensor>& wrt) {
  ValueId out = value_of(loss);
  require_scalar_loss(rec_.circuit, out, "grad", scope_path_);
  std::vector<ValueId> ids;
  for (const Tensor& t : wrt) ids.push_back(value_of(t));
  Builder b = builder();
  std::vector<ValueId> grads = ad::backward(b, out, ids);
  std::vector<Tensor> result;
  for (size_t i = 0; i < wrt.size(); ++i) {
    ValueId g = grads[i];
    if (g == kNoValue) g = b.fill(wrt[i].shape(), wrt[i].dtype(), 0.0);
    result.push_back(wrap(g));
  }
  return result;
}

void Engine::backward(const Tensor& loss) {
  if (!loss.defined() || loss.impl()->pending == kNoValue || loss.impl()->epoch != rec_.epoch)
    throw Error(
        "backward() needs a loss recorded in the current step (this one was already realized, or is not "
        "a computed value); call backward() before reading the loss");
  ValueId out = value_of(loss);
  require_scalar_loss(rec_.circuit, out, "backward", scope_path_);
  // Every parameter of this engine that requires a gradient, in slot order (deterministic):
  // those the step reads get d loss / d p (by their pre-update version), the rest zero, so a
  // gradient never outlives its step. A later backward() in the same step adds.
  std::vector<int32_t> slots;
  for (const auto& [slot, owner] : owners_) {
    auto o = owner.lock();
    if (o && o->requires_grad) slots.push_back(slot);
  }
  std::sort(slots.begin(), slots.end());
  std::unordered_map<int32_t, ValueId> read;  // slot -> external id in this recording
  const auto& externals = rec_.circuit.externals();
  for (size_t i = 0; i < externals.size(); ++i)
    if (rec_.external_slot[i] >= 0) read[rec_.external_slot[i]] = externals[i];
  std::vector<ValueId> wrt;
  std::vector<int32_t> wrt_slots;
  for (int32_t s : slots)
    if (read.count(s)) {
      wrt.push_back(read[s]);
      wrt_slots.push_back(s);
    }
  rec_.circuit.set_recording_phase(Phase::Backward);
  Builder b = builder();
  std::vector<ValueId> grads = ad::backward(b, out, wrt);
  std::unordered_map<int32_t, ValueId> grad_of;
  for (size_t i = 0; i < wrt.size(); ++i)
    if (grads[i] != kNoValue) grad_of[wrt_slots[i]] = grads[i];
  for (int32_t s : slots) {
    auto p = owners_[s].lock();
    Tensor grad(p->grad);
    auto it = grad_of.find(s);
    bool accumulate = accumulate_gradients || rec_.grad_written[grad.impl()->slot];
    if (it == grad_of.end() && accumulate) continue;  // adding zero changes nothing
    ValueId g = it != grad_of.end() ? it->second : b.fill(p->info.shape, p->info.dtype, 0.0);
    if (accumulate) g = b.add(value_of(grad), g);
    rec_.slot_version[grad.impl()->slot] = b.assign(value_of(grad), g);
    rec_.grad_written[grad.impl()->slot] = true;
  }
}

void Engine::convert_persistent(const std::shared_ptr<TensorImpl>& t, DType dtype) {
  if (t->slot < 0) throw Error("convert_persistent: '" + t->name + "' is not a persistent tensor");
  if (t->info.dtype == dtype) return;
  if (dtype != DType::f32 && dtype != DType::f64)
    throw Error(std::string("convert_persistent: '") + t->name + "' can only move to f32 or f64, not " +
                dtype_name(dtype));
  realize();  // pending updates of the old buffer land first
  auto move_slot = [&](TensorImpl& x) {
    HostTensor old = host_view(x.slot);
    ArenaKind kind = arenas_.slot(x.slot).kind;
    int32_t slot = arenas_.allocate(kind, dtype, old.shape(), x.name);
    HostTensor converted = arenas_.view(slot);
    old = arenas_.view(x.slot);  // the allocation may have moved the arena
    for (int64_t i = 0; i < old.numel(); ++i) converted.set(i, old.get(i));
    if (resident_) resident_->forget(x.slot);
    x.slot = slot;
    x.info.dtype = dtype;
  };
  owners_.erase(t->slot);
  move_slot(*t);
  owners_[t->slot] = t;
  if (t->grad) move_slot(*t->grad);
}

HostTensor Engine::host_view(int32_t slot) const {
  HostTensor view = arenas_.view(slot);
  if (resident_) resident_->sync_host(slot, view);
  return view;
}

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
    std::shared_ptr<const Plan> plan = cache_.find(hash, rec.circuit, requested);
    double plan_ms = 0;
    if (plan) {
      ++stats_.cache_hits;
    } else {
      auto tp = std::chrono::steady_clock::now();
      plan = cache_.build(hash, rec.circuit, requested);
      plan_ms = ms_since(tp);
      ++stats_.plans_built;
      spdlog::debug("plan built: {} recorded ops -> {} ops in {:.2f} ms ({} plans cached)", plan->recorded_ops,
                    plan->optimized_ops, plan_ms, cache_.size());
      if (options::dump_circuits())
        std::fprintf(stderr, "%s%s", rec.circuit.dump("recorded (forward, backward, updates)").c_str(),
                     plan->program->circuit().dump("optimized (CSE, DCE, fusion)").c_str());
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
  } catch (...) {
    spdlog::error("step failed; its pending values are discarded");
    throw;
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
      plan.device = std::make_unique<cuda::DeviceProgram>(plan.program->circuit(), plan.program->outputs(), *runtime_);
      spdlog::debug("plan lowered for {}: {} kernels in {:.1f} ms", runtime_->device_name(),
                    plan.device->kernels().size(), ms_since(tl));
      if (options::dump_circuits()) std::fprintf(stderr, "%s", plan.device->dump().c_str());
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
  if (trace.device != device_ || trace.runtime != runtime_ || trace.plan->deterministic != cache_.deterministic())
    throw Error(std::string("traced step: traced on ") + device_name(trace.device) +
                (trace.plan->deterministic ? " (deterministic)" : "") + ", the engine is now on " +
                device_name(device_) + (cache_.deterministic() ? " (deterministic)" : "") + "; trace it again");
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
  } catch (...) {
    spdlog::error("replayed step failed; persistent tensors keep their values from before it");
    throw;
  }
  last_plan_ = trace.plan;
  ++stats_.replays;
}

HostTensor Engine::read_persistent(const TensorImpl& t) const { return host_view(t.slot).clone(); }

void Engine::write_persistent(const TensorImpl& t, const HostTensor& values) {
  if (t.slot < 0) throw Error("write_persistent: '" + t.name + "' is not a persistent tensor");
  if (values.shape() != t.info.shape)
    throw Error("write_persistent: '" + t.name + "' has shape " + t.info.shape.str() + ", values have " +
                values.shape().str());
  realize();                                 // pending reads and updates of the buffer come first
  if (resident_) resident_->forget(t.slot);  // the host copy is the newer one now
  HostTensor dst = arenas_.view(t.slot);
  for (int64_t i = 0; i < dst.numel(); ++i) dst.set(i, values.get(i));
}

Engine::Recording Engine::take_recording() {
  Recording r = std::move(rec_);
  rec_ = Recording{};
  rec_.epoch = next_epoch_++;
  return r;
}

void Engine::restore_recording(Recording rec) { rec_ = std::move(rec); }

void Engine::set_device(Device d, cuda::Runtime* runtime) {
  realize();  // pending work runs where it was recorded for
  cuda::Runtime* rt = nullptr;
  if (d == Device::CUDA) {
    std::string why;
    rt = runtime ? runtime : cuda_runtime(&why);
    if (!rt) throw Error("device cuda: no usable GPU (" + why + ")");
  }
  if (resident_ && &resident_->runtime() != rt) {
    // Leaving this runtime: every tensor the device updated comes home first.
    for (int32_t slot : resident_->stale_keys()) resident_->sync_host(slot, arenas_.view(slot));
    resident_.reset();
  }
  if (rt && !resident_) resident_ = std::make_unique<cuda::ResidentBuffers>(*rt);
  runtime_ = rt;
  device_ = d;
  cache_.set_gpu_target(d == Device::CUDA);
}

void Engine::manual_seed(uint64_t seed) {
  seed_ = seed;
  random_counter_ = 0;
}

void Engine::push_scope(const std::string& name) {
  scopes_.push_back(name);
  scope_path_ = scope_path_.empty() ? name : scope_path_ + "." + name;
}

void Engine::pop_scope() {
  scopes_.pop_back();
  scope_path_.clear();
  for (const auto& s : scopes_) scope_path_ = scope_path_.empty() ? s : scope_path_ + "." + s;
}

void manual_seed(uint64_t seed) { Engine::current().manual_seed(seed); }

}  // namespace kiln
