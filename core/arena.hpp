// Per-dtype arenas for persistent buffers. Parameters, gradients and optimizer moments each
// live in one contiguous arena per dtype, and a tensor is a view (offset, shape) into it, so a
// single launch can later update or zero all of them. Views are resolved to pointers at bind
// time because an arena moves when it grows.
#pragma once

#include <string>
#include <vector>

#include <kiln/circuit/ir/host_tensor.hpp>

namespace kiln {

enum class ArenaKind : uint8_t { Param, Grad, State };

struct ArenaSlot {
  ArenaKind kind;
  DType dtype;
  int64_t offset;  // in elements
  Shape shape;
  std::string name;
};

class ArenaSet {
 public:
  // Reserves a zero-filled slot; offsets are aligned to 16 elements (64 bytes for f32).
  int32_t allocate(ArenaKind kind, DType dtype, const Shape& shape, std::string name);
  const ArenaSlot& slot(int32_t id) const { return slots_.at(static_cast<size_t>(id)); }
  // A view of the slot's current storage (valid until the next allocate in that arena).
  HostTensor view(int32_t id) const;
  // The whole arena of (kind, dtype) as a 1-D view; empty if none.
  HostTensor arena_view(ArenaKind kind, DType dtype) const;

 private:
  struct Arena {
    ArenaKind kind;
    DType dtype;
    HostTensor storage;
    int64_t used = 0;
    // No view of it has been handed out since it was allocated: it holds zeros only, which a
    // grown arena need not copy (its fresh zero pages then stay untouched: a model of empty
    // parameters takes no memory).
    mutable bool pristine = true;
  };
  Arena& arena(ArenaKind kind, DType dtype);
  std::vector<Arena> arenas_;
  std::vector<ArenaSlot> slots_;
};

}  // namespace kiln
