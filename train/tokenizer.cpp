// Char and byte tokenizers, UTF-8 coding.
#include <algorithm>
#include <cstdio>
#include <set>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/hf_tokenizer.hpp>
#include <kiln/train/tokenizer.hpp>

namespace kiln {

std::vector<int32_t> utf8_decode(const std::string& text) {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + static_cast<size_t>(len) > text.size())
      throw Error("invalid UTF-8 at byte offset " + std::to_string(i));
    int32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (int k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
      if ((cc >> 6) != 0x2) throw Error("invalid UTF-8 at byte offset " + std::to_string(i));
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Strict: the shortest encoding only, no UTF-16 surrogates, nothing past U+10FFFF.
    static constexpr int32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kLeast[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
      throw Error("invalid UTF-8 at byte offset " + std::to_string(i) +
                  (cp < kLeast[len] ? " (an overlong encoding)" : " (not a Unicode scalar value)"));
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

namespace {
bool is_scalar_value(int32_t cp) { return cp >= 0 && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF); }

std::string hex_code_point(int32_t cp) {
  char hex[16];
  std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(cp));
  return cp < 0 ? std::to_string(cp) : hex;
}
}  // namespace

std::string utf8_encode(const std::vector<int32_t>& cps) {
  std::string s;
  for (int32_t cp : cps) {
    if (!is_scalar_value(cp)) throw Error("utf8_encode: " + hex_code_point(cp) + " is not a Unicode scalar value");
    auto u = static_cast<uint32_t>(cp);
    if (u < 0x80) {
      s += static_cast<char>(u);
    } else if (u < 0x800) {
      s += static_cast<char>(0xC0 | (u >> 6));
      s += static_cast<char>(0x80 | (u & 0x3F));
    } else if (u < 0x10000) {
      s += static_cast<char>(0xE0 | (u >> 12));
      s += static_cast<char>(0x80 | ((u >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (u & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (u >> 18));
      s += static_cast<char>(0x80 | ((u >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((u >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (u & 0x3F));
    }
  }
  return s;
}

Tokenizer Tokenizer::byte_level() { return Tokenizer(); }

Tokenizer Tokenizer::bpe(BpeModel model) {
  Tokenizer t;
  t.kind_ = Kind::Bpe;
  t.bpe_ = std::make_shared<const BpeModel>(std::move(model));
  return t;
}

Tokenizer Tokenizer::hf_bpe(std::shared_ptr<const HfBpeTokenizer> tokenizer) {
  Tokenizer t;
  t.kind_ = Kind::HfBpe;
  t.hf_ = std::move(tokenizer);
  return t;
}

int64_t Tokenizer::vocab_size() const {
  switch (kind_) {
    case Kind::Byte: return 256;
    case Kind::Bpe: return bpe_->vocab_size();
    case Kind::HfBpe: return hf_->vocab_size();
    case Kind::Char: break;
  }
  return static_cast<int64_t>(vocab_.size());
}

const BpeModel& Tokenizer::bpe_model() const {
  if (kind_ != Kind::Bpe) throw Error(std::string("bpe_model: a ") + kind_name() + " tokenizer has no BPE model");
  return *bpe_;
}

const HfBpeTokenizer& Tokenizer::hf_bpe() const {
  if (kind_ != Kind::HfBpe) throw Error(std::string("hf_bpe: a ") + kind_name() + " tokenizer is no tokenizer.json");
  return *hf_;
}

std::optional<std::string> Tokenizer::hf_tokenizer_json() const {
  if (kind_ == Kind::Bpe) return bpe_->hf_tokenizer_json();
  if (kind_ == Kind::HfBpe) return hf_->json();
  return std::nullopt;
}

Tokenizer Tokenizer::char_level(const std::string& corpus) {
  std::vector<int32_t> cps = utf8_decode(corpus);
  std::set<int32_t> unique(cps.begin(), cps.end());
  return from_vocab(std::vector<int32_t>(unique.begin(), unique.end()));
}

Tokenizer Tokenizer::from_vocab(std::vector<int32_t> code_points) {
  if (!std::is_sorted(code_points.begin(), code_points.end()) ||
      std::adjacent_find(code_points.begin(), code_points.end()) != code_points.end())
    throw Error("char tokenizer: the vocabulary must be strictly ascending code points");
  for (size_t i = 0; i < code_points.size(); ++i)
    if (!is_scalar_value(code_points[i]))
      throw Error("char tokenizer: vocabulary entry " + std::to_string(i) + " (" + hex_code_point(code_points[i]) +
                  ") is not a Unicode scalar value");
  Tokenizer t;
  t.kind_ = Kind::Char;
  t.vocab_ = std::move(code_points);
  return t;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  if (kind_ == Kind::Bpe) return bpe_->encode(text);
  if (kind_ == Kind::HfBpe) return hf_->encode(text);
  if (kind_ == Kind::Byte) {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::vector<int32_t> ids;
  std::set<int32_t> unknown;
  for (int32_t cp : utf8_decode(text)) {
    auto it = std::lower_bound(vocab_.begin(), vocab_.end(), cp);
    if (it == vocab_.end() || *it != cp) {
      unknown.insert(cp);
      continue;
    }
    ids.push_back(static_cast<int32_t>(it - vocab_.begin()));
  }
  if (!unknown.empty()) {
    std::string names;
    for (int32_t cp : unknown) {
      if (!names.empty()) names += ", ";
      names += "'" + utf8_encode({cp}) + "' (" + hex_code_point(cp) + ")";
      if (names.size() > 400) {
        names += ", ...";
        break;
      }
    }
    throw Error("text has " + std::to_string(unknown.size()) + " character(s) outside the vocabulary: " + names);
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (kind_ == Kind::Bpe) return bpe_->decode(ids);
  if (kind_ == Kind::HfBpe) return hf_->decode(ids);
  if (kind_ == Kind::Byte) {
    std::string s;
    for (int32_t id : ids) {
      if (id < 0 || id > 255)
        throw Error("decode: id " + std::to_string(id) + " is outside the byte vocabulary [0, 256)");
      s += static_cast<char>(id);
    }
    return s;
  }
  std::vector<int32_t> cps;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) throw Error("decode: id " + std::to_string(id) + " is outside the vocabulary");
    cps.push_back(vocab_[static_cast<size_t>(id)]);
  }
  return utf8_encode(cps);
}

}  // namespace kiln
