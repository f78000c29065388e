// The registry of every Prim: built on first use from each family's registration function, and
// refusing to start with a PrimId no family registered.
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/families.hpp>

namespace kiln {

PrimRegistry& PrimRegistry::instance() {
  static PrimRegistry registry;
  return registry;
}

PrimRegistry::PrimRegistry() {
  register_all_prims(*this);
  for (int i = 0; i < kPrimCount; ++i)
    if (static_cast<PrimId>(i) != PrimId::user && !prims_[static_cast<size_t>(i)])
      throw Error(std::string("Prim '") + prim_name(static_cast<PrimId>(i)) + "' has no registration");
}

}  // namespace kiln
