// safetensors files (Hugging Face's weights format): an 8-byte little-endian header length N, N
// bytes of JSON mapping each tensor's name to {dtype, shape, data_offsets: [begin, end)} (offsets
// into the data that follows the header), an optional "__metadata__" object of strings, then the
// raw little-endian data. kiln reads them memory-mapped and checks the whole header before handing
// out a tensor: a header longer than 100 MB or than the file, malformed JSON, a repeated name, an
// unknown dtype, a byte count other than shape x dtype size, offsets out of range, overlapping or
// leaving gaps are errors naming the file and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <kiln/circuit/ir/host_tensor.hpp>

namespace kiln {

// The largest header kiln reads (the format's own readers refuse larger ones too).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // the format's name: "F32", "BF16", "F16", "F64", "I32", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

// A checked header: the tensors in the order of their data, and the metadata strings.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + the header length: where the data section starts in the file
};
// Checks `file` (a whole safetensors file's bytes) and returns its header; `source` names it in
// errors. Exposed for the fuzz target and the tests.
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& source);

// A safetensors file opened read-only and memory-mapped for its lifetime.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // kiln::Error naming the file on any fault
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& other) noexcept;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const SafetensorsEntry* find(const std::string& name) const;  // null when absent
  // The tensor converted to f32 (from F32, BF16, F16 or F64; any other dtype is an error naming
  // it). The file's pages are handed back to the kernel block by block as they are converted (read
  // again from the file if touched later): reading a model tensor by tensor keeps a few MB of the
  // file resident, not the file.
  HostTensor read_f32(const SafetensorsEntry& e) const;

 private:
  void release_pages(const uint8_t* begin, const uint8_t* end) const;
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t> by_name_;
};

// One tensor of a file to write: its name, the dtype stored (f32, bf16 or f16) and its shape.
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
};
// Writes a safetensors file atomically, tensor by tensor: `values(i)` gives tensor i's values (any
// float dtype, converted to specs[i].dtype; its shape must be specs[i].shape), so that only one
// tensor need be in memory at a time. The header is padded with spaces to a multiple of 8 bytes.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensorSpec>& specs,
                       const std::function<HostTensor(size_t)>& values,
                       const std::map<std::string, std::string>& metadata = {});

// The format's name of a kiln dtype ("F32", "BF16", "F16", "F64", "I32").
const char* safetensors_dtype_name(DType dt);

}  // namespace kiln
