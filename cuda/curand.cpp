// cuRAND through dlopen: the five entry points kiln uses, resolved at run time, and a checked
// create / seed / generate / destroy sequence for each request.
#include "cuda/curand.hpp"

#include <dlfcn.h>
#include <spdlog/fmt/fmt.h>

#include "circuit/error.hpp"

namespace kiln::cuda {

namespace {

constexpr int kCurandSuccess = 0;
constexpr int kRngPhilox4x32_10 = 161;  // CURAND_RNG_PSEUDO_PHILOX4_32_10

const char* status_name(int status) {
  switch (status) {
    case 100: return "CURAND_STATUS_VERSION_MISMATCH";
    case 101: return "CURAND_STATUS_NOT_INITIALIZED";
    case 102: return "CURAND_STATUS_ALLOCATION_FAILED";
    case 103: return "CURAND_STATUS_TYPE_ERROR";
    case 104: return "CURAND_STATUS_OUT_OF_RANGE";
    case 105: return "CURAND_STATUS_LENGTH_NOT_MULTIPLE";
    case 106: return "CURAND_STATUS_DOUBLE_PRECISION_REQUIRED";
    case 201: return "CURAND_STATUS_LAUNCH_FAILURE";
    case 202: return "CURAND_STATUS_PREEXISTING_FAILURE";
    case 203: return "CURAND_STATUS_INITIALIZATION_FAILED";
    case 204: return "CURAND_STATUS_ARCH_MISMATCH";
    case 999: return "CURAND_STATUS_INTERNAL_ERROR";
    default: return "unknown cuRAND status";
  }
}

void check(int status, const std::string& what) {
  if (status != kCurandSuccess)
    throw Error(fmt::format("cuRAND: {} failed: {} ({})", what, status_name(status), status));
}

template <typename Fn>
bool resolve(void* lib, const char* symbol, Fn*& fn, std::string* why) {
  fn = reinterpret_cast<Fn*>(dlsym(lib, symbol));
  if (fn == nullptr && why != nullptr) *why = std::string("libcurand lacks ") + symbol;
  return fn != nullptr;
}

}  // namespace

std::optional<Curand> Curand::load(std::string* why) {
  // Never closed on success: generated work may still be running when a Curand goes away.
  void* lib = dlopen("libcurand.so.10", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libcurand.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    if (why) *why = std::string("libcurand.so.10 / libcurand.so not found: ") + (err ? err : "dlopen failed");
    return std::nullopt;
  }
  Api api{};
  if (!resolve(lib, "curandCreateGenerator", api.create_generator, why) ||
      !resolve(lib, "curandSetPseudoRandomGeneratorSeed", api.set_seed, why) ||
      !resolve(lib, "curandGenerateUniform", api.generate_uniform, why) ||
      !resolve(lib, "curandGenerateNormal", api.generate_normal, why) ||
      !resolve(lib, "curandDestroyGenerator", api.destroy_generator, why)) {
    dlclose(lib);
    return std::nullopt;
  }
  return Curand(api);
}

template <typename Generate>
void Curand::run(const char* what, size_t n, uint64_t seed, Generate&& generate) const {
  if (n == 0) return;
  Generator g = nullptr;
  check(api_.create_generator(&g, kRngPhilox4x32_10), "curandCreateGenerator(PHILOX4_32_10)");
  int status = api_.set_seed(g, seed);
  if (status == kCurandSuccess) status = generate(g);
  const int destroyed = api_.destroy_generator(g);
  check(status, fmt::format("{} of {} values with seed {}", what, n, seed));
  check(destroyed, "curandDestroyGenerator");
}

void Curand::uniform(CUdeviceptr out, size_t n, uint64_t seed) const {
  run("curandGenerateUniform", n, seed,
      [&](Generator g) { return api_.generate_uniform(g, reinterpret_cast<float*>(out), n); });
}

void Curand::normal(CUdeviceptr out, size_t n, float mean, float stddev, uint64_t seed) const {
  if (n % 2 != 0) throw Error(fmt::format("cuRAND: normal values come in pairs: n = {} must be even", n));
  run("curandGenerateNormal", n, seed,
      [&](Generator g) { return api_.generate_normal(g, reinterpret_cast<float*>(out), n, mean, stddev); });
}

}  // namespace kiln::cuda
