// The one hash combiner of the graph IR (structural hashes of ScalarExp, Params, Circuits and
// CSE keys): splitmix64's finalizer over a boost-style combine.
#pragma once

#include <cstdint>

namespace kiln {

// splitmix64's finalizer: a bijective 64-bit mixer with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t hash_combine(uint64_t h, uint64_t v) {
  return mix64(h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)));
}

}  // namespace kiln
