// Checks on untrusted JSON text before it is parsed (safetensors headers, Hugging Face config.json,
// model.safetensors.index.json, tokenizer.json): nlohmann-json parses deep nesting without
// recursion, but copying or printing a value recurses, so a small file of nested brackets could
// overflow the stack. Files of these kinds nest a few levels.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kiln {

constexpr size_t kMaxJsonDepth = 64;

// kiln::Error naming `source` when brackets outside strings nest deeper than kMaxJsonDepth.
void require_json_depth(std::string_view text, const std::string& source);

}  // namespace kiln
