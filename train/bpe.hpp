// Byte-level BPE (GPT-2's scheme): text is split into chunks by a fixed pre-tokenization rule,
// each chunk's UTF-8 bytes start as tokens 0..255 (the byte values) and the learned merges join
// adjacent tokens, lowest merge first; merge i makes token 256 + i. Any bytes encode, and
// decode(encode(s)) == s for every byte string.
//
// The pre-tokenization rule is the regular expression of hf_tokenizer_json(), GPT-2's split with
// ASCII classes (so that kiln and Hugging Face `tokenizers` split identically without Unicode
// tables): at each position the first alternative that matches wins, in order
//   ' ?[A-Za-z]+', ' ?[0-9]+', ' ?[^ws A-Za-z0-9]+', 'ws+(?!\S)', 'ws+'   (ws: space \t \n \v \f \r)
// so a space joins the word after it, and bytes >= 0x80 (non-ASCII text) count as "other".
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln {

class BpeModel {
 public:
  using Merge = std::pair<int32_t, int32_t>;
  // Learns merges on `corpus` until the vocabulary has vocab_size tokens (>= 256) or no pair
  // occurs twice; the most frequent pair wins, ties to the smallest (left, right) ids.
  static BpeModel train(const std::string& corpus, int64_t vocab_size);
  // From stored merges: merge i joins tokens that exist before it (ids < 256 + i).
  static BpeModel from_merges(std::vector<Merge> merges);

  int64_t vocab_size() const { return 256 + static_cast<int64_t>(merges_.size()); }
  const std::vector<Merge>& merges() const { return merges_; }
  const std::string& token_bytes(int32_t id) const { return bytes_.at(static_cast<size_t>(id)); }

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // ids outside the vocabulary: an error
  // The model as a Hugging Face tokenizer.json (tokenizers' Tokenizer.from_file loads it and
  // encodes every text to the same ids).
  std::string hf_tokenizer_json() const;

  // The chunks of the pre-tokenization rule, as byte ranges [begin, end) of text.
  static std::vector<std::pair<size_t, size_t>> pretokenize(const std::string& text);

 private:
  void encode_chunk(const std::string& chunk, std::vector<int32_t>& out) const;
  std::vector<Merge> merges_;
  std::vector<std::string> bytes_;  // each token's bytes
  struct PairHash {
    size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k); }
  };
  std::unordered_map<uint64_t, int32_t, PairHash> rank_;  // (left << 32 | right) -> merge index
};

}  // namespace kiln
