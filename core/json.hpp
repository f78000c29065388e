// A small JSON reader and string escaper for kiln's own files (the tuning cache): the whole
// grammar of RFC 8259 (objects, arrays, strings with escapes, numbers, true, false, null),
// strictly: anything else, or anything after the value, is an error giving its byte offset.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::json {

struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;  // a repeated key is an error

  bool is(Kind k) const { return kind == k; }
  // The member `key` of an object, or null where it has none (or is not an object).
  const Value* find(const std::string& key) const;
};

// Throws kiln::Error("... at byte N: ...") on malformed text.
Value parse(std::string_view text);
// `s` as a JSON string literal, quotes included.
std::string quote(std::string_view s);

}  // namespace kiln::json
