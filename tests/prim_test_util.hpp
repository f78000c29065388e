// Helpers shared by the Prim tests: random inputs from Philox (reproducible everywhere) and a
// small circuit harness that binds them.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/philox.hpp>

namespace kiln::testing {

struct InputSpec {
  Shape shape;
  DType dtype = DType::f64;
  double lo = -1.0, hi = 1.0;  // float inputs: uniform in [lo, hi); i32 inputs: integers in [lo, hi)
  bool check = true;           // include in the gradient check (float inputs only)
};

inline HostTensor random_tensor(const InputSpec& s, uint64_t seed) {
  HostTensor t = HostTensor::zeros(s.dtype, s.shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double u = bits_to_uniform(philox_bits(seed, 0, static_cast<uint64_t>(i)));
    double v = s.lo + (s.hi - s.lo) * u;
    t.set(i, s.dtype == DType::i32 ? std::floor(v) : v);
  }
  return t;
}

// ||got - want|| / ||want|| over all elements (the project's per-tensor error measure); infinite
// when the shapes differ, so that no tolerance accepts a mismatch.
inline double relative_error(const HostTensor& got, const HostTensor& want) {
  if (got.shape() != want.shape()) return INFINITY;
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double d = got.get(i) - want.get(i);
    num += d * d;
    den += want.get(i) * want.get(i);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

using BuildFn = std::function<ValueId(Builder&, const std::vector<ValueId>&)>;

// A circuit a test builds by hand, the outputs it requests and its inputs' values.
struct CircuitCase {
  Circuit circuit;
  std::vector<ValueId> outputs;
  std::vector<HostTensor> bindings;
};

// A circuit with one external per spec, the output built by `build`, and bound random inputs.
struct Harness {
  Circuit circuit;
  std::vector<ValueId> inputs;
  std::vector<HostTensor> bindings;
  ValueId output = kNoValue;

  Harness(const std::vector<InputSpec>& specs, const BuildFn& build, uint64_t seed = 42) {
    for (size_t i = 0; i < specs.size(); ++i) {
      inputs.push_back(
          circuit.add_external({specs[i].shape, specs[i].dtype}, ValueRole::Input, "x" + std::to_string(i)));
      bindings.push_back(random_tensor(specs[i], seed + i));
    }
    Builder b(circuit, "test");
    output = build(b, inputs);
  }
};

// How many ops of Prim `prim` the circuit has.
inline size_t count_prim(const Circuit& c, PrimId prim) {
  size_t n = 0;
  for (const Op& op : c.ops()) n += op.is(prim) ? 1 : 0;
  return n;
}

// A circuit under construction with random bindings for its externals, and its outputs.
struct Built {
  Circuit c;
  std::vector<HostTensor> binds;
  std::vector<ValueId> outs;
  ValueId input(Shape s, DType dt, uint64_t seed, ValueRole role = ValueRole::Input) {
    binds.push_back(random_tensor({s, dt}, seed));
    return c.add_external({std::move(s), dt}, role, "x" + std::to_string(seed));
  }
  // A copy of the bindings per run: an assign overwrites a persistent one.
  std::vector<HostTensor> fresh_binds() const {
    std::vector<HostTensor> copy;
    for (const HostTensor& t : binds) copy.push_back(t.clone());
    return copy;
  }
};

}  // namespace kiln::testing
