// Tokenizers. "char": ids are Unicode code points of a vocabulary built from a corpus, in
// ascending code-point order (stored in weights files as tokenizer/vocab). "byte": ids are the
// 256 byte values. "bpe": byte-level BPE learned on a corpus (train/bpe.hpp; stored as
// tokenizer/merges). "hf-bpe": a Hugging Face byte-level BPE tokenizer.json (train/hf_tokenizer.hpp;
// stored whole as tokenizer/json). Text is UTF-8; encoding text with characters outside a char vocabulary is
// an error that names them; byte and bpe tokenizers encode any bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kiln/train/bpe.hpp>

namespace kiln {

class HfBpeTokenizer;

class Tokenizer {
 public:
  enum class Kind { Char, Byte, Bpe, HfBpe };
  static Tokenizer byte_level();
  static Tokenizer bpe(BpeModel model);
  static Tokenizer hf_bpe(std::shared_ptr<const HfBpeTokenizer> tokenizer);
  // The vocabulary is every code point of `corpus`, ascending.
  static Tokenizer char_level(const std::string& corpus);
  static Tokenizer from_vocab(std::vector<int32_t> code_points);

  Kind kind() const { return kind_; }
  const char* kind_name() const {
    return kind_ == Kind::Char ? "char" : kind_ == Kind::Byte ? "byte" : kind_ == Kind::Bpe ? "bpe" : "hf-bpe";
  }
  int64_t vocab_size() const;
  const std::vector<int32_t>& vocab() const { return vocab_; }  // code points (char only)
  const BpeModel& bpe_model() const;                            // bpe only
  const HfBpeTokenizer& hf_bpe() const;                         // hf-bpe only
  // The tokenizer as a Hugging Face tokenizer.json (bpe: kiln's export; hf-bpe: the file it came
  // from), or nullopt for char and byte tokenizers.
  std::optional<std::string> hf_tokenizer_json() const;

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  Kind kind_ = Kind::Byte;
  std::vector<int32_t> vocab_;
  std::shared_ptr<const BpeModel> bpe_;
  std::shared_ptr<const HfBpeTokenizer> hf_;
};

// UTF-8 <-> code points; invalid UTF-8 is an error naming the byte offset.
std::vector<int32_t> utf8_decode(const std::string& text);
std::string utf8_encode(const std::vector<int32_t>& code_points);

}  // namespace kiln
