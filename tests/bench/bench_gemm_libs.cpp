// f32 GEMM of Eigen (as kiln's matmul reference calls it) against one BLAS chosen at build time,
// on exactly the GEMMs of one default-config kiln training step (GPT L4 H4 C128 T64 B16 V65):
// the token-row products of forward, dX and dW (C = A B, A B^T, A^T B, row-major), and the
// attention heads' 64 small products, run as kiln runs them (threads take whole heads, each
// product single-threaded). Prints GFLOP/s per shape (the best of several timed repetitions:
// the machine is shared) and the step's GEMM time at this thread count. Not built by CMake
// (the libraries are not kiln dependencies); build one binary per library:
//
//   flags="-O3 -march=x86-64-v3 -fopenmp -std=c++20 -I/usr/include/eigen3"
//   g++ $flags tests/bench/bench_gemm_libs.cpp -o /tmp/gemm_eigen
//   g++ $flags -DKILN_GEMM_OPENBLAS -I/usr/include/x86_64-linux-gnu/openblas-openmp \
//       tests/bench/bench_gemm_libs.cpp -o /tmp/gemm_openblas \
//       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas \
//       -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp                  # libopenblas-openmp-dev
//   g++ $flags -DKILN_GEMM_BLIS tests/bench/bench_gemm_libs.cpp -o /tmp/gemm_blis \
//       /usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4                    # libblis-openmp-dev
//   g++ $flags -DKILN_GEMM_DNNL tests/bench/bench_gemm_libs.cpp -o /tmp/gemm_dnnl -ldnnl  # libdnnl-dev
//   OMP_NUM_THREADS=2 /tmp/gemm_eigen      (and 1; BLIS: BLIS_NUM_THREADS as well)
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#if defined(KILN_GEMM_OPENBLAS)
#include <cblas.h>
constexpr const char* kLibrary = "OpenBLAS";
#elif defined(KILN_GEMM_BLIS)
extern "C" {  // BLIS's CBLAS interface (Debian ships no cblas.h for it)
enum CBLAS_ORDER { CblasRowMajor = 101 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };
void cblas_sgemm(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, int, int, int, float, const float*, int, const float*,
                 int, float, float*, int);
}
constexpr const char* kLibrary = "BLIS";
#elif defined(KILN_GEMM_DNNL)
#include <dnnl.h>
constexpr const char* kLibrary = "oneDNN";
#else
constexpr const char* kLibrary = "Eigen";
#endif

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// C[m, n] = op(A) op(B), all row-major, A stored [m, k] (or [k, m] with ta), B [k, n] (or [n, k]).
void eigen_gemm(const float* a, const float* b, float* c, int m, int n, int k, bool ta, bool tb) {
  Eigen::Map<const RowMat> A(a, ta ? k : m, ta ? m : k), B(b, tb ? n : k, tb ? k : n);
  Eigen::Map<RowMat> C(c, m, n);
  if (!ta && !tb) C.noalias() = A * B;
  if (ta && !tb) C.noalias() = A.transpose() * B;
  if (!ta && tb) C.noalias() = A * B.transpose();
  if (ta && tb) C.noalias() = A.transpose() * B.transpose();
}

void library_gemm(const float* a, const float* b, float* c, int m, int n, int k, bool ta, bool tb) {
  const int lda = ta ? m : k, ldb = tb ? k : n;
#if defined(KILN_GEMM_OPENBLAS) || defined(KILN_GEMM_BLIS)
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b,
              ldb, 0.0f, c, n);
#elif defined(KILN_GEMM_DNNL)
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
#else
  eigen_gemm(a, b, c, m, n, k, ta, tb);
#endif
}

struct Gemm {
  const char* what;
  int m, n, k;
  bool ta, tb;
  int per_step;  // times in one training step
  int batch;     // independent products (attention heads), 1 for token-row GEMMs
};

// The step's GEMMs: per layer (x4) the qkv, attention-output, MLP-up and MLP-down products with
// their dX and dW, the attention heads (B16 x H4 = 64 products of 64 x 64 x 32) forward and
// backward; once, the tied head (vocabulary 65).
const std::vector<Gemm> kStep = {
    {"fwd qkv        1024x128 . 128x384", 1024, 384, 128, false, true, 4, 1},
    {"fwd attn-out   1024x128 . 128x128", 1024, 128, 128, false, true, 4, 1},
    {"fwd mlp-up     1024x128 . 128x512", 1024, 512, 128, false, true, 4, 1},
    {"fwd mlp-down   1024x512 . 512x128", 1024, 128, 512, false, true, 4, 1},
    {"fwd head       1024x128 . 128x65 ", 1024, 65, 128, false, true, 1, 1},
    {"dX  qkv        1024x384 . 384x128", 1024, 128, 384, false, false, 4, 1},
    {"dX  attn-out   1024x128 . 128x128", 1024, 128, 128, false, false, 4, 1},
    {"dX  mlp-up     1024x512 . 512x128", 1024, 128, 512, false, false, 4, 1},
    {"dX  mlp-down   1024x128 . 128x512", 1024, 512, 128, false, false, 4, 1},
    {"dX  head       1024x65  . 65x128 ", 1024, 128, 65, false, false, 1, 1},
    {"dW  qkv        384x1024 . 1024x128", 384, 128, 1024, true, false, 4, 1},
    {"dW  attn-out   128x1024 . 1024x128", 128, 128, 1024, true, false, 4, 1},
    {"dW  mlp-up     512x1024 . 1024x128", 512, 128, 1024, true, false, 4, 1},
    {"dW  mlp-down   128x1024 . 1024x512", 128, 512, 1024, true, false, 4, 1},
    {"dW  head       65x1024  . 1024x128", 65, 128, 1024, true, false, 1, 1},
    {"att q.k^T      64 x [64x32 . 32x64]", 64, 64, 32, false, true, 4, 64},
    {"att p.v        64 x [64x64 . 64x32]", 64, 32, 64, false, false, 4, 64},
    {"att dP=dY.v^T  64 x [64x32 . 32x64]", 64, 64, 32, false, true, 4, 64},
    {"att dV=P^T.dY  64 x [64x64 . 64x32]", 64, 32, 64, true, false, 4, 64},
    {"att dQ=dS.k    64 x [64x64 . 64x32]", 64, 32, 64, false, false, 4, 64},
    {"att dK=dS^T.q  64 x [64x64 . 64x32]", 64, 32, 64, true, false, 4, 64},
};

double seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best time of `reps` runs of f (after one warm-up).
template <class F>
double best_seconds(F&& f, int reps) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, seconds(t0));
  }
  return best;
}

}  // namespace

int main() {
  std::printf("%s f32 GEMM, %d threads (best of 30 runs per shape)\n", kLibrary, omp_get_max_threads());
  double step_seconds = 0, step_flops = 0, worst_error = 0;
  for (const Gemm& g : kStep) {
    const size_t sa = static_cast<size_t>(g.m) * g.k, sb = static_cast<size_t>(g.k) * g.n,
                 sc = static_cast<size_t>(g.m) * g.n;
    std::vector<float> a(sa * g.batch), b(sb * g.batch), c(sc * g.batch), want(sc);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 53) % 97) / 97.0f - 0.5f;
    auto run = [&] {
      if (g.batch == 1) {
        library_gemm(a.data(), b.data(), c.data(), g.m, g.n, g.k, g.ta, g.tb);
        return;
      }
#pragma omp parallel for schedule(static)
      for (int e = 0; e < g.batch; ++e)
        library_gemm(a.data() + e * sa, b.data() + e * sb, c.data() + e * sc, g.m, g.n, g.k, g.ta, g.tb);
    };
    const double s = best_seconds(run, 30);
    // The product against a double-precision sum, entry 0 of the batch: a mis-called GEMM shows.
    for (int i = 0; i < g.m; ++i)
      for (int j = 0; j < g.n; ++j) {
        double sum = 0;
        for (int p = 0; p < g.k; ++p)
          sum += static_cast<double>(a[g.ta ? p * g.m + i : i * g.k + p]) * b[g.tb ? j * g.k + p : p * g.n + j];
        worst_error = std::max(worst_error, std::abs(sum - c[static_cast<size_t>(i) * g.n + j]) / (1 + std::abs(sum)));
      }
    const double flops = 2.0 * g.m * g.n * g.k * g.batch;
    std::printf("  %-36s %7.1f GFLOP/s  %7.3f ms\n", g.what, flops / s / 1e9, 1e3 * s);
    step_seconds += s * g.per_step;
    step_flops += flops * g.per_step;
  }
  std::vector<float> a(1 << 20), b(1 << 20), c(1 << 20);
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<float>(i % 17) / 17.0f - 0.5f;
  const double big =
      best_seconds([&] { library_gemm(a.data(), b.data(), c.data(), 1024, 1024, 1024, false, false); }, 5);
  std::printf("  %-36s %7.1f GFLOP/s\n", "1024^3", 2.0 * (1 << 30) / big / 1e9);
  std::printf("step GEMMs: %.2f ms, %.1f GFLOP/s; largest relative error %.1e\n", 1e3 * step_seconds,
              step_flops / step_seconds / 1e9, worst_error);
  return worst_error < 1e-4 ? 0 : 1;
}
