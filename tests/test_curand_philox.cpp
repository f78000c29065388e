// kiln's Philox4x32-10 streams against cuRAND's CURAND_RNG_PSEUDO_PHILOX4_32_10, bit for bit:
// kiln's host Philox (circuit/prims/philox.hpp) and its lowered random kernel run in the SIMT
// simulator. cuRAND is the CUDA toolkit's libcurand, loaded at run time like libcuda; its host
// generator needs no GPU. Without it the tests skip, except where KILN_REQUIRE_CURAND=1 (CI):
// there a missing libcurand fails them.
//
// The mapping, measured on cuRAND 10 (CUDA 12) and checked here: with seed s and the default
// ordering, cuRAND's host generator emits value p (p counting from the generator's offset 0) as
//   word (p % 4) of philox(counter = {lo32(r), hi32(r), k, 0}, key = {lo32(s), hi32(s)}),
//   with block b = p / 4, k = b % 65536 and r = b / 65536,
// which is element 4r + p % 4 of kiln's stream (seed s, offset k): philox_bits(s, k, 4r + p % 4).
// cuRAND interleaves 65536 of kiln's streams, four words at a time; kiln's `offset` is the
// subsequence of cuRAND's device API (curand_init(seed, subsequence = k, offset = 4r, ...)).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/philox.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"

namespace kiln {
namespace {

constexpr uint64_t kInterleavedStreams = 65536;

// The few entry points of libcurand these tests use (curand.h's signatures, enums by value).
class Curand {
 public:
  static Curand* load() {
    static Curand* lib = []() -> Curand* {
      for (const char* name : {"libcurand.so.10", "libcurand.so", "/usr/local/cuda/lib64/libcurand.so.10",
                               "/usr/local/cuda/lib64/libcurand.so"})
        if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
          auto* lib = new Curand(handle);
          if (lib->create_ && lib->set_seed_ && lib->set_offset_ && lib->generate_ && lib->destroy_) return lib;
          ADD_FAILURE() << name << " lacks an entry point of the host generator";
          return nullptr;
        }
      return nullptr;
    }();
    return lib;
  }

  // `n` 32-bit values of the Philox4x32-10 host generator for `seed`, from position `offset`.
  std::vector<uint32_t> generate(uint64_t seed, uint64_t offset, size_t n) const {
    void* generator = nullptr;
    check(create_(&generator, kPhilox4x32_10), "curandCreateGeneratorHost");
    check(set_seed_(generator, seed), "curandSetPseudoRandomGeneratorSeed");
    check(set_offset_(generator, offset), "curandSetGeneratorOffset");
    std::vector<uint32_t> out(n);
    check(generate_(generator, out.data(), n), "curandGenerate");
    check(destroy_(generator), "curandDestroyGenerator");
    return out;
  }

 private:
  static constexpr int kPhilox4x32_10 = 161;  // CURAND_RNG_PSEUDO_PHILOX4_32_10
  explicit Curand(void* handle)
      : create_(reinterpret_cast<decltype(create_)>(dlsym(handle, "curandCreateGeneratorHost"))),
        set_seed_(reinterpret_cast<decltype(set_seed_)>(dlsym(handle, "curandSetPseudoRandomGeneratorSeed"))),
        set_offset_(reinterpret_cast<decltype(set_offset_)>(dlsym(handle, "curandSetGeneratorOffset"))),
        generate_(reinterpret_cast<decltype(generate_)>(dlsym(handle, "curandGenerate"))),
        destroy_(reinterpret_cast<decltype(destroy_)>(dlsym(handle, "curandDestroyGenerator"))) {}
  static void check(int status, const char* call) {
    if (status != 0) throw std::runtime_error(std::string(call) + " returned " + std::to_string(status));
  }
  int (*create_)(void**, int);
  int (*set_seed_)(void*, unsigned long long);
  int (*set_offset_)(void*, unsigned long long);
  int (*generate_)(void*, unsigned int*, size_t);
  int (*destroy_)(void*);
};

#define KILN_CURAND_OR_SKIP(lib)                                                                             \
  const Curand* lib = Curand::load();                                                                        \
  if (!lib) {                                                                                                \
    const char* required = std::getenv("KILN_REQUIRE_CURAND");                                               \
    if (required && std::string(required) == "1")                                                            \
      FAIL() << "libcurand (CUDA toolkit) not found, and KILN_REQUIRE_CURAND=1: CI requires it";             \
    GTEST_SKIP() << "libcurand (CUDA toolkit) not found (set KILN_REQUIRE_CURAND=1 to make this a failure)"; \
  }

// kiln's stream and element for cuRAND's value at position p (the mapping above).
struct KilnElement {
  uint32_t stream;
  uint64_t element;
};
KilnElement kiln_element(uint64_t p) {
  const uint64_t block = p / 4;
  return {static_cast<uint32_t>(block % kInterleavedStreams), (block / kInterleavedStreams) * 4 + p % 4};
}

// cuRAND's position of element e of kiln's stream k.
uint64_t curand_position(uint32_t k, uint64_t e) { return ((e / 4) * kInterleavedStreams + k) * 4 + e % 4; }

TEST(CurandPhilox, HostStreamsAgreeBitForBit) {
  KILN_CURAND_OR_SKIP(curand);
  struct Stream {
    uint64_t seed, offset;
  };
  // Offsets past 2^34 reach counter words above 2^16 blocks; past 2^50, the counter's high word.
  const Stream streams[] = {{0, 0},
                            {42, 0},
                            {0xdeadbeefcafef00dULL, 0},
                            {7, 4 * 65536 * 3 + 8},
                            {7, (1ULL << 34) + 12},
                            {0xffffffff00000001ULL, (1ULL << 52) + 4 * 65535}};
  constexpr size_t kValues = size_t{1} << 16;
  for (const Stream& s : streams) {
    const std::vector<uint32_t> want = curand->generate(s.seed, s.offset, kValues);
    for (size_t j = 0; j < kValues; ++j) {
      const KilnElement k = kiln_element(s.offset + j);
      ASSERT_EQ(philox_bits(s.seed, k.stream, k.element), want[j])
          << "seed " << s.seed << ", cuRAND offset " << s.offset << ", value " << j << " (kiln stream " << k.stream
          << ", element " << k.element << ")";
    }
  }
}

TEST(CurandPhilox, MappingRoundTrips) {
  for (uint64_t p : {0ULL, 3ULL, 4ULL, 262143ULL, 262144ULL, (1ULL << 40) + 5}) {
    const KilnElement k = kiln_element(p);
    EXPECT_EQ(curand_position(k.stream, k.element), p);
  }
}

// The uniform random tensor of kiln's stream (seed, stream), n elements, lowered and run in the
// SIMT simulator behind the fake driver.
std::vector<uint32_t> simulated_top_bits(uint64_t seed, uint32_t stream, int64_t n) {
  Circuit c;
  const ValueId key = c.add_external({Shape{2}, DType::i32}, ValueRole::Input, "key");
  const ValueId offset = c.add_external({Shape{}, DType::i32}, ValueRole::Input, "offset");
  Builder b(c, "test");
  const ValueId out = b.random(RandomKind::Uniform, Shape{n}, DType::f32, key, offset);
  HostTensor key_t = HostTensor::zeros(DType::i32, Shape{2});
  key_t.data<int32_t>()[0] = static_cast<int32_t>(static_cast<uint32_t>(seed));
  key_t.data<int32_t>()[1] = static_cast<int32_t>(static_cast<uint32_t>(seed >> 32));
  HostTensor offset_t = HostTensor::zeros(DType::i32, Shape{});
  offset_t.data<int32_t>()[0] = static_cast<int32_t>(stream);
  cuda::DeviceProgram program(c, {out}, testing::fake_runtime());
  const HostTensor u = program.run({key_t, offset_t})[0];
  // u = (bits >> 8) * 2^-24 exactly: the top 24 bits of each word.
  std::vector<uint32_t> top(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) top[static_cast<size_t>(i)] = static_cast<uint32_t>(u.get(i) * 16777216.0);
  return top;
}

TEST(CurandPhilox, SimulatedRandomKernelAgreesWithCurand) {
  KILN_CURAND_OR_SKIP(curand);
  // cuRAND's first 2^20 values are elements 0..15 of kiln's streams 0..65535.
  constexpr int64_t kElements = 16;
  for (const uint64_t seed : {uint64_t{1234}, uint64_t{0x8000000180000001ULL}}) {
    const std::vector<uint32_t> want = curand->generate(seed, 0, kElements * kInterleavedStreams);
    for (const uint32_t stream : {0u, 1u, 2u, 3u, 1000u, 65535u}) {
      const std::vector<uint32_t> got = simulated_top_bits(seed, stream, kElements);
      for (int64_t e = 0; e < kElements; ++e)
        ASSERT_EQ(got[static_cast<size_t>(e)], want[curand_position(stream, static_cast<uint64_t>(e))] >> 8)
            << "seed " << seed << ", stream " << stream << ", element " << e;
    }
  }
  // 2^16 elements of one stream: the host Philox (checked against cuRAND above) for all of them,
  // cuRAND itself for blocks of four far into the stream.
  constexpr int64_t kLong = int64_t{1} << 16;
  const uint64_t seed = 99;
  const uint32_t stream = 5;
  const std::vector<uint32_t> got = simulated_top_bits(seed, stream, kLong);
  for (int64_t e = 0; e < kLong; ++e)
    ASSERT_EQ(got[static_cast<size_t>(e)], philox_bits(seed, stream, static_cast<uint64_t>(e)) >> 8) << "element " << e;
  for (const uint64_t block : {uint64_t{1}, uint64_t{777}, uint64_t{kLong / 4 - 1}}) {
    const std::vector<uint32_t> want = curand->generate(seed, curand_position(stream, 4 * block), 4);
    for (uint64_t w = 0; w < 4; ++w) ASSERT_EQ(got[4 * block + w], want[w] >> 8) << "element " << 4 * block + w;
  }
}

}  // namespace
}  // namespace kiln
