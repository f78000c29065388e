// OneDnnMatmul (circuit/prims/onednn_matmul.hpp) and the matmul Prim on it under
// CpuBf16Products::onednn. Its layout handling (transposes as strides, batch dims broadcast,
// rank padding) is the same code for f32 and bf16 operands, so it is checked with f32 operands on
// every CPU, against f64 sums; the bf16 products themselves need a CPU with oneDNN's bf16 kernels
// (AVX-512: AMX-BF16, AVX512-BF16 or their emulation on avx512_core) and are skipped elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/onednn_matmul.hpp>

#include "prim_test_util.hpp"

namespace kiln {
namespace {

struct Case {
  Shape a, b;
  bool ta, tb;
};

// op(a) op(b) in f64, numpy broadcasting over the batch dims; shapes as the Prim's contract.
std::vector<double> reference(const Case& k, const HostTensor& a, const HostTensor& b, const Shape& c) {
  const int r = c.rank();
  auto at = [&](const HostTensor& x, const Shape& s, bool t, const std::vector<int64_t>& idx, int64_t i, int64_t j) {
    const int64_t rows = t ? j : i, cols = t ? i : j;
    int64_t off = cols + rows * s[s.rank() - 1], stride = s[s.rank() - 1] * s[s.rank() - 2];
    for (int d = s.rank() - 3; d >= 0; --d) {
      const int64_t n = s[d];
      off += (n == 1 ? 0 : idx[static_cast<size_t>(d + (r - s.rank()))]) * stride;
      stride *= n;
    }
    return x.get(off);
  };
  const int64_t m = c[r - 2], n = c[r - 1], kk = k.ta ? k.a[k.a.rank() - 2] : k.a[k.a.rank() - 1];
  std::vector<double> out(static_cast<size_t>(c.numel()));
  std::vector<int64_t> idx(static_cast<size_t>(r - 2), 0);
  const int64_t entries = c.numel() / (m * n);
  for (int64_t e = 0; e < entries; ++e) {
    int64_t rest = e;
    for (int d = r - 3; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rest % c[d];
      rest /= c[d];
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t q = 0; q < kk; ++q) sum += at(a, k.a, k.ta, idx, i, q) * at(b, k.b, k.tb, idx, q, j);
        out[static_cast<size_t>((e * m + i) * n + j)] = sum;
      }
  }
  return out;
}

// The product's shape: the batch dims broadcast as the Prim's shape rule does, then (M, N).
Shape product_shape(const Case& k) {
  auto batch = [](const Shape& s) { return Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - 2)); };
  std::vector<int64_t> dims = broadcast_shapes(batch(k.a), batch(k.b), "matmul").dims();
  dims.push_back(k.ta ? k.a[k.a.rank() - 1] : k.a[k.a.rank() - 2]);
  dims.push_back(k.tb ? k.b[k.b.rank() - 2] : k.b[k.b.rank() - 1]);
  return Shape(dims);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{7, 5}, {5, 9}, false, false},
      {{5, 7}, {5, 9}, true, false},
      {{7, 5}, {9, 5}, false, true},
      {{5, 7}, {9, 5}, true, true},
      {{3, 7, 5}, {3, 5, 9}, false, false},
      {{3, 5, 7}, {3, 9, 5}, true, true},
      {{3, 7, 5}, {5, 9}, false, false},
      {{7, 5}, {3, 9, 5}, false, true},          // a broadcast
      {{2, 1, 5, 7}, {1, 3, 9, 5}, true, true},  // both broadcast, rank 4
      {{2, 3, 4, 6}, {3, 6, 4}, false, false},   // b's rank padded
  };
  return all;
}

// Every layout against f64 sums with f32 operands (any CPU with oneDNN), and the kernel oneDNN
// chose named once. A transpose's strides swapped the wrong way, a broadcast dim read at a stride,
// or a rank padded on the wrong side fails here.
TEST(OneDnnMatmul, F32LayoutsMatchF64Sums) {
  if (!OneDnnMatmul::available(DType::f32)) GTEST_SKIP() << "kiln was built without oneDNN";
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.a.str() + (k.ta ? "ᵀ" : "") + " . " + k.b.str() + (k.tb ? "ᵀ" : ""));
    const Shape c = product_shape(k);
    const HostTensor a = testing::random_tensor({k.a, DType::f32}, 1), b = testing::random_tensor({k.b, DType::f32}, 2);
    HostTensor out = HostTensor::zeros(DType::f32, c);
    OneDnnMatmul product(DType::f32, k.a, k.ta, k.b, k.tb, c);
    if (&k == &cases().front()) std::printf("oneDNN f32 matmul kernel: %s\n", product.kernel().c_str());
    for (int run = 0; run < 2; ++run) {  // made once, run again on the same operands
      product.run(a.raw(), b.raw(), out.data<float>());
      const std::vector<double> want = reference(k, a, b, c);
      for (int64_t i = 0; i < c.numel(); ++i) ASSERT_NEAR(out.get(i), want[static_cast<size_t>(i)], 1e-5) << i;
    }
  }
}

TEST(OneDnnMatmul, RefusesWhatItCannotRunNamingTheOp) {
  try {
    OneDnnMatmul bad(DType::f64, Shape{2, 2}, false, Shape{2, 2}, false, Shape{2, 2});
    FAIL() << "f64 operands were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op 'matmul'"), std::string::npos) << e.what();
  }
}

// The matmul Prim with bf16 operands under CpuBf16Products::onednn: every layout against the
// widened f32 GEMM (the same rounded products, summed in another order) and f64 sums of the
// rounded operands; a second run of the plan (its kept primitive) gives the same bits.
TEST(OneDnnMatmul, Bf16ProductsMatchTheRoundedOperandsSums) {
  if (!OneDnnMatmul::available(DType::bf16))
    GTEST_SKIP() << "no oneDNN bf16 matmul on this CPU (it needs AVX-512; lscpu names the flags)";
  Target onednn = cpu_target();
  onednn.cpu_bf16 = CpuBf16Products::onednn;
  Target widened = onednn;
  widened.cpu_bf16 = CpuBf16Products::rounded_f32;
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.a.str() + (k.ta ? "ᵀ" : "") + " . " + k.b.str() + (k.tb ? "ᵀ" : ""));
    testing::Built b;
    const ValueId x = b.input(k.a, DType::f32, 1), y = b.input(k.b, DType::f32, 2);
    Builder bld(b.c, "test");
    const ValueId xa = bld.cast(x, DType::bf16), yb = bld.cast(y, DType::bf16);
    b.outs = {bld.matmul(xa, yb, k.ta, k.tb), bld.cast(xa, DType::f32), bld.cast(yb, DType::f32)};
    Program on(b.c, b.outs, onednn), off(b.c, b.outs, widened);
    const std::vector<HostTensor> got = on.run(b.binds), again = on.run(b.binds), want = off.run(b.binds);
    const std::vector<double> sums = reference(k, got[1], got[2], product_shape(k));
    for (int64_t i = 0; i < want[0].numel(); ++i) {
      ASSERT_NEAR(got[0].get(i), sums[static_cast<size_t>(i)], 1e-5) << i;
      ASSERT_NEAR(got[0].get(i), want[0].get(i), 1e-5) << i;
      ASSERT_EQ(again[0].get(i), got[0].get(i)) << i;
    }
  }
}

}  // namespace
}  // namespace kiln
