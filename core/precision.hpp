// Precision policy: what the matmuls of recorded steps compute in. f32 (the default) records
// them as written; bf16 records every f32 matmul as casts of both operands to bf16 and a
// bf16 x bf16 -> f32 product (f32 accumulation), the mixed precision people train with:
// parameters, gradients, optimizer state, the loss, normalization and softmax statistics stay
// f32, and the bf16 operand copies are what backward reads. The casts are ops of the Circuit,
// so passes and back ends see them like any other.
#pragma once

#include <string>

namespace kiln {

enum class Precision { f32, bf16 };

const char* precision_name(Precision p);
// Parses "f32" | "bf16"; throws kiln::Error naming the word and the choices.
Precision parse_precision(const std::string& s);

}  // namespace kiln
