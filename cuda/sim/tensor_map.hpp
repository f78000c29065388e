// Tensor maps as the fake driver makes them and the simulator reads them. A real CUtensorMap is
// 128 opaque bytes that cuTensorMapEncodeTiled fills and the GPU's tensor copy engine reads; the
// fake driver (cuda/driver/fake_driver.cpp) fills the same 128 bytes with the fields below in a
// layout of its own, which the simulator decodes when a kernel's cp.async.bulk.tensor names it.
// Only what kiln uses is modelled: tiled boxes, element strides of 1, no interleave, zeros for
// elements outside the tensor, and no swizzle or the 128-byte one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace kiln::sim {

constexpr size_t kTensorMapBytes = 128;
constexpr size_t kTensorMapAlign = 64;
constexpr int kTensorMapMaxRank = 5;

enum class TensorSwizzle : uint8_t {
  none,  // the box lands row after row, as it is in the tensor
  // The box's rows are 128 bytes; within each 1024 bytes, the 16-byte chunk c of row j (j = 0..7)
  // lands at chunk position c XOR j: shared address bits 4-6 XOR bits 7-9 (wgmma's 128-byte
  // swizzled layout, so a box is an operand's atoms).
  b128,
};

// A tensor of rank dimensions, dimension 0 innermost (contiguous), and the box a copy moves.
struct TensorMap {
  uint64_t address = 0;  // global, 16-byte aligned
  uint32_t rank = 0;     // 1 to 5
  uint32_t element_bytes = 0;
  std::array<uint64_t, kTensorMapMaxRank> dims{};     // elements; at most 2^32
  std::array<uint64_t, kTensorMapMaxRank> strides{};  // bytes; strides[0] = element_bytes, others multiples of 16
  std::array<uint32_t, kTensorMapMaxRank> box{};      // elements a copy moves, 1 to 256 each
  TensorSwizzle swizzle = TensorSwizzle::none;

  uint64_t box_bytes() const;
  // Where box element `index` (innermost first) lands, in bytes from the box's shared
  // destination: row-major over the box, then swizzled (the destination is 1024-byte aligned).
  uint32_t box_offset(const std::array<uint32_t, kTensorMapMaxRank>& index) const;
};

// Why a map cannot be encoded ("" when it can): the real driver's rules on rank, alignment,
// dimensions, strides and box (which it reports as CUDA_ERROR_INVALID_VALUE), and the fake's
// limits above.
std::string tensor_map_problem(const TensorMap& map);

// The 128 bytes the fake driver writes, and back; decode gives nullopt for bytes the fake did not write.
std::array<std::byte, kTensorMapBytes> encode_tensor_map(const TensorMap& map);
std::optional<TensorMap> decode_tensor_map(const std::byte* bytes);

}  // namespace kiln::sim
