// Reference semantics of each Prim against plain loops on small inputs: every registered Prim
// is run through the Eigen executor (f32 and f64 where it takes floats) and compared with an
// independent naive loop written here with explicit index arithmetic; plus the composites.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <numbers>
#include <set>
#include <span>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/multi_tensor.hpp>

#include "prim_test_util.hpp"

namespace kiln {
namespace {

using Dims = std::vector<int64_t>;

template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::f32 : DType::f64;
}
template <class T>
constexpr double eps() {
  return std::is_same_v<T, float> ? 1e-6 : 1e-12;
}

HostTensor rnd(DType dt, Shape s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return testing::random_tensor(testing::InputSpec{std::move(s), dt, lo, hi}, seed);
}
HostTensor ints(Shape s, const std::vector<int32_t>& v) {
  HostTensor t = HostTensor::zeros(DType::i32, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}

// Row-major coordinates of flat index e in dims.
Dims coords_of(int64_t e, const Dims& dims) {
  Dims c(dims.size());
  for (size_t a = dims.size(); a-- > 0;) {
    c[a] = e % dims[a];
    e /= dims[a];
  }
  return c;
}
// Flat offset in a tensor of dims `src` of the element that numpy broadcasting maps to `c`
// (coordinates in a tensor of higher or equal rank; trailing dims aligned).
int64_t bcast_offset(const Dims& c, const Dims& src) {
  int64_t off = 0;
  size_t lead = c.size() - src.size();
  for (size_t a = 0; a < src.size(); ++a) off = off * src[a] + (src[a] == 1 ? 0 : c[lead + a]);
  return off;
}

bool close(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (got == want) return true;
  return std::fabs(got - want) <= tol * std::fabs(want);
}

// A tiny circuit: externals with bound tensors, a Builder under scope "ref", one run.
struct Net {
  Circuit c;
  std::vector<HostTensor> binds;
  Builder b{c, "ref"};
  ValueId in(const HostTensor& t, ValueRole role = ValueRole::Input) {
    binds.push_back(t);
    return c.add_external({t.shape(), t.dtype()}, role, "x" + std::to_string(binds.size() - 1));
  }
  HostTensor run(ValueId out) { return execute(c, binds, {out})[0]; }
};

template <class T>
class PrimReference : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(PrimReference, FloatTypes);

// --- pointwise --------------------------------------------------------------------------

struct BodyCase {
  const char* name;
  ScalarExp body;
  double lo, hi;  // input range
};

std::vector<BodyCase> bodies() {
  using se::in;
  ScalarExp a = in(0), b = in(1), c = in(2);
  return {
      {"add_mul", a + b * c, -2, 2},
      {"sub_div", a - b / c, 0.25, 2},
      {"neg_abs", -a + se::abs(b - c), -2, 2},
      {"max_min", se::max(a, b) * se::c(2.0) + se::min(a, c), -2, 2},
      {"compares",
       se::lt(a, b) + se::le(a, c) * se::c(2.0) + se::gt(b, c) * se::c(4.0) + se::ge(a, a) * se::c(8.0) +
           se::eq(b, b) * se::c(16.0) + se::ne(a, c) * se::c(32.0),
       -1, 1},
      {"select", se::select(se::gt(a, b), a * c, b - c), -1, 1},
      {"exp", se::exp(a) * b, -2, 2},
      {"log", se::log(a) * c, 0.1, 3},
      {"sqrt_rsqrt", se::sqrt(a) + se::rsqrt(b), 0.1, 3},
      {"tanh_sigmoid", se::tanh(a) * se::sigmoid(c), -3, 3},
      {"gelu", se::gelu(a) * c, -1, 3},           // x << 0 cancels in 1 + tanh(.)
      {"gelu_grad", se::gelu_grad(a) * c, 0, 3},  // its zero near x = -0.75 has no relative accuracy
      {"silu", se::silu(b) * a, -3, 3},
      {"sin_cos", se::sin(a) * se::cos(c), -3, 3},
      {"pow", se::pow(a, b), 0.2, 2},
  };
}

TYPED_TEST(PrimReference, PointwiseBroadcastMatchesScalarEval) {
  using T = TypeParam;
  const Dims s0{2, 3, 4}, s1{3, 1}, s2{4};
  for (const BodyCase& bc : bodies()) {
    Net n;
    HostTensor x0 = rnd(dtype_of<T>(), Shape(s0), 1, bc.lo, bc.hi), x1 = rnd(dtype_of<T>(), Shape(s1), 2, bc.lo, bc.hi),
               x2 = rnd(dtype_of<T>(), Shape(s2), 3, bc.lo, bc.hi);
    HostTensor out = n.run(n.b.pointwise(bc.body, {n.in(x0), n.in(x1), n.in(x2)}));
    ASSERT_EQ(out.shape(), Shape(s0)) << bc.name;
    ASSERT_EQ(out.dtype(), dtype_of<T>());
    // Relative 1e-6 in f32, 1e-12 in f64 (vectorized libm and FMA contraction differ from
    // the scalar oracle by an ulp or so; no body cancels catastrophically on its input range).
    const double tol = eps<T>();
    for (int64_t e = 0; e < out.numel(); ++e) {
      Dims c = coords_of(e, s0);
      std::array<T, 3> v{x0.data<T>()[bcast_offset(c, s0)], x1.data<T>()[bcast_offset(c, s1)],
                         x2.data<T>()[bcast_offset(c, s2)]};
      T want = bc.body.eval(std::span<const T>(v));
      EXPECT_TRUE(close(out.data<T>()[e], want, tol))
          << bc.name << " element " << e << ": got " << out.data<T>()[e] << ", want " << want;
    }
  }
}

TYPED_TEST(PrimReference, PointwiseScalarInputAndBothSidesBroadcast) {
  using T = TypeParam;
  Net n;
  HostTensor a = rnd(dtype_of<T>(), Shape{4, 1, 3}, 4), b = rnd(dtype_of<T>(), Shape{2, 1}, 5),
             s = rnd(dtype_of<T>(), Shape{}, 6);
  HostTensor out = n.run(n.b.pointwise(se::in(0) * se::in(2) - se::in(1), {n.in(a), n.in(b), n.in(s)}));
  ASSERT_EQ(out.shape(), (Shape{4, 2, 3}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k) {
        double prod = static_cast<double>(a.data<T>()[i * 3 + k]) * s.data<T>()[0], bv = b.data<T>()[j];
        EXPECT_NEAR(out.data<T>()[(i * 2 + j) * 3 + k], prod - bv, eps<T>() * (std::fabs(prod) + std::fabs(bv)));
      }
}

// --- reductions --------------------------------------------------------------------------

TYPED_TEST(PrimReference, ReduceAlongEachAxis) {
  using T = TypeParam;
  const Dims d{3, 5, 4};
  HostTensor x = rnd(dtype_of<T>(), Shape(d), 7, -2, 2);
  for (int axis = 0; axis < 3; ++axis)
    for (ReduceKind kind : {ReduceKind::Sum, ReduceKind::Max, ReduceKind::Mean}) {
      Net n;
      HostTensor out = n.run(n.b.reduce(kind, n.in(x), axis));
      Dims od = d;
      od[static_cast<size_t>(axis)] = 1;
      ASSERT_EQ(out.shape(), Shape(od));
      for (int64_t e = 0; e < out.numel(); ++e) {
        Dims c = coords_of(e, od);
        double sum = 0, abs_sum = 0, mx = -INFINITY;
        for (int64_t r = 0; r < d[static_cast<size_t>(axis)]; ++r) {
          c[static_cast<size_t>(axis)] = r;
          double v = x.data<T>()[(c[0] * d[1] + c[1]) * d[2] + c[2]];
          sum += v;
          abs_sum += std::fabs(v);
          mx = std::max(mx, v);
        }
        double n_axis = static_cast<double>(d[static_cast<size_t>(axis)]);
        double want = kind == ReduceKind::Sum ? sum : kind == ReduceKind::Max ? mx : sum / n_axis;
        double scale = kind == ReduceKind::Max ? 0.0 : (kind == ReduceKind::Sum ? abs_sum : abs_sum / n_axis);
        EXPECT_NEAR(out.get(e), want, 4 * eps<T>() * scale)
            << "axis " << axis << " kind " << static_cast<int>(kind) << " element " << e;
      }
    }
}

TYPED_TEST(PrimReference, ReduceAllSumAndMean) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{4, 3, 5}, 8);
  double sum = 0, abs_sum = 0;
  for (int64_t i = 0; i < x.numel(); ++i) sum += x.data<T>()[i], abs_sum += std::fabs(x.data<T>()[i]);
  Net n;
  ValueId v = n.in(x);
  ValueId s = n.b.reduce_all(ReduceKind::Sum, v), m = n.b.reduce_all(ReduceKind::Mean, v);
  auto out = execute(n.c, n.binds, {s, m});
  ASSERT_EQ(out[0].shape(), Shape{});
  EXPECT_NEAR(out[0].get(0), sum, 4 * eps<T>() * abs_sum);
  EXPECT_NEAR(out[1].get(0), sum / 60.0, 4 * eps<T>() * abs_sum / 60.0);
}

// --- matmul ------------------------------------------------------------------------------

struct MatmulCase {
  Dims a, b;
  bool ta, tb;
  Dims out;
};

template <class T>
void check_matmul(const MatmulCase& mc, uint64_t seed) {
  HostTensor a = rnd(dtype_of<T>(), Shape(mc.a), seed), b = rnd(dtype_of<T>(), Shape(mc.b), seed + 1);
  Net n;
  HostTensor out = n.run(n.b.matmul(n.in(a), n.in(b), mc.ta, mc.tb));
  ASSERT_EQ(out.shape(), Shape(mc.out));
  const size_t ra = mc.a.size(), rb = mc.b.size(), ro = mc.out.size();
  const int64_t ar = mc.a[ra - 2], ac = mc.a[ra - 1], br = mc.b[rb - 2], bc = mc.b[rb - 1];
  const int64_t m = mc.out[ro - 2], nn = mc.out[ro - 1], k = mc.ta ? ar : ac;
  const Dims ob(mc.out.begin(), mc.out.end() - 2), ab(mc.a.begin(), mc.a.end() - 2), bb(mc.b.begin(), mc.b.end() - 2);
  int64_t batches = 1;
  for (int64_t d : ob) batches *= d;
  for (int64_t e = 0; e < batches; ++e) {
    Dims c = coords_of(e, ob);
    const T* A = a.data<T>() + bcast_offset(c, ab) * ar * ac;
    const T* B = b.data<T>() + bcast_offset(c, bb) * br * bc;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < nn; ++j) {
        double want = 0, mag = 0;
        for (int64_t q = 0; q < k; ++q) {
          double av = mc.ta ? A[q * ac + i] : A[i * ac + q];
          double bv = mc.tb ? B[j * bc + q] : B[q * bc + j];
          want += av * bv;
          mag += std::fabs(av * bv);
        }
        double tol = (std::is_same_v<T, float> ? 1e-5 : 1e-12) * mag;
        EXPECT_NEAR(out.data<T>()[(e * m + i) * nn + j], want, tol)
            << "batch " << e << " (" << i << ", " << j << ") ta=" << mc.ta << " tb=" << mc.tb;
      }
  }
}

TYPED_TEST(PrimReference, MatmulFlagsBatchesAndBroadcast) {
  const std::vector<MatmulCase> cases = {
      {{5, 7}, {7, 3}, false, false, {5, 3}},
      {{7, 5}, {7, 3}, true, false, {5, 3}},
      {{5, 7}, {3, 7}, false, true, {5, 3}},
      {{7, 5}, {3, 7}, true, true, {5, 3}},
      {{2, 5, 7}, {7, 3}, false, false, {2, 5, 3}},  // batched a, shared 2-D b
      {{2, 5, 7}, {3, 7}, false, true, {2, 5, 3}},
      {{2, 7, 5}, {7, 3}, true, false, {2, 5, 3}},
      {{1, 2, 3}, {2, 3, 4}, false, false, {2, 2, 4}},  // batch broadcast
      {{5, 7}, {2, 7, 3}, false, false, {2, 5, 3}},     // 2-D a against a batched b
      {{2, 1, 3, 4}, {3, 5, 4}, false, true, {2, 3, 3, 5}},
  };
  for (size_t i = 0; i < cases.size(); ++i) check_matmul<TypeParam>(cases[i], 10 + 2 * i);
}

// --- gathers ------------------------------------------------------------------------------

TYPED_TEST(PrimReference, GatherRowsWithRepeatedIndices) {
  using T = TypeParam;
  HostTensor table = rnd(dtype_of<T>(), Shape{5, 3}, 30);
  const std::vector<int32_t> idx{0, 4, 4, 1, 2, 0, 0, 3};
  Net n;
  HostTensor out = n.run(n.b.gather_rows(n.in(table), n.in(ints(Shape{2, 4}, idx))));
  ASSERT_EQ(out.shape(), (Shape{2, 4, 3}));
  for (size_t p = 0; p < idx.size(); ++p)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(out.data<T>()[p * 3 + j], table.data<T>()[idx[p] * 3 + j]);
}

TYPED_TEST(PrimReference, ScatterAddRowsAccumulatesRepeats) {
  using T = TypeParam;
  const std::vector<int32_t> idx{1, 3, 1, 1, 0, 3};
  HostTensor src = rnd(dtype_of<T>(), Shape{6, 2}, 31);
  Net n;
  HostTensor out = n.run(n.b.scatter_add_rows(n.in(ints(Shape{6}, idx)), n.in(src), 5));
  ASSERT_EQ(out.shape(), (Shape{5, 2}));
  for (int32_t r = 0; r < 5; ++r)
    for (int64_t j = 0; j < 2; ++j) {
      double want = 0, mag = 0;
      for (size_t p = 0; p < idx.size(); ++p)
        if (idx[p] == r) want += src.data<T>()[p * 2 + j], mag += std::fabs(src.data<T>()[p * 2 + j]);
      EXPECT_NEAR(out.data<T>()[r * 2 + j], want, eps<T>() * mag) << "row " << r;
    }
  EXPECT_EQ(out.get(2 * 2), 0.0);
  EXPECT_EQ(out.get(4 * 2 + 1), 0.0);
}

TYPED_TEST(PrimReference, GatherLastPicksOneElementPerRow) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{2, 3, 5}, 32);
  const std::vector<int32_t> idx{4, 0, 2, 2, 1, 3};
  Net n;
  HostTensor out = n.run(n.b.gather_last(n.in(x), n.in(ints(Shape{2, 3}, idx))));
  ASSERT_EQ(out.shape(), (Shape{2, 3, 1}));
  for (size_t p = 0; p < idx.size(); ++p) EXPECT_EQ(out.data<T>()[p], x.data<T>()[p * 5 + idx[p]]);
  Net bad;
  const std::vector<int32_t> out_of_range{0, 5, 0, 0, 0, 0};
  try {
    bad.run(bad.b.gather_last(bad.in(x), bad.in(ints(Shape{2, 3}, out_of_range))));
    ADD_FAILURE() << "index 5 of 5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gather_last"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("index 5 at position 1"), std::string::npos) << e.what();
  }
}

TYPED_TEST(PrimReference, OneHot) {
  using T = TypeParam;
  const std::vector<int32_t> idx{3, 0, 2, 2, 1, 0};
  Net n;
  HostTensor out = n.run(n.b.one_hot(n.in(ints(Shape{2, 3}, idx)), 4, dtype_of<T>()));
  ASSERT_EQ(out.shape(), (Shape{2, 3, 4}));
  ASSERT_EQ(out.dtype(), dtype_of<T>());
  for (size_t p = 0; p < idx.size(); ++p)
    for (int32_t k = 0; k < 4; ++k) EXPECT_EQ(out.data<T>()[p * 4 + k], k == idx[p] ? T(1) : T(0));
}

// --- layout -------------------------------------------------------------------------------

TYPED_TEST(PrimReference, ReshapeWithInferredDim) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{2, 6}, 40);
  Net n;
  HostTensor out = n.run(n.b.reshape(n.in(x), Shape{3, -1, 2}));
  ASSERT_EQ(out.shape(), (Shape{3, 2, 2}));
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(out.data<T>()[i], x.data<T>()[i]);
}

TYPED_TEST(PrimReference, Permute3D) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{2, 3, 4}, 41);
  Net n;
  HostTensor out = n.run(n.b.permute(n.in(x), {2, 0, 1}));
  ASSERT_EQ(out.shape(), (Shape{4, 2, 3}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(out.data<T>()[(i * 2 + j) * 3 + k], x.data<T>()[(j * 3 + k) * 4 + i]);
}

TYPED_TEST(PrimReference, Broadcast) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{3, 1}, 42);
  Net n;
  HostTensor out = n.run(n.b.broadcast(n.in(x), Shape{2, 3, 4}));
  ASSERT_EQ(out.shape(), (Shape{2, 3, 4}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(out.data<T>()[(i * 3 + j) * 4 + k], x.data<T>()[j]);
}

TYPED_TEST(PrimReference, SliceMiddleAxis) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{4, 5, 3}, 43);
  Net n;
  HostTensor out = n.run(n.b.slice(n.in(x), 1, 1, 4));
  ASSERT_EQ(out.shape(), (Shape{4, 3, 3}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 3; ++k)
        EXPECT_EQ(out.data<T>()[(i * 3 + j) * 3 + k], x.data<T>()[(i * 5 + j + 1) * 3 + k]);
}

TYPED_TEST(PrimReference, ConcatThreeAlongMiddleAxis) {
  using T = TypeParam;
  HostTensor x0 = rnd(dtype_of<T>(), Shape{2, 1, 3}, 44), x1 = rnd(dtype_of<T>(), Shape{2, 4, 3}, 45),
             x2 = rnd(dtype_of<T>(), Shape{2, 2, 3}, 46);
  Net n;
  HostTensor out = n.run(n.b.concat({n.in(x0), n.in(x1), n.in(x2)}, 1));
  ASSERT_EQ(out.shape(), (Shape{2, 7, 3}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 7; ++j)
      for (int64_t k = 0; k < 3; ++k) {
        T want = j < 1   ? x0.data<T>()[(i * 1 + j) * 3 + k]
                 : j < 5 ? x1.data<T>()[(i * 4 + (j - 1)) * 3 + k]
                         : x2.data<T>()[(i * 2 + (j - 5)) * 3 + k];
        EXPECT_EQ(out.data<T>()[(i * 7 + j) * 3 + k], want) << i << "," << j << "," << k;
      }
}

TYPED_TEST(PrimReference, SplitAlongMiddleAxis) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{2, 7, 3}, 49);
  Net n;
  std::vector<ValueId> parts = n.b.split(n.in(x), 1, {1, 4, 2});
  auto out = execute(n.c, n.binds, parts);
  const int64_t sizes[] = {1, 4, 2}, starts[] = {0, 1, 5};
  for (int p = 0; p < 3; ++p) {
    ASSERT_EQ(out[p].shape(), (Shape{2, sizes[p], 3}));
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < sizes[p]; ++j)
        for (int64_t k = 0; k < 3; ++k)
          EXPECT_EQ(out[p].data<T>()[(i * sizes[p] + j) * 3 + k], x.data<T>()[(i * 7 + starts[p] + j) * 3 + k]);
  }
}

TYPED_TEST(PrimReference, WhereWithIntCondBroadcast) {
  using T = TypeParam;
  HostTensor cond = ints(Shape{3, 1}, {1, 0, -2}), a = rnd(dtype_of<T>(), Shape{3, 4}, 47),
             b = rnd(dtype_of<T>(), Shape{4}, 48);
  Net n;
  HostTensor out = n.run(n.b.where(n.in(cond), n.in(a), n.in(b)));
  ASSERT_EQ(out.shape(), (Shape{3, 4}));
  ASSERT_EQ(out.dtype(), dtype_of<T>());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      EXPECT_EQ(out.data<T>()[i * 4 + j], cond.data<int32_t>()[i] != 0 ? a.data<T>()[i * 4 + j] : b.data<T>()[j]);
}

TYPED_TEST(PrimReference, StopGradientIsIdentityAndFillIsConstant) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{3, 2}, 49);
  Net n;
  ValueId sg = n.b.stop_gradient(n.in(x));
  ValueId f = n.b.fill(Shape{2, 3}, dtype_of<T>(), -1.25);
  auto out = execute(n.c, n.binds, {sg, f});
  ASSERT_EQ(out[0].shape(), x.shape());
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(out[0].data<T>()[i], x.data<T>()[i]);
  ASSERT_EQ(out[1].shape(), (Shape{2, 3}));
  ASSERT_EQ(out[1].dtype(), dtype_of<T>());
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(out[1].data<T>()[i], T(-1.25));
}

TYPED_TEST(PrimReference, IotaCoordAndExpression) {
  using T = TypeParam;
  Net n;
  ValueId col = n.b.iota(Shape{3, 4}, dtype_of<T>(), ix::coord(1));
  ValueId lin = n.b.iota(Shape{3, 4}, dtype_of<T>(), ix::sub(ix::mul(ix::coord(0), ix::c(4)), ix::coord(1)));
  auto out = execute(n.c, n.binds, {col, lin});
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(out[0].data<T>()[i * 4 + j], T(j));
      EXPECT_EQ(out[1].data<T>()[i * 4 + j], T(i * 4 - j));
    }
}

TEST(PrimReferenceInt, IotaCausalMaskAndIntFill) {
  Net n;
  ValueId mask = n.b.iota(Shape{4, 4}, DType::i32, ix::ge(ix::coord(0), ix::coord(1)));
  ValueId f = n.b.fill(Shape{3}, DType::i32, 7.0);
  auto out = execute(n.c, n.binds, {mask, f});
  ASSERT_EQ(out[0].dtype(), DType::i32);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(out[0].data<int32_t>()[i * 4 + j], i >= j ? 1 : 0) << i << "," << j;
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(out[1].data<int32_t>()[i], 7);
}

TEST(PrimReferenceInt, CastTruncatesAndConverts) {
  const std::vector<double> vals{-2.7, -0.5, 0.5, 2.9, 3.0, -3.0, 1e6 + 0.75, -0.0};
  HostTensor x = HostTensor::zeros(DType::f64, Shape{8});
  for (size_t i = 0; i < vals.size(); ++i) x.data<double>()[i] = vals[i];
  HostTensor xi = ints(Shape{2, 3}, {-5, 0, 7, 16777217, -1, 123456});
  HostTensor xf = rnd(DType::f32, Shape{5}, 50, -3, 3);
  Net n;
  ValueId to_i = n.b.cast(n.in(x), DType::i32);
  ValueId i_to_f = n.b.cast(n.in(xi), DType::f32);
  ValueId f_to_d = n.b.cast(n.in(xf), DType::f64);
  auto out = execute(n.c, n.binds, {to_i, i_to_f, f_to_d});
  ASSERT_EQ(out[0].dtype(), DType::i32);
  for (size_t i = 0; i < vals.size(); ++i)
    EXPECT_EQ(out[0].data<int32_t>()[i], static_cast<int32_t>(std::trunc(vals[i])));
  ASSERT_EQ(out[1].dtype(), DType::f32);
  ASSERT_EQ(out[1].shape(), (Shape{2, 3}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(out[1].data<float>()[i], static_cast<float>(xi.data<int32_t>()[i]));
  ASSERT_EQ(out[2].dtype(), DType::f64);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(out[2].data<double>()[i], static_cast<double>(xf.data<float>()[i]));
}

// --- random -------------------------------------------------------------------------------

struct RandomNet {
  Net n;
  ValueId key, offset;
  RandomNet(int32_t lo, int32_t hi, int32_t off) {
    key = n.in(ints(Shape{2}, {lo, hi}));
    offset = n.in(ints(Shape{}, {off}));
  }
};

TEST(PrimReferenceRandom, UniformIsPhiloxBitsExactly) {
  const int32_t lo = 0x1234567, hi = -5;  // a negative hi word: the seed takes its 32 bits
  const uint64_t seed = 0x1234567ULL | (static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32);
  RandomNet r(lo, hi, 3);
  ValueId u64 = r.n.b.random(RandomKind::Uniform, Shape{3, 7}, DType::f64, r.key, r.offset);
  ValueId u32 = r.n.b.random(RandomKind::Uniform, Shape{9}, DType::f32, r.key, r.offset);
  auto out = execute(r.n.c, r.n.binds, {u64, u32});
  ASSERT_EQ(out[0].shape(), (Shape{3, 7}));
  for (uint64_t i = 0; i < 21; ++i) {
    double want = bits_to_uniform(philox_bits(seed, 3, i));
    EXPECT_EQ(out[0].data<double>()[i], want) << i;
    EXPECT_GE(want, 0.0);
    EXPECT_LT(want, 1.0);
  }
  for (uint64_t i = 0; i < 9; ++i)
    EXPECT_EQ(out[1].data<float>()[i], static_cast<float>(bits_to_uniform(philox_bits(seed, 3, i)))) << i;
}

TEST(PrimReferenceRandom, BernoulliAndNormal) {
  const uint64_t seed = 99;
  RandomNet r(99, 0, 11);
  ValueId bern = r.n.b.random(RandomKind::Bernoulli, Shape{50}, DType::f64, r.key, r.offset, 0.3);
  ValueId norm = r.n.b.random(RandomKind::Normal, Shape{4, 5}, DType::f64, r.key, r.offset);
  ValueId norm32 = r.n.b.random(RandomKind::Normal, Shape{6}, DType::f32, r.key, r.offset);
  auto out = execute(r.n.c, r.n.binds, {bern, norm, norm32});
  auto u = [&](uint64_t i) { return bits_to_uniform(philox_bits(seed, 11, i)); };
  int ones = 0;
  for (uint64_t i = 0; i < 50; ++i) {
    EXPECT_EQ(out[0].data<double>()[i], u(i) < 0.3 ? 1.0 : 0.0) << i;
    ones += out[0].data<double>()[i] == 1.0;
  }
  EXPECT_GT(ones, 0);
  EXPECT_LT(ones, 50);
  for (uint64_t i = 0; i < 20; ++i) {
    double want = std::sqrt(-2.0 * std::log(1.0 - u(2 * i))) * std::cos(2.0 * std::numbers::pi * u(2 * i + 1));
    EXPECT_NEAR(out[1].data<double>()[i], want, 1e-12 * std::max(1.0, std::fabs(want))) << i;
    if (i < 6) {
      EXPECT_NEAR(out[2].data<float>()[i], want, 1e-6 * std::max(1.0, std::fabs(want))) << i;
    }
  }
}

TEST(PrimReferenceRandom, SameKeyAndOffsetRepeatAnotherOffsetDiffers) {
  auto draw = [](int32_t off) {
    RandomNet r(2024, 1, off);
    return r.n.run(r.n.b.random(RandomKind::Uniform, Shape{16}, DType::f64, r.key, r.offset));
  };
  HostTensor a = draw(5), b = draw(5), c = draw(6);
  int differ = 0;
  for (int64_t i = 0; i < 16; ++i) {
    EXPECT_EQ(a.get(i), b.get(i));
    differ += a.get(i) != c.get(i);
  }
  EXPECT_GT(differ, 12);
}

// --- assign -------------------------------------------------------------------------------

TYPED_TEST(PrimReference, AssignWritesThePersistentBindingInPlace) {
  using T = TypeParam;
  HostTensor buf = rnd(dtype_of<T>(), Shape{2, 3}, 60), x = rnd(dtype_of<T>(), Shape{2, 3}, 61);
  HostTensor before = buf.clone();
  Net n;
  ValueId p = n.in(buf, ValueRole::Persistent);
  ValueId v = n.in(x);
  ValueId upd = n.b.add(p, v);  // reads the old version before the assign
  ValueId y = n.b.assign(p, upd);
  ValueId twice = n.b.scale(y, 2.0);  // reads the new version
  auto out = execute(n.c, n.binds, {y, twice});
  for (int64_t i = 0; i < 6; ++i) {
    T want = before.data<T>()[i] + x.data<T>()[i];
    EXPECT_EQ(buf.data<T>()[i], want) << i;
    EXPECT_EQ(out[1].data<T>()[i], want * T(2)) << i;
    EXPECT_EQ(out[0].data<T>()[i], want) << i;  // the new version
  }
}

TYPED_TEST(PrimReference, AFailedRunWritesNoBuffer) {
  using T = TypeParam;
  HostTensor buf = rnd(dtype_of<T>(), Shape{2, 3}, 62);
  HostTensor before = buf.clone();
  Net n;
  ValueId p = n.in(buf, ValueRole::Persistent);
  ValueId y = n.b.assign(p, n.b.scale(p, 3.0));
  HostTensor bad = HostTensor::zeros(DType::i32, Shape{1});
  bad.set(0, 9);  // out of range: the gather after the assign fails
  ValueId g = n.b.gather_rows(y, n.in(bad));
  EXPECT_THROW(execute(n.c, n.binds, {g}), kiln::Error);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(buf.data<T>()[i], before.data<T>()[i]) << i;
}

// --- fused_rows ---------------------------------------------------------------------------

// A program with an i32 mask, a column-broadcast and a per-row input; max, sum and mean (each
// reading the ones before), a row output and a per-row output. Long rows span several of the
// reference's blocks; short rows put many rows in one.
TYPED_TEST(PrimReference, FusedRowsMatchesNaiveLoop) {
  using T = TypeParam;
  for (const auto& [rows_n, n_] : {std::pair<int64_t, int64_t>{3, 5000}, {600, 7}}) {
    const int64_t rows = rows_n, n = n_;  // plain variables: lambdas below capture them (clang 14)
    HostTensor x = rnd(dtype_of<T>(), Shape{rows, n}, 80, -3, 3), w = rnd(dtype_of<T>(), Shape{n}, 81, 0.5, 1.5),
               s = rnd(dtype_of<T>(), Shape{rows, 1}, 82);
    HostTensor mask = HostTensor::zeros(DType::i32, Shape{1, n});
    for (int64_t j = 0; j < n; ++j) mask.set(j, j % 3 != 1);
    Net net;
    using se::in;
    const ScalarExp masked = se::select(in(1), in(0), se::c(-4.0));
    RowProgram rp;
    rp.inputs = 4;
    rp.domain = Shape{rows, n};
    rp.reduction_kinds = {ReduceKind::Max, ReduceKind::Sum, ReduceKind::Mean};
    rp.reduction_bodies = {masked, se::exp(masked - in(4)), in(0) * in(2) + in(3)};
    rp.output_per_row = {false, true};
    rp.output_bodies = {se::exp(masked - in(4)) / in(5) * in(2), se::log(in(5)) + in(6) * in(3)};
    std::vector<ValueId> outs =
        net.c.add_op("fused_rows", rp.to_params(dtype_of<T>()), {net.in(x), net.in(mask), net.in(w), net.in(s)});
    auto got = execute(net.c, net.binds, outs);
    ASSERT_EQ(got[0].shape(), (Shape{rows, n}));
    ASSERT_EQ(got[1].shape(), (Shape{rows, 1}));
    for (int64_t r = 0; r < rows; ++r) {
      auto xv = [&](int64_t j) { return static_cast<double>(x.data<T>()[r * n + j]); };
      auto mv = [&](int64_t j) { return j % 3 != 1 ? xv(j) : -4.0; };
      double mx = -INFINITY, z = 0, mean = 0;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, mv(j));
      for (int64_t j = 0; j < n; ++j) z += std::exp(mv(j) - mx);
      for (int64_t j = 0; j < n; ++j) mean += xv(j) * w.data<T>()[j] + s.data<T>()[r];
      mean /= static_cast<double>(n);
      for (int64_t j = 0; j < n; ++j) {
        const double want = std::exp(mv(j) - mx) / z * w.data<T>()[j];
        ASSERT_TRUE(close(got[0].data<T>()[r * n + j], want, 50 * eps<T>())) << r << "," << j;
      }
      const double want_row = std::log(z) + mean * s.data<T>()[r];
      ASSERT_TRUE(close(got[1].data<T>()[r], want_row, 500 * eps<T>())) << r;
    }
  }
}

// --- multi_tensor -------------------------------------------------------------------------

// Each group gives exactly what the pointwise op (and reduce_all of it, for sums) it stands for
// gives: bit for bit, since the reference evaluates the same body the same way. Groups span
// several of the reference's blocks or part of one; a group input is a scalar in one group.
TYPED_TEST(PrimReference, MultiTensorMatchesThePerGroupOps) {
  using T = TypeParam;
  const std::vector<Shape> shapes = {Shape{3, 2000}, Shape{7}, Shape{1, 5}};
  for (bool sum : {false, true}) {
    Net net;
    std::vector<ValueId> ins;
    for (size_t g = 0; g < shapes.size(); ++g) {
      ins.push_back(net.in(rnd(dtype_of<T>(), shapes[g], 90 + static_cast<int>(g))));
      ins.push_back(net.in(rnd(dtype_of<T>(), g == 1 ? Shape{} : shapes[g], 95 + static_cast<int>(g))));
    }
    ValueId k = net.in(rnd(dtype_of<T>(), Shape{1}, 99));
    MultiTensorProgram mp;
    mp.groups = static_cast<int>(shapes.size());
    mp.group_inputs = 2;
    mp.shared_inputs = 1;
    mp.sum = sum;
    const ScalarExp body = se::in(0) * se::in(1) - se::tanh(se::in(2) * se::in(0));
    mp.bodies = {body};
    std::vector<ValueId> args = ins;
    args.push_back(k);
    std::vector<ValueId> outs = net.c.add_op("multi_tensor", mp.to_params(dtype_of<T>()), args);
    std::vector<ValueId> want;
    for (size_t g = 0; g < shapes.size(); ++g) {
      ValueId v = net.b.pointwise(body, {ins[2 * g], ins[2 * g + 1], k});
      want.push_back(sum ? net.b.reduce_all(ReduceKind::Sum, v) : v);
    }
    std::vector<ValueId> all = outs;
    all.insert(all.end(), want.begin(), want.end());
    auto got = execute(net.c, net.binds, all);
    for (size_t g = 0; g < shapes.size(); ++g) {
      ASSERT_EQ(got[g].shape(), sum ? Shape{} : shapes[g]);
      for (int64_t i = 0; i < got[g].numel(); ++i)
        ASSERT_EQ(got[g].get(i), got[shapes.size() + g].get(i)) << "group " << g << " element " << i;
    }
  }
}

TEST(PrimReference, MultiTensorShapeRuleNamesTheGroupAndInput) {
  Circuit c;
  ValueId a = c.add_external({Shape{4, 3}, DType::f32}, ValueRole::Input, "a");
  ValueId b = c.add_external({Shape{3}, DType::f32}, ValueRole::Input, "b");
  MultiTensorProgram mp;
  mp.groups = 1;
  mp.group_inputs = 2;
  mp.bodies = {se::in(0) + se::in(1)};
  try {
    c.add_op("multi_tensor", mp.to_params(DType::f32), {a, b});
    FAIL() << "an input that is neither the domain nor a scalar must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 0 input 1 is [3]"), std::string::npos) << e.what();
  }
  mp.sum = true;
  mp.bodies = {se::in(0), se::in(1)};
  EXPECT_THROW(c.add_op("multi_tensor", mp.to_params(DType::f32), {a, a}), Error);  // a sum has one body
}

// --- fused_matmul -------------------------------------------------------------------------

// A fused_matmul gives what the ops it stands for give: a split piece of a wider tensor,
// reshaped and permuted to (b, h, t, d), scaled (the prologue), times b's rows (a transposed
// weight shared by the batch), plus a bias, then GELU (two epilogues: the pre-activation and
// the activation), stored permuted to (b, t, h, n), and the row sums of a (over k). Sums run
// in another order (gathered operands): f64 1e-12, f32 1e-5 relative.
TYPED_TEST(PrimReference, FusedMatmulMatchesTheOpsItStandsFor) {
  using T = TypeParam;
  Net net;
  const int64_t B = 2, Tn = 5, H = 3, D = 4, N = 6;
  ValueId qkv = net.in(rnd(dtype_of<T>(), Shape{B, Tn, 2 * H * D}, 120));
  ValueId w = net.in(rnd(dtype_of<T>(), Shape{N, D}, 121));
  ValueId bias = net.in(rnd(dtype_of<T>(), Shape{N}, 122));
  FusedMatmul f;
  f.batch = {B, H};
  f.m = Tn, f.n = N, f.k = D;
  f.a = {H * D, {Tn * 2 * H * D, D}, 2 * H * D, 1, se::in(0) * se::c(0.5)};  // piece 1 of the split
  f.b = {0, {0, 0}, D, 1, se::in(0)};
  f.extras = 1;
  f.epilogues = {se::in(0) + se::in(1), se::gelu(se::in(0) + se::in(1))};
  f.out_shape = Shape{B, Tn, H, N};
  f.out_batch = {Tn * H * N, N};
  f.out_row = H * N, f.out_col = 1;
  f.a_row_sums = true;
  f.row_sums_shape = Shape{B, H, Tn, 1};
  std::vector<ValueId> outs = net.c.add_op("fused_matmul", f.to_params(dtype_of<T>()), {qkv, w, bias});
  Builder& b = net.b;
  ValueId piece = b.split(qkv, 2, {H * D, H * D})[1];
  ValueId a = b.scale(b.permute(b.reshape(piece, Shape{B, Tn, H, D}), {0, 2, 1, 3}), 0.5);
  ValueId pre = b.add(b.matmul(a, w, false, true), bias);
  std::vector<ValueId> want = {b.permute(pre, {0, 2, 1, 3}),
                               b.permute(b.pointwise(se::gelu(se::in(0)), {pre}), {0, 2, 1, 3}),
                               b.reduce(ReduceKind::Sum, a, 3)};
  auto got = execute(net.c, net.binds, {outs[0], outs[1], outs[2], want[0], want[1], want[2]});
  const double tolerance = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  for (size_t o = 0; o < 3; ++o) {
    ASSERT_EQ(got[o].shape(), got[3 + o].shape());
    EXPECT_LT(testing::relative_error(got[o], got[3 + o]), tolerance) << "output " << o;
  }
}

// column_sums against the ops it stands for: sums over the leading axes of pointwise bodies
// whose inputs broadcast per row and per column (f64 1e-12, f32 1e-5 relative).
TYPED_TEST(PrimReference, ColumnSumsMatchTheOpsTheyStandFor) {
  using T = TypeParam;
  Net net;
  const Shape domain{2, 3, 5};
  ValueId x = net.in(rnd(dtype_of<T>(), domain, 130));
  ValueId s = net.in(rnd(dtype_of<T>(), Shape{2, 3, 1}, 131));
  ValueId g = net.in(rnd(dtype_of<T>(), Shape{5}, 132));
  const ColumnSumsParams p{
      domain, {se::in(0) * se::in(1), se::in(0), se::exp(se::in(0)) * se::in(2) - se::in(1)}, dtype_of<T>()};
  std::vector<ValueId> outs = net.c.add_op(PrimId::column_sums, p.to_params(), {x, s, g});
  Builder& b = net.b;
  std::vector<ValueId> want;
  for (const ScalarExp& body : p.bodies)
    want.push_back(b.reduce(ReduceKind::Sum, b.reshape(b.pointwise(body, {x, s, g}), Shape{6, 5}), 0));
  auto got = execute(net.c, net.binds, {outs[0], outs[1], outs[2], want[0], want[1], want[2]});
  const double tolerance = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  for (size_t o = 0; o < 3; ++o) {
    ASSERT_EQ(got[o].shape(), got[3 + o].shape());
    EXPECT_LT(testing::relative_error(got[o], got[3 + o]), tolerance) << "output " << o;
  }
  EXPECT_THROW(net.c.add_op(PrimId::column_sums, p.to_params(), {x, net.in(rnd(dtype_of<T>(), Shape{4}, 133)), g}),
               Error);
}

TEST(PrimReference, FusedMatmulShapeRuleRefusesViewsOutsideTheirBase) {
  Circuit c;
  ValueId a = c.add_external({Shape{4, 3}, DType::f32}, ValueRole::Input, "a");
  ValueId w = c.add_external({Shape{3, 5}, DType::f32}, ValueRole::Input, "w");
  FusedMatmul f = FusedMatmul::plain(Shape{4, 3}, Shape{3, 5}, false, false);
  EXPECT_NO_THROW(c.add_op("fused_matmul", f.to_params(DType::f32), {a, w}));
  FusedMatmul far = f;
  far.a.offset = 1;  // the last row would read element 12 of 12
  try {
    c.add_op("fused_matmul", far.to_params(DType::f32), {a, w});
    FAIL() << "a view past its base must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("operand a's view"), std::string::npos) << e.what();
  }
  FusedMatmul overlap = f;
  overlap.out_row = 1;  // rows and columns would land on the same elements
  EXPECT_THROW(c.add_op("fused_matmul", overlap.to_params(DType::f32), {a, w}), Error);
  FusedMatmul extra = f;
  extra.extras = 1;
  extra.epilogues = {se::in(0) + se::in(1)};
  EXPECT_THROW(c.add_op("fused_matmul", extra.to_params(DType::f32), {a, w, a}), Error);  // [4, 3] vs [4, 5]
}

// --- composites ---------------------------------------------------------------------------

TYPED_TEST(PrimReference, SoftmaxRowsSumToOne) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{3, 7}, 70, -4, 4);
  Net n;
  HostTensor out = n.run(composite::softmax(n.b, n.in(x)));
  ASSERT_EQ(out.shape(), (Shape{3, 7}));
  for (int64_t r = 0; r < 3; ++r) {
    double mx = -INFINITY, z = 0, total = 0;
    for (int64_t j = 0; j < 7; ++j) mx = std::max(mx, static_cast<double>(x.data<T>()[r * 7 + j]));
    for (int64_t j = 0; j < 7; ++j) z += std::exp(x.data<T>()[r * 7 + j] - mx);
    for (int64_t j = 0; j < 7; ++j) {
      double want = std::exp(x.data<T>()[r * 7 + j] - mx) / z;
      EXPECT_NEAR(out.data<T>()[r * 7 + j], want, 10 * eps<T>() * want);
      total += out.data<T>()[r * 7 + j];
    }
    EXPECT_NEAR(total, 1.0, 10 * eps<T>());
  }
}

TYPED_TEST(PrimReference, LayernormMatchesNaiveLoop) {
  using T = TypeParam;
  HostTensor x = rnd(dtype_of<T>(), Shape{2, 3, 6}, 71, -2, 2), w = rnd(dtype_of<T>(), Shape{6}, 72),
             bias = rnd(dtype_of<T>(), Shape{6}, 73);
  Net n;
  HostTensor out = n.run(composite::layernorm(n.b, n.in(x), n.in(w), n.in(bias), 1e-5));
  ASSERT_EQ(out.shape(), x.shape());
  for (int64_t r = 0; r < 6; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < 6; ++j) mu += x.data<T>()[r * 6 + j];
    mu /= 6;
    for (int64_t j = 0; j < 6; ++j) var += (x.data<T>()[r * 6 + j] - mu) * (x.data<T>()[r * 6 + j] - mu);
    var /= 6;
    for (int64_t j = 0; j < 6; ++j) {
      double want = (x.data<T>()[r * 6 + j] - mu) / std::sqrt(var + 1e-5) * w.data<T>()[j] + bias.data<T>()[j];
      EXPECT_NEAR(out.data<T>()[r * 6 + j], want, 20 * eps<T>() * std::max(1.0, std::fabs(want))) << r << "," << j;
    }
  }
}

TYPED_TEST(PrimReference, CrossEntropyIsMeanNegativeLogSoftmaxOfTarget) {
  using T = TypeParam;
  HostTensor logits = rnd(dtype_of<T>(), Shape{4, 9}, 74, -3, 3);
  const std::vector<int32_t> tgt{0, 8, 3, 3};
  Net n;
  HostTensor out = n.run(composite::cross_entropy(n.b, n.in(logits), n.in(ints(Shape{4}, tgt))));
  ASSERT_EQ(out.shape(), Shape{});
  double want = 0;
  for (int64_t r = 0; r < 4; ++r) {
    double z = 0;
    for (int64_t j = 0; j < 9; ++j) z += std::exp(static_cast<double>(logits.data<T>()[r * 9 + j]));
    want -= std::log(std::exp(static_cast<double>(logits.data<T>()[r * 9 + tgt[static_cast<size_t>(r)]])) / z);
  }
  want /= 4;
  EXPECT_NEAR(out.get(0), want, 20 * eps<T>() * std::fabs(want));
}

// gather_rows -> GatherRows.
std::string camel_case(const std::string& snake) {
  std::string out;
  bool upper = true;
  for (char ch : snake) {
    if (ch == '_') {
      upper = true;
    } else {
      out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
      upper = false;
    }
  }
  return out;
}

// Every registered Prim has a reference test named for it: its name in CamelCase within a
// PrimReference* test's name (gather_rows: PrimReference.GatherRowsWithRepeatedIndices). Derived
// from the registry and this binary's own list of tests, so a new Prim without a test fails here.
TEST(PrimReferenceTable, EveryRegisteredPrimHasATestNamedForIt) {
  std::vector<std::string> names;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    if (std::string(suite.name()).rfind("PrimReference", 0) != 0 || suite.name() == std::string("PrimReferenceTable"))
      continue;
    for (int k = 0; k < suite.total_test_count(); ++k)
      names.push_back(std::string(suite.name()) + "." + suite.GetTestInfo(k)->name());
  }
  ASSERT_FALSE(names.empty());
  for (const PrimDef* p : PrimRegistry::instance().all()) {
    if (p->id == PrimId::user) continue;  // registered by tests of user Prims (test_user_prims.cpp)
    const std::string want = camel_case(p->name);
    EXPECT_TRUE(std::any_of(names.begin(), names.end(),
                            [&](const std::string& n) { return n.find(want) != std::string::npos; }))
        << "Prim '" << p->name << "' has no reference test (none named with '" << want << "')";
  }
}

}  // namespace
}  // namespace kiln
