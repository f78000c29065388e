// The one hash combiner of the graph IR (structural hashes of ScalarExp, Params, Circuits and
// CSE keys): splitmix64's finalizer over a boost-style combine.
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln {

// splitmix64's finalizer: a bijective 64-bit mixer with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a over bytes: the same on every platform and run, for hashes that end up in files or
// text (module-cache keys, kernel names in PTX).
inline uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

inline uint64_t hash_combine(uint64_t h, uint64_t v) {
  return mix64(h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)));
}

}  // namespace kiln
