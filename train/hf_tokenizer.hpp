// A Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2's, Llama 3's, and what kiln's
// own BPE exports), run as Hugging Face `tokenizers` runs it:
//   1. added tokens (special or not) are cut out of the text first, leftmost, longest first;
//   2. each remaining piece is split by the pre-tokenizer: ByteLevel with GPT-2's regular
//      expression (use_regex), or a Split of a given pattern (behavior Isolated) followed by
//      ByteLevel without one; the expressions run on PCRE2 (Unicode classes, lookahead);
//   3. each chunk's UTF-8 bytes become GPT-2's byte characters, and BPE merges their tokens,
//      lowest merge rank first (leftmost among equals); with ignore_merges a chunk that is a
//      whole vocabulary entry is that token;
//   4. a TemplateProcessing post-processor adds its special tokens around the sequence.
// Decoding maps the tokens' characters back to bytes (added tokens are their text). Anything else
// (a normalizer, another model or pre-tokenizer, byte fallback, dropout, subword prefixes, added
// tokens that strip or match single words, add_prefix_space after a Split) is refused with an
// error naming the file and the setting; a pattern PCRE2 cannot compile is an error naming the
// pattern. Ids must lie below the number of tokens plus 65536 (a file cannot make kiln allocate
// for ids it never defines).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <kiln/circuit/ir/error.hpp>

namespace kiln {

// A well-formed tokenizer.json with a setting kiln does not run: kiln import then imports the
// weights without it and says why (a malformed file, or a pattern PCRE2 cannot compile, is a
// plain kiln::Error, which stops the import).
class UnsupportedTokenizer : public Error {
 public:
  using Error::Error;
};

class HfBpeTokenizer {
 public:
  // Parses and checks tokenizer.json's text; `source` names it in errors (UnsupportedTokenizer for
  // a setting kiln does not run).
  static std::shared_ptr<const HfBpeTokenizer> from_json(const std::string& json_text, const std::string& source);
  // Whether the text is a tokenizer.json of a BPE model with a ByteLevel pre-tokenizer or decoder
  // (the kind this class runs); a valid file of another kind (SentencePiece's Metaspace, WordPiece)
  // is not, and kiln imports none of it.
  static bool is_byte_level_bpe(const std::string& json_text);
  ~HfBpeTokenizer();

  std::vector<int32_t> encode(const std::string& text) const;  // text: valid UTF-8
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }  // the largest id + 1
  const std::string& json() const { return json_; }                            // the file as read

 private:
  HfBpeTokenizer() = default;
  static bool is_byte_level_bpe_unchecked(const std::string& json_text);
  static std::shared_ptr<const HfBpeTokenizer> from_json_unchecked(const std::string& json_text,
                                                                   const std::string& source);
  struct Added {
    std::string content;
    int32_t id;
  };
  struct Pattern;  // a compiled PCRE2 expression
  struct Loader;   // from_json_unchecked's phases on one file (hf_tokenizer.cpp)
  // The pre-tokenizer's chunks of text[begin, end), matched with `match` (PCRE2 match data, one
  // per encode call: the tokenizer is shared between threads).
  std::vector<std::pair<size_t, size_t>> split(const std::string& text, size_t begin, size_t end, void* match) const;
  void encode_chunk(const std::string& chunk, std::vector<int32_t>& out) const;

  std::string json_;
  std::vector<std::string> pieces_;                                   // per id: its bytes ("" for an unused id)
  std::unordered_map<std::string, int32_t> ids_;                      // vocabulary entry (as bytes) -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left << 32 | right) -> (rank, merged id)
  std::vector<Added> added_;                                          // longest content first
  std::vector<bool> added_first_byte_;                                // bytes an added token starts with
  std::vector<int32_t> byte_ids_;                                     // byte value -> its token
  std::unique_ptr<Pattern> pattern_;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> prefix_, suffix_;  // the post-processor's special tokens around a sequence
};

}  // namespace kiln
