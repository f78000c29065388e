// Text data for next-token training: a token stream whose last 10% is the validation split,
// random (B, T) batches drawn from a seeded Philox stream (so a batch index always gives the
// same batch: resuming continues the same sequence), and a fixed set of validation batches.
#pragma once

#include <string>
#include <vector>

#include <kiln/core/tensor.hpp>
#include <kiln/train/token_file.hpp>
#include <kiln/train/tokenizer.hpp>

namespace kiln {

// The default corpus: the plain-text files of Debian's `fortunes` package, in name order.
constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";
// Reads a file, or every plain-text file of a directory in name order (fortune's .dat index
// files and .u8 links skipped), concatenated.
std::string read_corpus(const std::string& path);

struct Batch {
  Tensor x, y;  // i32 (B, T); y is x shifted by one token
};

class TextDataset {
 public:
  TextDataset(std::vector<int32_t> tokens, uint64_t seed);
  // Over a memory-mapped token file (only the batches' tokens are read, each checked against
  // vocab_size).
  TextDataset(std::shared_ptr<const TokenFile> file, int64_t vocab_size, uint64_t seed);
  // Batch number `index` of the training split (positions from Philox(seed, index)).
  Batch train_batch(uint64_t index, int64_t b, int64_t t) const;
  // Validation batch number `index` (a fixed set for a given seed).
  Batch val_batch(uint64_t index, int64_t b, int64_t t) const;
  size_t train_tokens() const { return split_; }
  size_t val_tokens() const { return size() - split_; }

 private:
  Batch batch(size_t begin, size_t end, uint32_t stream, uint64_t index, int64_t b, int64_t t) const;
  size_t size() const { return file_ ? file_->size() : tokens_.size(); }
  std::vector<int32_t> tokens_;
  std::shared_ptr<const TokenFile> file_;  // instead of tokens_
  int64_t vocab_size_ = 0;
  size_t split_;
  uint64_t seed_;
};

}  // namespace kiln
