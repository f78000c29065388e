// Lowering of assign (circuit/prims/assign.cpp): no kernel. Its result is input 1's buffer, the
// new contents, which the device program commits to the target after the step succeeds.
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

void register_assign_lowering(LoweringTable& t) {
  t.add_alias(PrimId::assign, 1, "commit copy after the step succeeds");
}

}  // namespace kiln::cuda
