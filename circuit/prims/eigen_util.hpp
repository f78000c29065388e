// Internal helpers shared by the Prims' Eigen references: dtype dispatch, array views and
// broadcast copies. Only circuit/prims/*.cpp and the executor include this (it pulls in Eigen).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <string>
#include <vector>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/host_tensor.hpp>

namespace kiln::ref {

template <class T>
using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;

template <class T>
Eigen::Map<Arr<T>> array_of(const HostTensor& t) {
  return Eigen::Map<Arr<T>>(t.data<T>(), t.numel());
}

// Calls f(T{}) with T = float or double according to dt; other dtypes are an error naming op.
template <class F>
decltype(auto) dispatch_float(DType dt, const std::string& op, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    default: throw Error("op '" + op + "': the Eigen executor runs f32 and f64 tensors, received " + dtype_name(dt));
  }
}

// Calls f(T{}) for any dtype the host executes (f32, f64, i32).
template <class F>
decltype(auto) dispatch_any(DType dt, const std::string& op, F&& f) {
  if (dt == DType::i32) return f(int32_t{});
  return dispatch_float(dt, op, std::forward<F>(f));
}

// Calls f(T{}) for any dtype whose elements the host can move without arithmetic: those of
// dispatch_any and bf16 (as Bf16). For the Prims that only copy elements (permute, slice,
// concat, split, broadcast).
template <class F>
decltype(auto) dispatch_movable(DType dt, const std::string& op, F&& f) {
  if (dt == DType::bf16) return f(Bf16{});
  return dispatch_any(dt, op, std::forward<F>(f));
}

// f32 copy of a float tensor's elements converted from bf16 (exact), into `out` (f32, same
// numel). Arithmetic on bf16 values runs in f32 on such copies.
void bf16_to_f32_into(const HostTensor& x, const HostTensor& out);

// Strides of `src` laid against `dst` (numpy alignment of trailing dims); 0 where broadcast.
std::vector<int64_t> broadcast_strides(const Shape& src, const Shape& dst);

// dst[i] = src[broadcast index of i] for every element of dst_shape.
template <class T>
void broadcast_copy(const T* src, const Shape& src_shape, T* dst, const Shape& dst_shape) {
  const int64_t n = dst_shape.numel();
  if (src_shape.numel() == n) {
    std::copy(src, src + n, dst);
    return;
  }
  if (src_shape.numel() == 1) {
    std::fill(dst, dst + n, src[0]);
    return;
  }
  const std::vector<int64_t> st = broadcast_strides(src_shape, dst_shape);
  const int r = dst_shape.rank();
  const int64_t inner = dst_shape[r - 1], inner_stride = st[static_cast<size_t>(r - 1)];
  std::vector<int64_t> idx(static_cast<size_t>(r), 0);
  for (int64_t base = 0; base < n; base += inner) {
    int64_t off = 0;
    for (int a = 0; a < r - 1; ++a) off += idx[static_cast<size_t>(a)] * st[static_cast<size_t>(a)];
    if (inner_stride == 0)
      std::fill(dst + base, dst + base + inner, src[off]);
    else
      for (int64_t j = 0; j < inner; ++j) dst[base + j] = src[off + j * inner_stride];
    for (int a = r - 2; a >= 0; --a) {
      if (++idx[static_cast<size_t>(a)] < dst_shape[a]) break;
      idx[static_cast<size_t>(a)] = 0;
    }
  }
}

// out[j] = src[broadcast index of element start + j of dst_shape] for j < len; `bstrides`
// from broadcast_strides(src shape, dst_shape).
template <class T>
void broadcast_range(const T* src, const std::vector<int64_t>& bstrides, const Shape& dst_shape, int64_t start,
                     int64_t len, T* out) {
  const int r = dst_shape.rank();
  std::vector<int64_t> idx(static_cast<size_t>(r));
  int64_t rest = start, off = 0;
  for (int a = r - 1; a >= 0; --a) {
    idx[static_cast<size_t>(a)] = rest % dst_shape[a];
    rest /= dst_shape[a];
    off += idx[static_cast<size_t>(a)] * bstrides[static_cast<size_t>(a)];
  }
  // Runs along the last axis: a copy when the source is contiguous there, a fill when it is
  // broadcast there; the odometer moves once per run.
  const int64_t last = dst_shape[r - 1], last_stride = bstrides[static_cast<size_t>(r - 1)];
  int64_t j = 0;
  while (j < len) {
    int64_t run = std::min(last - idx[static_cast<size_t>(r - 1)], len - j);
    if (last_stride == 0)
      std::fill_n(out + j, run, src[off]);
    else if (last_stride == 1)
      std::copy_n(src + off, run, out + j);
    else
      for (int64_t k = 0; k < run; ++k) out[j + k] = src[off + k * last_stride];
    j += run;
    off += run * last_stride;
    idx[static_cast<size_t>(r - 1)] += run;
    for (int a = r - 1; a > 0 && idx[static_cast<size_t>(a)] == dst_shape[a]; --a) {
      off -= bstrides[static_cast<size_t>(a)] * dst_shape[a];
      idx[static_cast<size_t>(a)] = 0;
      off += bstrides[static_cast<size_t>(a - 1)];
      ++idx[static_cast<size_t>(a - 1)];
    }
  }
}

// Writes x broadcast to out's shape into out (same dtype).
void broadcast_into(const HostTensor& x, const HostTensor& out);

}  // namespace kiln::ref
