// The JSON reader: recursive descent over the text, nesting limited so that a hostile file
// cannot exhaust the stack.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/json.hpp>

namespace kiln::json {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view t) : t_(t) {}

  Value document() {
    Value v = value(0);
    skip_space();
    if (at_ != t_.size()) fail("text after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("JSON at byte " + std::to_string(at_) + ": " + what);
  }
  void skip_space() {
    while (at_ < t_.size() && (t_[at_] == ' ' || t_[at_] == '\t' || t_[at_] == '\n' || t_[at_] == '\r')) ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < t_.size() && t_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(std::string_view w) {
    if (t_.substr(at_, w.size()) != w) return false;
    at_ += w.size();
    return true;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64");
    skip_space();
    if (at_ == t_.size()) fail("unexpected end of text");
    Value v;
    const char c = t_[at_];
    if (c == '{') {
      ++at_;
      v.kind = Value::Kind::object;
      if (take('}')) return v;
      do {
        skip_space();
        std::string key = string_literal();
        expect(':');
        if (v.object.count(key)) fail("repeated key \"" + key + "\"");
        v.object.emplace(std::move(key), value(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++at_;
      v.kind = Value::Kind::array;
      if (take(']')) return v;
      do v.array.push_back(value(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::Kind::string;
      v.string = string_literal();
    } else if (word("true")) {
      v.kind = Value::Kind::boolean;
      v.boolean = true;
    } else if (word("false")) {
      v.kind = Value::Kind::boolean;
    } else if (word("null")) {
      v.kind = Value::Kind::null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Value::Kind::number;
      v.number = number();
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  double number() {
    const size_t start = at_;
    auto digits = [&] {
      const size_t from = at_;
      while (at_ < t_.size() && t_[at_] >= '0' && t_[at_] <= '9') ++at_;
      if (at_ == from) fail("malformed number");
    };
    if (t_[at_] == '-') ++at_;
    if (at_ < t_.size() && t_[at_] == '0')
      ++at_;
    else
      digits();
    if (at_ < t_.size() && t_[at_] == '.') {
      ++at_;
      digits();
    }
    if (at_ < t_.size() && (t_[at_] == 'e' || t_[at_] == 'E')) {
      ++at_;
      if (at_ < t_.size() && (t_[at_] == '+' || t_[at_] == '-')) ++at_;
      digits();
    }
    const double x = std::strtod(std::string(t_.substr(start, at_ - start)).c_str(), nullptr);
    if (!std::isfinite(x)) fail("number out of range");
    return x;
  }

  std::string string_literal() {
    if (at_ >= t_.size() || t_[at_] != '"') fail("expected a string");
    ++at_;
    std::string out;
    while (true) {
      if (at_ >= t_.size()) fail("unterminated string");
      const char c = t_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= t_.size()) fail("unterminated escape");
      const char e = t_[at_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = hex4();
          if (code >= 0xd800 && code < 0xdc00) {  // a surrogate pair
            if (!word("\\u")) fail("unpaired surrogate");
            const unsigned low = hex4();
            if (low < 0xdc00 || low >= 0xe000) fail("unpaired surrogate");
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          } else if (code >= 0xdc00 && code < 0xe000) {
            fail("unpaired surrogate");
          }
          utf8(code, out);
          break;
        }
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }
  unsigned hex4() {
    if (at_ + 4 > t_.size()) fail("short \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = t_[at_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
      else fail("malformed \\u escape");
    }
    return v;
  }
  static void utf8(unsigned c, std::string& out) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xe0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }

  std::string_view t_;
  size_t at_ = 0;
};

}  // namespace

const Value* Value::find(const std::string& key) const {
  if (kind != Kind::object) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

Value parse(std::string_view text) { return Parser(text).document(); }

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace kiln::json
