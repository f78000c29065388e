// Pre-tokenized data files, memory-mapped (never read whole into memory): a flat little-endian
// array of uint16 or uint32 token ids, as nanoGPT's prepare scripts write train.bin (uint16), or
// llm.c's format (a header of 256 int32: magic 20240520, version 1 for uint16 or 2 for uint32
// tokens, the token count; then the tokens), recognized by its magic.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace kiln {

enum class TokenDType { U16, U32 };

class TokenFile {
 public:
  // Opens and maps `path`; an llm.c header sets the dtype, else `dtype` does. Errors name the file
  // (missing, empty, a size that is no whole number of tokens, a header whose count disagrees).
  static std::shared_ptr<const TokenFile> open(const std::string& path, TokenDType dtype = TokenDType::U16);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  size_t size() const { return count_; }
  TokenDType dtype() const { return dtype_; }
  const std::string& path() const { return path_; }
  // Tokens [begin, begin + n) into out; each checked to lie in [0, vocab_size) (an error naming
  // the file and the token's index).
  void copy(size_t begin, size_t n, int32_t* out, int64_t vocab_size) const;

 private:
  TokenFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  size_t count_ = 0;
  TokenDType dtype_ = TokenDType::U16;
};

}  // namespace kiln
