// Fuzz target: weights files that are valid HDF5 with hostile content. The input is a list of
// edits, made with HDF5's C API to a valid tiny weights file, of the things kiln's reader must
// check itself: attributes of another type, rank or value, or missing; datasets of another
// type or shape, holding any bit pattern, or missing. Then the file is read as fuzz_weights
// reads it. (Raw-byte mutation mostly stops at HDF5's checksums; this reaches kiln's checks.)
//
// Edit encoding, repeated while bytes remain: op, which, then the op's payload.
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "weights_reader.hpp"

namespace {

using namespace kiln;

const char* const kAttributes[] = {"format",  "format_version", "vocab_size", "block_size",
                                   "n_layer", "n_head",         "n_embd",     "tokenizer"};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  void bytes(void* out, size_t n) {
    auto* o = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < n; ++i) o[i] = byte();
  }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

// The template: a valid weights file of a tiny model with a char tokenizer, and its datasets.
struct Template {
  std::string bytes;
  std::vector<std::string> datasets;
};

const Template& the_template() {
  static const Template t = [] {
    models::GPT model({.vocab_size = 5, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 4});
    const Tokenizer tok = Tokenizer::char_level("abcde");
    const std::string path = std::filesystem::temp_directory_path() / "kiln_fuzz_fields_template.h5";
    save_weights(path, model, &tok);
    Template out;
    std::ifstream in(path, std::ios::binary);
    out.bytes.assign(std::istreambuf_iterator<char>(in), {});
    std::filesystem::remove(path);
    for (const auto& [name, p] : model.named_parameters()) out.datasets.push_back(dataset_path(name));
    out.datasets.push_back("lm_head/weight");
    out.datasets.push_back("tokenizer/vocab");
    return out;
  }();
  return t;
}

void replace_attribute(hid_t file, const char* name, hid_t type, hid_t space, const void* value) {
  if (H5Aexists(file, name) > 0) H5Adelete(file, name);
  hid_t a = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    H5Awrite(a, type, value);
    H5Aclose(a);
  }
}

void edit(hid_t file, Reader& in) {
  const uint8_t op = in.byte() % 7, which = in.byte();
  const char* attribute = kAttributes[which % std::size(kAttributes)];
  const std::vector<std::string>& datasets = the_template().datasets;
  const std::string& dataset = datasets[which % datasets.size()];
  hid_t scalar = H5Screate(H5S_SCALAR);
  switch (op) {
    case 0: {  // an int64 attribute: a small value or any 64 bits
      int64_t v = 0;
      const uint8_t kind = in.byte();
      if (kind % 2) {
        v = static_cast<int8_t>(in.byte());
      } else {
        in.bytes(&v, sizeof v);
      }
      replace_attribute(file, attribute, H5T_NATIVE_INT64, scalar, &v);
      break;
    }
    case 1: {  // a float64 attribute
      double v = 0;
      in.bytes(&v, sizeof v);
      replace_attribute(file, attribute, H5T_NATIVE_DOUBLE, scalar, &v);
      break;
    }
    case 2: {  // a fixed-length string attribute of 1 to 16 bytes
      char s[16] = {};
      const size_t n = 1 + in.byte() % 16;
      in.bytes(s, n);
      hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, n);
      replace_attribute(file, attribute, type, scalar, s);
      H5Tclose(type);
      break;
    }
    case 3: {  // an attribute of 0 to 3 int64 elements (an array where a value is read)
      int64_t v[3] = {};
      const hsize_t n = in.byte() % 4;
      in.bytes(v, sizeof v);
      hid_t space = H5Screate_simple(1, &n, nullptr);
      replace_attribute(file, attribute, H5T_NATIVE_INT64, space, v);
      H5Sclose(space);
      break;
    }
    case 4:  // an attribute removed
      if (H5Aexists(file, attribute) > 0) H5Adelete(file, attribute);
      break;
    case 5: {  // a dataset replaced: f32, f64, i32 or i64, rank 0 to 3, any bits
      static const hid_t* const kTypes[] = {&H5T_NATIVE_FLOAT_g, &H5T_NATIVE_DOUBLE_g, &H5T_NATIVE_INT32_g,
                                            &H5T_NATIVE_INT64_g};
      const hid_t type = *kTypes[in.byte() % 4];
      const int rank = in.byte() % 4;
      hsize_t dims[3] = {1, 1, 1};
      hsize_t count = 1;
      for (int d = 0; d < rank; ++d) count *= (dims[d] = in.byte() % 70);
      std::vector<uint8_t> values(count * H5Tget_size(type));
      uint8_t pattern[8];
      in.bytes(pattern, sizeof pattern);
      for (size_t i = 0; i < values.size(); ++i) values[i] = pattern[i % sizeof pattern];
      H5Ldelete(file, dataset.c_str(), H5P_DEFAULT);
      hid_t space = rank ? H5Screate_simple(rank, dims, nullptr) : H5Screate(H5S_SCALAR);
      hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
      H5Pset_create_intermediate_group(lcpl, 1);
      hid_t d = H5Dcreate2(file, dataset.c_str(), type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
      if (d >= 0) {
        if (count > 0) H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
        H5Dclose(d);
      }
      H5Pclose(lcpl);
      H5Sclose(space);
      break;
    }
    default:  // a dataset removed
      H5Ldelete(file, dataset.c_str(), H5P_DEFAULT);
  }
  H5Sclose(scalar);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Template& t = the_template();
  const std::string& path = fuzz::input_file(reinterpret_cast<const uint8_t*>(t.bytes.data()), t.bytes.size());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) fuzz::require(false, "the template file opens");
  Reader in(data, size);
  for (int edits = 0; !in.done() && edits < 16; ++edits) edit(file, in);
  H5Fclose(file);
  return fuzz::refuse_or_accept([&] { fuzz::read_weights_as_sample(path); });
}
