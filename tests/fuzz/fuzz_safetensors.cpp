// Fuzz target: a safetensors file (train/safetensors.hpp), as `kiln import` reads it: the header
// checked whole, then every tensor of a dtype kiln converts read as f32. An
// accepted file's tensors lie inside it, in order, without gaps (checked again here).
#include <kiln/train/safetensors.hpp>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const std::string& path = fuzz::input_file(data, size);
  return fuzz::refuse_or_accept([&] {
    const SafetensorsFile f(path);
    uint64_t at = 0;
    for (const SafetensorsEntry& e : f.header().tensors) {
      fuzz::require(e.begin == at && e.end >= e.begin, "tensors cover the data in order");
      fuzz::require(f.header().data_offset + e.end <= size, "a tensor lies inside the file");
      at = e.end;
      if (e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16" || e.dtype == "F64") {
        const HostTensor t = f.read_f32(e);
        fuzz::require(static_cast<uint64_t>(t.numel()) * 2 <= e.end - e.begin,
                      "no more elements than the stored bytes hold (2 bytes or more each)");
      }
    }
    fuzz::require(f.header().data_offset + at == size, "the tensors cover the data section");
  });
}
