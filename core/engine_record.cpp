// Engine, recording: values of the pending Circuit, runtime inputs, random streams, assigns,
// gradients (the reverse sweep appends to the recording), and moving a recording out and back.
#include <algorithm>

#include <kiln/ad/backward.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/core/engine.hpp>

namespace kiln {

Builder Engine::builder() { return Builder(rec_.circuit, scope_path_); }

ValueId Engine::add_input(HostTensor data, const std::string& name) {
  ValueId id = rec_.circuit.add_external({data.shape(), data.dtype()}, ValueRole::Input, name);
  rec_.bound.push_back(std::move(data));
  rec_.external_slot.push_back(-1);
  return id;
}

Tensor Engine::placeholder(const ValueInfo& info, const std::string& name, const std::string& traced_for) {
  ValueId id = rec_.circuit.add_external(info, ValueRole::Input, name);
  rec_.bound.emplace_back();
  rec_.external_slot.push_back(-1);
  rec_.traced_for = traced_for;
  return wrap(id, false);
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

namespace {
// Attention chains of the recording become attention ops before the sweep (unless the pipeline
// has fuse_attention off), so that the sweep records attention's own VJP. Kept: the loss, the
// values differentiated for and every live handle's value.
void fuse_attention_before_sweep(Circuit& c, const PipelineOptions& pipeline,
                                 const std::vector<std::weak_ptr<TensorImpl>>& handles, ValueId loss,
                                 const std::vector<ValueId>& wrt) {
  const auto& off = pipeline.disabled;
  if (std::find(off.begin(), off.end(), "fuse_attention") != off.end()) return;
  std::vector<ValueId> keep = wrt;
  keep.push_back(loss);
  for (const auto& w : handles)
    if (auto h = w.lock(); h && h->pending != kNoValue) keep.push_back(h->pending);
  fuse_attention_in_place(c, keep, wrt);
}

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
  // No attention rewrite here: grad()'s results may be differentiated again, and attention_grad
  // has no VJP. Its attention chains stay as recorded (unfused).
  Builder b = builder();
  std::vector<ValueId> grads = ad::backward(b, out, ids);
  std::vector<Tensor> result;
  for (size_t i = 0; i < wrt.size(); ++i) {
    ValueId g = grads[i];
    if (g == kNoValue) g = b.fill(wrt[i].shape(), gradient_dtype(wrt[i].dtype()), 0.0);
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
  fuse_attention_before_sweep(rec_.circuit, pipeline_, rec_.handles, out, wrt);
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
    ValueId g = it != grad_of.end() ? it->second : b.fill(p->info.shape, gradient_dtype(p->info.dtype), 0.0);
    if (accumulate) g = b.add(value_of(grad), g);
    rec_.slot_version[grad.impl()->slot] = b.assign(value_of(grad), g);
    rec_.grad_written[grad.impl()->slot] = true;
  }
  // What is recorded next is forward work again (a later micro-batch's forward under gradient
  // accumulation) until the optimizer marks its update.
  rec_.circuit.set_recording_phase(Phase::Forward);
}

Engine::Recording Engine::take_recording() {
  Recording r = std::move(rec_);
  rec_ = Recording{};
  rec_.epoch = next_epoch_++;
  return r;
}

void Engine::restore_recording(Recording rec) { rec_ = std::move(rec); }

}  // namespace kiln
