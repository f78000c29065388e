// The checks shared by the typed parameter views; each view itself is defined beside its family.
#include <string>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

void require_view_of(const Op& op, std::initializer_list<PrimId> prims, const char* view) {
  for (PrimId id : prims)
    if (op.is(id)) return;
  throw Error(std::string(view) + " read from a '" + op.prim->name + "' op");
}

}  // namespace kiln
