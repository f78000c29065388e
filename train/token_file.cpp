// Memory-mapped token files.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/token_file.hpp>

namespace kiln {

namespace {
constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

int32_t le32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}
}  // namespace

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path, TokenDType dtype) {
  std::shared_ptr<TokenFile> f(new TokenFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("token file '" + path + "': cannot open it (" + std::strerror(errno) + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("token file '" + path + "' is not a regular file");
  }
  f->map_bytes_ = static_cast<size_t>(st.st_size);
  if (f->map_bytes_ == 0) {
    ::close(fd);
    throw Error("token file '" + path + "' is empty");
  }
  f->map_ = mmap(nullptr, f->map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f->map_ == MAP_FAILED) {
    f->map_ = nullptr;
    throw Error("token file '" + path + "': cannot map it (" + std::strerror(errno) + ")");
  }
  madvise(f->map_, f->map_bytes_, MADV_RANDOM);  // batches read short runs at random places
  const auto* bytes = static_cast<const unsigned char*>(f->map_);
  size_t header = 0;
  f->dtype_ = dtype;
  if (f->map_bytes_ >= kLlmcHeaderBytes && le32(bytes) == kLlmcMagic) {
    const int32_t version = le32(bytes + 4), count = le32(bytes + 8);
    if (version != 1 && version != 2)
      throw Error("token file '" + path + "': llm.c header version " + std::to_string(version) +
                  " (1: uint16 tokens, 2: uint32)");
    f->dtype_ = version == 1 ? TokenDType::U16 : TokenDType::U32;
    header = kLlmcHeaderBytes;
    const size_t width = version == 1 ? 2 : 4;
    if (count < 0 || (f->map_bytes_ - header) / width != static_cast<size_t>(count) ||
        (f->map_bytes_ - header) % width != 0)
      throw Error("token file '" + path + "': its llm.c header says " + std::to_string(count) +
                  " tokens, the file holds " + std::to_string(f->map_bytes_ - header) + " bytes of " +
                  std::to_string(width) + "-byte tokens");
  }
  const size_t width = f->dtype_ == TokenDType::U16 ? 2 : 4;
  if ((f->map_bytes_ - header) % width != 0)
    throw Error("token file '" + path + "': " + std::to_string(f->map_bytes_ - header) +
                " bytes are no whole number of " + std::to_string(width) + "-byte tokens (is --token-dtype right?)");
  f->tokens_ = bytes + header;
  f->count_ = (f->map_bytes_ - header) / width;
  return f;
}

TokenFile::~TokenFile() {
  if (map_) munmap(map_, map_bytes_);
}

void TokenFile::copy(size_t begin, size_t n, int32_t* out, int64_t vocab_size) const {
  if (begin + n > count_ || begin + n < begin)
    throw Error("token file '" + path_ + "': tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                ") lie past its " + std::to_string(count_) + " tokens");
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* p = tokens_ + (begin + i) * (dtype_ == TokenDType::U16 ? 2 : 4);
    const int64_t id = dtype_ == TokenDType::U16 ? static_cast<int64_t>(p[0] | p[1] << 8)
                                                 : static_cast<int64_t>(static_cast<uint32_t>(le32(p)));
    if (id >= vocab_size)
      throw Error("token file '" + path_ + "': token " + std::to_string(begin + i) + " is " + std::to_string(id) +
                  ", outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")");
    out[i] = static_cast<int32_t>(id);
  }
}

}  // namespace kiln
