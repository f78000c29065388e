// Corpus reading and batch sampling.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/philox.hpp>
#include <kiln/train/dataset.hpp>

namespace kiln {

std::string read_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw Error("cannot read '" + p.string() + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  if (!fs::exists(path)) throw Error("data '" + path + "' does not exist");
  if (!fs::is_directory(path)) return slurp(path);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path)) {
    std::string ext = e.path().extension().string();
    if (e.is_symlink() || !e.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw Error("directory '" + path + "' holds no text files");
  std::string text;
  for (const auto& f : files) text += slurp(f);
  return text;
}

TextDataset::TextDataset(std::vector<int32_t> tokens, uint64_t seed) : tokens_(std::move(tokens)), seed_(seed) {
  split_ = tokens_.size() - tokens_.size() / 10;
}

TextDataset::TextDataset(std::shared_ptr<const TokenFile> file, int64_t vocab_size, uint64_t seed)
    : file_(std::move(file)), vocab_size_(vocab_size), seed_(seed) {
  split_ = file_->size() - file_->size() / 10;
}

Batch TextDataset::batch(size_t begin, size_t end, uint32_t stream, uint64_t index, int64_t b, int64_t t) const {
  if (end - begin < static_cast<size_t>(t) + 1)
    throw Error("dataset split of " + std::to_string(end - begin) + " tokens is too short for block " +
                std::to_string(t) + " (needs at least block + 1)");
  HostTensor x = HostTensor::zeros(DType::i32, Shape{b, t}), y = HostTensor::zeros(DType::i32, Shape{b, t});
  const uint64_t range = end - begin - static_cast<uint64_t>(t);
  std::vector<int32_t> run(static_cast<size_t>(t) + 1);
  for (int64_t r = 0; r < b; ++r) {
    uint64_t bits = (static_cast<uint64_t>(philox_bits(seed_ ^ index, stream, 2 * static_cast<uint64_t>(r))) << 32) |
                    philox_bits(seed_ ^ index, stream, 2 * static_cast<uint64_t>(r) + 1);
    size_t start = begin + bits % range;
    if (file_)
      file_->copy(start, run.size(), run.data(), vocab_size_);
    else
      std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(start), run.size(), run.begin());
    std::copy_n(run.begin(), t, x.data<int32_t>() + r * t);
    std::copy_n(run.begin() + 1, t, y.data<int32_t>() + r * t);
  }
  return {Tensor::from_host(x), Tensor::from_host(y)};
}

Batch TextDataset::train_batch(uint64_t index, int64_t b, int64_t t) const { return batch(0, split_, 1, index, b, t); }

Batch TextDataset::val_batch(uint64_t index, int64_t b, int64_t t) const {
  return batch(split_, size(), 2, index, b, t);
}

}  // namespace kiln
