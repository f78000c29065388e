// Fuzz target: a weights file (train/weights.hpp) as raw bytes. kiln's files checksum their
// metadata and data, so most mutations meet HDF5's checksums; fuzz_weights_fields edits the
// content of valid files instead.
#include "weights_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kiln::fuzz::input_file(data, size);
  return kiln::fuzz::refuse_or_accept([&] { kiln::fuzz::read_weights_as_sample(path); });
}
