#include <spdlog/fmt/fmt.h>

#include <cstring>

#include <kiln/cuda/sim/tensor_map.hpp>

namespace kiln::sim {

namespace {

// The fake's bytes: a magic word, then the fields as 64-bit words (the box packed 16 bits a
// dimension), 15 of the 16 words.
constexpr uint64_t kMagic = 0x50414d54'4e4c494bULL;  // "KILNTMAP", little-endian
enum Word : size_t { kMagicWord, kAddress, kShape, kDims, kStrides = kDims + kTensorMapMaxRank, kBox = kStrides + 4 };
static_assert(kBox + 2 <= kTensorMapBytes / 8);

}  // namespace

uint64_t TensorMap::box_bytes() const {
  uint64_t n = element_bytes;
  for (uint32_t d = 0; d < rank; ++d) n *= box[d];
  return n;
}

uint32_t TensorMap::box_offset(const std::array<uint32_t, kTensorMapMaxRank>& index) const {
  uint64_t linear = 0;
  for (uint32_t d = rank; d-- > 0;) linear = linear * box[d] + index[d];
  auto at = static_cast<uint32_t>(linear * element_bytes);
  if (swizzle == TensorSwizzle::b128) at ^= (at >> 3) & 0x70u;  // bits 4-6 ^= bits 7-9
  return at;
}

std::string tensor_map_problem(const TensorMap& m) {
  if (m.rank < 1 || m.rank > kTensorMapMaxRank)
    return fmt::format("rank {} (a tensor map has 1 to {} dimensions)", m.rank, kTensorMapMaxRank);
  if (m.element_bytes != 1 && m.element_bytes != 2 && m.element_bytes != 4 && m.element_bytes != 8)
    return fmt::format("elements of {} bytes", m.element_bytes);
  if (m.address % 16) return fmt::format("global address {:#x} is not 16-byte aligned", m.address);
  if (m.strides[0] != m.element_bytes) return "dimension 0 must be contiguous";
  for (uint32_t d = 0; d < m.rank; ++d) {
    if (m.dims[d] == 0 || m.dims[d] > (uint64_t{1} << 32))
      return fmt::format("dimension {} has {} elements (1 to 2^32)", d, m.dims[d]);
    if (d > 0 && (m.strides[d] % 16 || m.strides[d] >= (uint64_t{1} << 40)))
      return fmt::format("dimension {}'s stride of {} bytes (a multiple of 16, under 2^40)", d, m.strides[d]);
    if (m.box[d] == 0 || m.box[d] > 256) return fmt::format("box dimension {} of {} elements (1 to 256)", d, m.box[d]);
  }
  const uint64_t row = uint64_t{m.box[0]} * m.element_bytes;
  if (row % 16) return fmt::format("the box's rows are {} bytes (a multiple of 16)", row);
  if (m.swizzle == TensorSwizzle::b128 && row != 128)
    return fmt::format("the box's rows are {} bytes; the fake driver models the 128-byte swizzle for rows of 128", row);
  return "";
}

std::array<std::byte, kTensorMapBytes> encode_tensor_map(const TensorMap& m) {
  uint64_t w[kTensorMapBytes / 8] = {};
  w[kMagicWord] = kMagic;
  w[kAddress] = m.address;
  w[kShape] = m.rank | uint64_t{m.element_bytes} << 8 | uint64_t{static_cast<uint8_t>(m.swizzle)} << 16;
  for (uint32_t d = 0; d < kTensorMapMaxRank; ++d) {
    w[kDims + d] = m.dims[d];
    if (d > 0) w[kStrides + d - 1] = m.strides[d];
    w[kBox + d / 4] |= uint64_t{m.box[d]} << (16 * (d % 4));
  }
  std::array<std::byte, kTensorMapBytes> out;
  std::memcpy(out.data(), w, kTensorMapBytes);
  return out;
}

std::optional<TensorMap> decode_tensor_map(const std::byte* bytes) {
  uint64_t w[kTensorMapBytes / 8];
  std::memcpy(w, bytes, kTensorMapBytes);
  if (w[kMagicWord] != kMagic) return std::nullopt;
  TensorMap m;
  m.address = w[kAddress];
  m.rank = static_cast<uint32_t>(w[kShape] & 0xff);
  m.element_bytes = static_cast<uint32_t>((w[kShape] >> 8) & 0xff);
  m.swizzle = static_cast<TensorSwizzle>((w[kShape] >> 16) & 0xff);
  for (uint32_t d = 0; d < kTensorMapMaxRank; ++d) {
    m.dims[d] = w[kDims + d];
    m.strides[d] = d == 0 ? m.element_bytes : w[kStrides + d - 1];
    m.box[d] = static_cast<uint32_t>((w[kBox + d / 4] >> (16 * (d % 4))) & 0xffff);
  }
  if (m.swizzle != TensorSwizzle::none && m.swizzle != TensorSwizzle::b128) return std::nullopt;
  if (!tensor_map_problem(m).empty()) return std::nullopt;
  return m;
}

}  // namespace kiln::sim
