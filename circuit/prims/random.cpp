// Prim family `random`: Philox4x32-10 random tensors, the same bits on every backend.
// Shape contract: key: i32 (2) = (seed lo, seed hi), offset: i32 () -> params shape, params
// dtype. Both are runtime inputs so a new seed or offset is not a new plan.
// Params ints {kind, shape...}, reals {p}. Element i uses the stream of circuit/prims/philox.hpp:
//   uniform   u(i) = bits_to_uniform(philox_bits(seed, offset, i))       in [0, 1)
//   normal    sqrt(-2 log(1 - u(2i))) * cos(2 pi u(2i + 1))             (Box-Muller, one of the pair)
//   bernoulli 1 if u(i) < p else 0                                       (dropout keep masks)
// No gradient flows to key or offset.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/philox.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 2) ctx.fail("takes (key, offset)");
  ctx.require_dtype(in[0], DType::i32, "key");
  ctx.require_dtype(in[1], DType::i32, "offset");
  if (in[0].shape != Shape{2}) ctx.fail("key must have shape [2], received " + in[0].shape.str());
  if (in[1].shape != Shape{}) ctx.fail("offset must be a scalar [], received " + in[1].shape.str());
  if (p.ints.empty() || p.ints[0] < 0 || p.ints[0] > 2) ctx.fail("params must be {kind, shape...}");
  if (p.reals.size() != 1 || !(p.reals[0] >= 0.0 && p.reals[0] <= 1.0))
    ctx.fail("bernoulli probability must lie in [0, 1]");
  ctx.require_float({Shape{}, p.dtype}, "result dtype");
  ctx.require_dims(std::vector<int64_t>(p.ints.begin() + 1, p.ints.end()), "shape");
  return {{Shape(std::vector<int64_t>(p.ints.begin() + 1, p.ints.end())), p.dtype}};
}

// Elements in chunks of kChunk, each chunk's stream words drawn by philox_bits_range (one Philox
// call a counter block, not one an element), the chunks split across the OpenMP team.
constexpr int64_t kChunk = 1024;

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const int32_t* key = in[0]->data<int32_t>();
  uint64_t seed = static_cast<uint32_t>(key[0]) | (static_cast<uint64_t>(static_cast<uint32_t>(key[1])) << 32);
  auto offset = static_cast<uint32_t>(in[1]->data<int32_t>()[0]);
  auto kind = static_cast<RandomKind>(op.params.ints[0]);
  double p = op.params.reals[0];
  HostTensor out = bufs.output(0);
  const int64_t n = out.numel();
  ref::dispatch_float(out.dtype(), "random", [&](auto t) {
    using T = decltype(t);
    T* o = out.data<T>();
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
    for (int64_t first = 0; first < n; first += kChunk) {
      const int64_t count = std::min(kChunk, n - first);
      uint32_t bits[2 * kChunk];  // normal draws two words an element: 2i and 2i + 1
      const int64_t words = kind == RandomKind::Normal ? 2 : 1;
      philox_bits_range(seed, offset, static_cast<uint64_t>(first * words), count * words, bits);
      for (int64_t i = 0; i < count; ++i) {
        T& x = o[first + i];
        switch (kind) {
          case RandomKind::Uniform: x = static_cast<T>(bits_to_uniform(bits[i])); break;
          case RandomKind::Normal:
            x = static_cast<T>(std::sqrt(-2.0 * std::log(1.0 - bits_to_uniform(bits[2 * i]))) *
                               std::cos(2.0 * M_PI * bits_to_uniform(bits[2 * i + 1])));
            break;
          case RandomKind::Bernoulli: x = bits_to_uniform(bits[i]) < p ? T(1) : T(0); break;
        }
      }
    }
  });
  return {out};
}

}  // namespace

RandomParams RandomParams::of(const Op& op) {
  require_view_of(op, {PrimId::random}, "RandomParams");
  return {static_cast<RandomKind>(op.params.ints.at(0)),
          Shape(std::vector<int64_t>(op.params.ints.begin() + 1, op.params.ints.end())), op.params.reals.at(0),
          op.params.dtype};
}

Params RandomParams::to_params() const {
  Params p;
  p.ints = {static_cast<int64_t>(kind)};
  p.ints.insert(p.ints.end(), shape.dims().begin(), shape.dims().end());
  p.reals = {probability};
  p.dtype = dtype;
  return p;
}

void register_random(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::random;
  d.shape = shape_rule;
  d.eval = eval;
  d.differentiable = false;
  d.nondiff_inputs = {0, 1};
  d.describe = [](const Params& p) {
    static const char* kKinds[] = {"uniform", "normal", "bernoulli"};
    return p.ints[0] == 2 ? fmt::format("{} p={}", kKinds[p.ints[0]], p.reals[0]) : std::string(kKinds[p.ints[0]]);
  };
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
