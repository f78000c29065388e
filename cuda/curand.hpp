// cuRAND loaded at run time (dlopen of libcurand, never linked): large uniform or normal f32
// tensors generated directly on the device with Philox4x32-10. Its streams are cuRAND's own,
// not kiln's Philox layout. It needs a current CUDA context, so it is used with a real Runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "cuda/driver_api.hpp"

namespace kiln::cuda {

class Curand {
 public:
  // dlopen("libcurand.so.10"), then "libcurand.so"; nullopt with the reason in *why when neither
  // loads or a symbol is missing.
  static std::optional<Curand> load(std::string* why);

  // Fill `out` (n floats on the device) from a fresh Philox generator seeded with `seed`:
  // uniform in (0, 1], or normal(mean, stddev), for which n must be even (cuRAND generates pairs;
  // rounding n up is the caller's job). Asynchronous on the default stream. Throw kiln::Error
  // naming the cuRAND status on failure.
  void uniform(CUdeviceptr out, size_t n, uint64_t seed) const;
  void normal(CUdeviceptr out, size_t n, float mean, float stddev, uint64_t seed) const;

 private:
  using Generator = struct curandGenerator_st*;
  struct Api {
    int (*create_generator)(Generator* g, int rng_type);
    int (*set_seed)(Generator g, unsigned long long seed);  // NOLINT(runtime/int): cuRAND's type
    int (*generate_uniform)(Generator g, float* out, size_t n);
    int (*generate_normal)(Generator g, float* out, size_t n, float mean, float stddev);
    int (*destroy_generator)(Generator g);
  };
  explicit Curand(Api api) : api_(api) {}
  // Creates and seeds a generator, runs `generate` on it, destroys it; checks every status.
  template <typename Generate>
  void run(const char* what, size_t n, uint64_t seed, Generate&& generate) const;

  Api api_;
};

}  // namespace kiln::cuda
