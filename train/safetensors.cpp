// Reading (memory-mapped, header checked whole) and writing safetensors files.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/atomic_file.hpp>
#include <kiln/train/json_text.hpp>
#include <kiln/train/safetensors.hpp>

// The format is little-endian, as are the machines kiln runs on: data is copied as it lies.
static_assert(std::endian::native == std::endian::little);

namespace kiln {

namespace {

// Element sizes of the format's dtypes (all it defines; kiln converts only the float ones).
const std::map<std::string, uint64_t>& dtype_sizes() {
  static const std::map<std::string, uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  return sizes;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// nlohmann's parser keeps the last of repeated keys; the format forbids them (two tensors of one
// name), so the parse callback refuses them, per object.
nlohmann::json parse_without_repeated_keys(std::string_view text, const std::string& source) {
  std::vector<std::set<std::string>> keys;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end && !keys.empty()) keys.pop_back();
    if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
      throw Error(source + ": the header names '" + parsed.get<std::string>() + "' twice");
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    throw Error(source + ": the header is not valid JSON (" + e.what() + ")");
  }
}

uint64_t checked_offset(const nlohmann::json& v, const std::string& where) {
  if (!v.is_number_unsigned()) throw Error(where + ": data_offsets must be two non-negative integers");
  return v.get<uint64_t>();
}

// IEEE half precision by hand (clang 14, which builds the sanitizer tier, has no _Float16 on x86).
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Rounded to nearest, ties to even; beyond the largest half (65504) rounds to infinity from 65520.
uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f), sign = (x >> 16) & 0x8000, a = x & 0x7fffffff;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));  // inf, NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);                                  // overflow
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, mantissa = round(v x 2^24), exact in float
    const float scaled = std::bit_cast<float>(a) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t h = ((((a >> 23) - 112) << 10) | ((a & 0x7fffff) >> 13));
  const uint32_t rest = a & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is still right
  return static_cast<uint16_t>(sign | h);
}

}  // namespace

const char* safetensors_dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
  }
  return "?";
}

SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& source) {
  if (file.size() < 8)
    throw Error(source + ": " + std::to_string(file.size()) +
                " bytes, shorter than a safetensors file's 8-byte header length");
  const uint64_t n = read_le64(file.data());
  if (n > kMaxSafetensorsHeaderBytes)
    throw Error(source + ": the header is " + std::to_string(n) + " bytes long, over the limit of " +
                std::to_string(kMaxSafetensorsHeaderBytes));
  if (n > file.size() - 8)
    throw Error(source + ": the header length " + std::to_string(n) + " runs past the end of the file (" +
                std::to_string(file.size()) + " bytes)");
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), n);
  require_json_depth(text, source);
  const nlohmann::json doc = parse_without_repeated_keys(text, source);
  if (!doc.is_object()) throw Error(source + ": the header is not a JSON object");
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = file.size() - h.data_offset;
  for (const auto& [name, v] : doc.items()) {
    const std::string where = source + ": tensor '" + name + "'";
    if (name == "__metadata__") {
      if (!v.is_object()) throw Error(source + ": __metadata__ is not an object of strings");
      for (const auto& [key, value] : v.items()) {
        if (!value.is_string()) throw Error(source + ": __metadata__ entry '" + key + "' is not a string");
        h.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) throw Error(where + " is not an object {dtype, shape, data_offsets}");
    for (const auto& [key, value] : v.items())
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        throw Error(where + ": unknown field '" + key + "'");
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw Error(where + ": no dtype string");
    if (!v.contains("shape") || !v["shape"].is_array()) throw Error(where + ": no shape array");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw Error(where + ": data_offsets must be two non-negative integers");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    auto size = dtype_sizes().find(e.dtype);
    if (size == dtype_sizes().end()) throw Error(where + ": unknown dtype '" + e.dtype + "'");
    // The element count, refusing overflow: the product of the dims times the element size must
    // stay below 2^63 before it is compared with the byte range.
    unsigned __int128 bytes = size->second;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw Error(where + ": the shape's dimensions must be non-negative integers");
      e.shape.push_back(d.get<int64_t>());
      bytes *= d.get<uint64_t>();
      if (bytes > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max()))
        throw Error(where + ": shape " + v["shape"].dump() + " is too large");
    }
    e.begin = checked_offset(v["data_offsets"][0], where);
    e.end = checked_offset(v["data_offsets"][1], where);
    if (e.begin > e.end)
      throw Error(where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                  ") end before they begin");
    if (e.end > data_size)
      throw Error(where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                  ") run past the data section's " + std::to_string(data_size) + " bytes");
    if (static_cast<unsigned __int128>(e.end - e.begin) != bytes)
      throw Error(where + ": " + std::to_string(e.end - e.begin) + " bytes of data for " + e.dtype + " shape " +
                  v["shape"].dump() + ", which needs " + std::to_string(static_cast<uint64_t>(bytes)));
    h.tensors.push_back(std::move(e));
  }
  // The data section is covered exactly: in offset order, each tensor starts where the last ended.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.begin < at)
      throw Error(source + ": tensor '" + e.name + "' at bytes [" + std::to_string(e.begin) + ", " +
                  std::to_string(e.end) + ") overlaps the tensor before it (which ends at " + std::to_string(at) + ")");
    if (e.begin > at)
      throw Error(source + ": the data has a gap: bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) +
                  ") before tensor '" + e.name + "' belong to no tensor");
    at = e.end;
  }
  if (at != data_size)
    throw Error(source + ": the tensors cover " + std::to_string(at) + " bytes of the data section's " +
                std::to_string(data_size));
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const std::string source = "'" + path + "'";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open " + source + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(source + " is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error("cannot map " + source + ": " + std::strerror(err));
    }
    map_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping keeps the file
  try {
    header_ = parse_safetensors({map_, size_}, source);
  } catch (...) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    throw;
  }
  for (size_t i = 0; i < header_.tensors.size(); ++i) by_name_[header_.tensors[i].name] = i;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      size_(o.size_),
      header_(std::move(o.header_)),
      by_name_(std::move(o.by_name_)) {
  o.map_ = nullptr;
  o.size_ = 0;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

HostTensor SafetensorsFile::read_f32(const SafetensorsEntry& e) const {
  if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16" && e.dtype != "F64")
    throw Error("'" + path_ + "': tensor '" + e.name + "' is " + e.dtype +
                "; kiln reads F32, BF16, F16 and F64 weights");
  const size_t element = dtype_sizes().at(e.dtype);
  HostTensor out = HostTensor::zeros(DType::f32, Shape(e.shape));
  float* dst = out.data<float>();
  const uint8_t* src = map_ + header_.data_offset + e.begin;
  const size_t n = static_cast<size_t>(out.numel());
  constexpr size_t kBlock = size_t{1} << 20;  // elements per block (4-8 MB of the file)
  for (size_t first = 0; first < n; first += kBlock) {
    const size_t count = std::min(kBlock, n - first);
    const uint8_t* s = src + first * element;
    // memcpy per element: the data need not be aligned (offsets are any byte count).
    if (element == 4) {
      std::memcpy(dst + first, s, count * 4);
    } else if (element == 8) {
      for (size_t i = 0; i < count; ++i) {
        double d;
        std::memcpy(&d, s + 8 * i, 8);
        dst[first + i] = static_cast<float>(d);
      }
    } else {
      const bool bf16 = e.dtype == "BF16";
      for (size_t i = 0; i < count; ++i) {
        uint16_t b;
        std::memcpy(&b, s + 2 * i, 2);
        dst[first + i] = bf16 ? bf16_to_f32(Bf16{b}) : f16_to_f32(b);
      }
    }
    release_pages(s, s + count * element);
  }
  return out;
}

void SafetensorsFile::release_pages(const uint8_t* begin, const uint8_t* end) const {
  // madvise works on whole pages: those wholly inside [begin, end).
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = reinterpret_cast<uintptr_t>(end) / page * page;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensorSpec>& specs,
                       const std::function<HostTensor(size_t)>& values,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  std::set<std::string> names;
  for (const SafetensorsTensorSpec& s : specs) {
    if (s.dtype != DType::f32 && s.dtype != DType::bf16 && s.dtype != DType::f16)
      throw Error("write_safetensors '" + path + "': tensor '" + s.name + "' as " + dtype_name(s.dtype) +
                  "; kiln writes f32, bf16 or f16");
    if (s.name == "__metadata__" || !names.insert(s.name).second)
      throw Error("write_safetensors '" + path + "': the name '" + s.name + "' is reserved or given twice");
    const uint64_t bytes = static_cast<uint64_t>(s.shape.numel()) * dtype_size(s.dtype);
    header[s.name] = {
        {"dtype", safetensors_dtype_name(s.dtype)}, {"shape", s.shape.dims()}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  replace_file_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (size_t i = 0; i < specs.size(); ++i) {
      const SafetensorsTensorSpec& s = specs[i];
      const HostTensor v = values(i);
      if (v.shape() != s.shape)
        throw Error("write_safetensors '" + path + "': tensor '" + s.name + "' has shape " + v.shape().str() +
                    ", its header says " + s.shape.str());
      if (v.dtype() == s.dtype) {  // already in the stored dtype: its bytes as they are
        out.write(static_cast<const char*>(v.raw()), static_cast<std::streamsize>(v.nbytes()));
        continue;
      }
      std::vector<uint8_t> bytes(static_cast<size_t>(v.numel()) * dtype_size(s.dtype));
      for (int64_t j = 0; j < v.numel(); ++j) {
        const float f = static_cast<float>(v.get(j));
        if (s.dtype == DType::f32) {
          std::memcpy(bytes.data() + 4 * j, &f, 4);
        } else {
          const uint16_t b = s.dtype == DType::bf16 ? f32_to_bf16(f).bits : f32_to_f16(f);
          std::memcpy(bytes.data() + 2 * j, &b, 2);
        }
      }
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    out.flush();
    if (!out) throw Error("cannot write '" + path + "': " + std::strerror(errno));
  });
}

}  // namespace kiln
