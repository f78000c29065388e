// bfloat16 storage: the top 16 bits of an IEEE f32. Values are stored as bf16 and computed in
// f32, as the GPU's tensor cores and conversions do; these two conversions are the whole of
// bf16 arithmetic on the host, so the Eigen executor rounds exactly as `cvt.rn.bf16.f32` does.
#pragma once

#include <bit>
#include <cstdint>

namespace kiln {

// A bf16 value's bits: a distinct type, so that bf16 storage is never mistaken for an integer.
struct Bf16 {
  uint16_t bits = 0;
};

// Exact: every bf16 value is an f32 value.
inline float bf16_to_f32(Bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }

// Round to nearest, ties to even (cvt.rn.bf16.f32). Any NaN becomes the canonical NaN 0x7fff;
// values past the largest finite bf16 round to infinity.
inline Bf16 f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{0x7fff};
  const uint32_t lsb = (u >> 16) & 1u;
  return Bf16{static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16)};
}

// f rounded to bf16 and back: the value a bf16 cast keeps (ScalarExp round_bf16).
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace kiln
