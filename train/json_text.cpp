// The nesting depth of JSON text, counted without parsing it.
#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/json_text.hpp>

namespace kiln {

void require_json_depth(std::string_view text, const std::string& source) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw Error(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels (at byte " +
                    std::to_string(i) + ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace kiln
