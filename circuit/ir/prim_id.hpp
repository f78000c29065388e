// PrimId: one enumerator per Prim kiln has. Code asks `op.is(PrimId::reduce)` and records
// `add_op(PrimId::reduce, ...)`, so a misspelt Prim does not compile; a Prim's name (dumps,
// errors, `kiln prims`) is its enumerator's. Each family's file under circuit/prims/ registers
// the PrimDef of its ids; the registry refuses to start with one missing.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln {

// X(name) for every Prim, one family (circuit/prims/<family>.cpp) a line. `user` is the id of
// every Prim a program registers at run time (core/user_prim.hpp): such a PrimDef carries its own
// name, and ops tell user Prims apart by their PrimDef, never by this id.
// clang-format off
#define KILN_PRIMS(X)                                          \
  X(pointwise)                                                 \
  X(reduce) X(reduce_all)                                      \
  X(matmul)                                                    \
  X(gather_rows) X(scatter_add_rows) X(gather_last) X(one_hot) \
  X(reshape) X(permute) X(broadcast)                           \
  X(slice) X(concat) X(split)                                  \
  X(where)                                                     \
  X(cast) X(stop_gradient)                                     \
  X(fill) X(iota)                                              \
  X(random)                                                    \
  X(assign)                                                    \
  X(fused_rows)                                                \
  X(multi_tensor)                                              \
  X(fused_matmul)                                              \
  X(column_sums)                                               \
  X(attention) X(attention_grad)                              \
  X(all_reduce) X(reduce_scatter) X(all_gather)                \
  X(user)
// clang-format on

enum class PrimId : uint8_t {
#define KILN_PRIM_ENUMERATOR(name) name,
  KILN_PRIMS(KILN_PRIM_ENUMERATOR)
#undef KILN_PRIM_ENUMERATOR
};

inline constexpr int kPrimCount = 0
#define KILN_PRIM_COUNT(name) +1
    KILN_PRIMS(KILN_PRIM_COUNT)
#undef KILN_PRIM_COUNT
    ;

const char* prim_name(PrimId id);
// The built-in Prim of a name (the CLI, tests), or nullopt (`user` included: no Prim is named so).
std::optional<PrimId> prim_id(std::string_view name);

}  // namespace kiln
