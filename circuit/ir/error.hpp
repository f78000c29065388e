// The one error type of kiln. Messages name the op, the shapes expected and received, and the
// layer (module path) that recorded the op, where those are known.
#pragma once

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// "op 'matmul' in layer 'h.0.attn': <message>"; the layer part is left out when empty.
[[noreturn]] void fail(const std::string& op, const std::string& layer, const std::string& message);

}  // namespace kiln
