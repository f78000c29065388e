// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so a (key, counter) pair gives the same bits on every backend.
// The Eigen executor uses it here; the PTX back end emits the same rounds in kernel IR.
#pragma once

#include <array>
#include <cstdint>

namespace kiln {

using PhiloxKey = std::array<uint32_t, 2>;
using PhiloxCounter = std::array<uint32_t, 4>;

// Ten rounds of Philox4x32 on one 128-bit counter.
std::array<uint32_t, 4> philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// kiln's stream layout, shared by every backend: element i of a random tensor drawn with
// (seed, offset) takes word (i % 4) of philox(counter = {lo32(i / 4), hi32(i / 4), offset, 0},
// key = {lo32(seed), hi32(seed)}).
uint32_t philox_bits(uint64_t seed, uint32_t offset, uint64_t element);

// philox_bits for elements [first, first + n) into out[0, n): one Philox call per counter block
// instead of one per element.
void philox_bits_range(uint64_t seed, uint32_t offset, uint64_t first, int64_t n, uint32_t* out);

// Bits -> floats, identical on every backend:
// uniform in [0, 1): (bits >> 8) * 2^-24 (exactly representable in f32).
double bits_to_uniform(uint32_t bits);

}  // namespace kiln
