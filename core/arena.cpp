// ArenaSet: contiguous per-(kind, dtype) storage with views.
#include <cstring>

#include <kiln/core/arena.hpp>

namespace kiln {

ArenaSet::Arena& ArenaSet::arena(ArenaKind kind, DType dtype) {
  for (Arena& a : arenas_)
    if (a.kind == kind && a.dtype == dtype) return a;
  arenas_.push_back(Arena{kind, dtype, HostTensor::zeros(dtype, Shape{0}), 0});
  return arenas_.back();
}

int32_t ArenaSet::allocate(ArenaKind kind, DType dtype, const Shape& shape, std::string name) {
  Arena& a = arena(kind, dtype);
  constexpr int64_t kAlign = 16;
  int64_t offset = (a.used + kAlign - 1) / kAlign * kAlign;
  int64_t need = offset + shape.numel();
  int64_t capacity = a.storage.numel();
  if (need > capacity) {
    int64_t grown = std::max(need, 2 * capacity);
    HostTensor bigger = HostTensor::zeros(dtype, Shape{grown});
    if (a.used && !a.pristine)
      std::memcpy(bigger.raw(), a.storage.raw(), static_cast<size_t>(a.used) * dtype_size(dtype));
    a.storage = bigger;
  }
  a.used = need;
  slots_.push_back(ArenaSlot{kind, dtype, offset, shape, std::move(name)});
  return static_cast<int32_t>(slots_.size() - 1);
}

HostTensor ArenaSet::view(int32_t id) const {
  const ArenaSlot& s = slot(id);
  for (const Arena& a : arenas_)
    if (a.kind == s.kind && a.dtype == s.dtype) {
      a.pristine = false;  // the caller may write through the view
      return HostTensor::view(
          s.dtype, s.shape,
          static_cast<std::byte*>(a.storage.raw()) + s.offset * static_cast<int64_t>(dtype_size(s.dtype)));
    }
  return {};
}

HostTensor ArenaSet::arena_view(ArenaKind kind, DType dtype) const {
  for (const Arena& a : arenas_)
    if (a.kind == kind && a.dtype == dtype) {
      a.pristine = false;
      return HostTensor::view(dtype, Shape{a.used}, a.storage.raw());
    }
  return {};
}

}  // namespace kiln
