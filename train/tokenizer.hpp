// Tokenizers. "char": ids are Unicode code points of a vocabulary built from a corpus, in
// ascending code-point order (stored in weights files as tokenizer/vocab). "byte": ids are the
// 256 byte values. "bpe": byte-level BPE learned on a corpus (train/bpe.hpp; stored as
// tokenizer/merges). Text is UTF-8; encoding text with characters outside a char vocabulary is
// an error that names them; byte and bpe tokenizers encode any bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kiln/train/bpe.hpp>

namespace kiln {

class Tokenizer {
 public:
  enum class Kind { Char, Byte, Bpe };
  static Tokenizer byte_level();
  static Tokenizer bpe(BpeModel model);
  // The vocabulary is every code point of `corpus`, ascending.
  static Tokenizer char_level(const std::string& corpus);
  static Tokenizer from_vocab(std::vector<int32_t> code_points);

  Kind kind() const { return kind_; }
  const char* kind_name() const { return kind_ == Kind::Char ? "char" : kind_ == Kind::Byte ? "byte" : "bpe"; }
  int64_t vocab_size() const;
  const std::vector<int32_t>& vocab() const { return vocab_; }  // code points (char only)
  const BpeModel& bpe_model() const;                            // bpe only

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  Kind kind_ = Kind::Byte;
  std::vector<int32_t> vocab_;
  std::shared_ptr<const BpeModel> bpe_;
};

// UTF-8 <-> code points; invalid UTF-8 is an error naming the byte offset.
std::vector<int32_t> utf8_decode(const std::string& text);
std::string utf8_encode(const std::vector<int32_t>& code_points);

}  // namespace kiln
