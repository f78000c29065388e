// Broadcast and bf16 helpers for the Eigen references.
#include <kiln/circuit/prims/eigen_util.hpp>

namespace kiln::ref {

std::vector<int64_t> broadcast_strides(const Shape& src, const Shape& dst) {
  std::vector<int64_t> out(static_cast<size_t>(dst.rank()), 0);
  const std::vector<int64_t> s = src.strides();
  for (int i = 0; i < src.rank(); ++i) {
    int d = dst.rank() - src.rank() + i;
    out[static_cast<size_t>(d)] = src[i] == 1 ? 0 : s[static_cast<size_t>(i)];
  }
  return out;
}

void broadcast_into(const HostTensor& x, const HostTensor& out) {
  dispatch_movable(x.dtype(), "broadcast", [&](auto t) {
    using T = decltype(t);
    broadcast_copy<T>(x.data<T>(), x.shape(), out.data<T>(), out.shape());
  });
}

void bf16_to_f32_into(const HostTensor& x, const HostTensor& out) {
  const Bf16* src = x.data<Bf16>();
  float* dst = out.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace kiln::ref
