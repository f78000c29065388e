// Precision names.
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/precision.hpp>

namespace kiln {

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "f32"; }

Precision parse_precision(const std::string& s) {
  if (s == "f32") return Precision::f32;
  if (s == "bf16") return Precision::bf16;
  throw Error("unknown precision '" + s + "': expected f32 or bf16");
}

}  // namespace kiln
