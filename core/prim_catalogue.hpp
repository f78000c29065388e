// The Prim catalogue `kiln prims` prints, as text a program can print too: one row per Prim
// registered in this process (kiln's own, then the program's user Prims) with its family and the
// rules it implements, then the pass pipeline in order.
#pragma once

#include <string>

namespace kiln {

std::string prim_catalogue();

}  // namespace kiln
