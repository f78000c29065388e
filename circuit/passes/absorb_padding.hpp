// absorb_padding: a GPU pass that lets a fused_rows op write the padded rows pad_bf16_rows asks
// for (the bf16 matmul kernel's 16-byte operand rows). Without it the op writes its rows and a
// concat copies them, with zeros appended, into the padded layout: GPT-2's logits' gradient,
// 8192 rows of 50257 bf16 values, read and written again each step.
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln {

// Each concat along the last axis of a row output of a fused_rows op (read by nothing else,
// not requested) and zeros (a fill of 0, or its cast) becomes that output, padded: the op stores
// each row followed by the zero columns (RowProgram::output_pad). The same values. Run after
// fuse_rows and absorb_casts (the output is then the bf16 one pad_bf16_rows's cast made).
Circuit absorb_padding(const Circuit& c, std::vector<ValueId>& outputs);

}  // namespace kiln
