// Philox4x32-10 counter-based RNG and kiln's stream layout on top of it: the host reference
// that every backend's random bits must match. Round function and key schedule follow
// Random123 (Salmon et al., SC'11).
#include <kiln/circuit/prims/philox.hpp>

namespace kiln {

namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multiplier for words 0 and 1
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;  // multiplier for words 2 and 3
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // Weyl increment, golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // Weyl increment, sqrt(3) - 1
constexpr int kPhiloxRounds = 10;

inline uint32_t lo32(uint64_t x) { return static_cast<uint32_t>(x); }
inline uint32_t hi32(uint64_t x) { return static_cast<uint32_t>(x >> 32); }

// One Philox4x32 S-box round, as Random123's _philox4x32round.
inline PhiloxCounter philox_round(const PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
  return {hi32(p1) ^ c[1] ^ k[0], lo32(p1), hi32(p0) ^ c[3] ^ k[1], lo32(p0)};
}

}  // namespace

std::array<uint32_t, 4> philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int r = 0; r < kPhiloxRounds; ++r) {
    if (r > 0) {  // key bumped between rounds: 9 bumps for 10 rounds
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    counter = philox_round(counter, key);
  }
  return counter;
}

uint32_t philox_bits(uint64_t seed, uint32_t offset, uint64_t element) {
  const uint64_t block = element / 4;
  const PhiloxCounter counter = {lo32(block), hi32(block), offset, 0u};
  const PhiloxKey key = {lo32(seed), hi32(seed)};
  return philox4x32_10(counter, key)[element % 4];
}

void philox_bits_range(uint64_t seed, uint32_t offset, uint64_t first, int64_t n, uint32_t* out) {
  const PhiloxKey key = {lo32(seed), hi32(seed)};
  const uint64_t end = first + static_cast<uint64_t>(n);
  for (uint64_t e = first; e < end;) {
    const uint64_t block = e / 4;
    const std::array<uint32_t, 4> words = philox4x32_10({lo32(block), hi32(block), offset, 0u}, key);
    for (; e < end && e / 4 == block; ++e) *out++ = words[e % 4];
  }
}

double bits_to_uniform(uint32_t bits) {
  // 24 high bits scaled by 2^-24: exact in f32, max value 1 - 2^-24 < 1.
  return static_cast<double>(bits >> 8) * (1.0 / 16777216.0);
}

}  // namespace kiln
