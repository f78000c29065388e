// Engine, persistent storage: parameters, gradient and optimizer-state slots in the arenas, their
// dtype moves, and host reads and writes that see the device's newer copies.
#include <cstring>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>

namespace kiln {

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
  // An init without data (nn::EmptyParameters) leaves the slot as allocated: zeros, untouched.
  if (init.nbytes() && init.raw()) std::memcpy(arenas_.view(impl->slot).raw(), init.raw(), init.nbytes());
  impl->requires_grad = requires_grad;
  owners_[impl->slot] = impl;
  if (requires_grad) impl->grad = persistent(ArenaKind::Grad, name + ".grad");
  return Tensor(impl);
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

}  // namespace kiln
