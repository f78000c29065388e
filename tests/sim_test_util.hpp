// Helpers shared by the simulator's tests (test_simulator.cpp, test_simulator_faults.cpp):
// device memory transfers, error expectations, test inputs, and the kernels both use (a small
// pointwise kernel, a grid-stride thread sum and a butterfly warp reduction).
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "expect_error.hpp"

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/sim/simulator.hpp>

namespace kiln::sim::testing {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_f64;
using kir::imm_u32;
using kir::imm_u64;
using kir::Instr;
using kir::Kernel;
using kir::KernelBuilder;
using kir::Opc;
using kir::Operand;
using kir::Reg;
using kir::ShflMode;
using kir::Space;
using kir::SReg;
using kir::Type;

template <typename T>
uint64_t upload(DeviceMemory& mem, const std::vector<T>& v) {
  const uint64_t addr = mem.alloc(v.size() * sizeof(T));
  mem.write(addr, v.data(), v.size() * sizeof(T));
  return addr;
}

template <typename T>
std::vector<T> download(const DeviceMemory& mem, uint64_t addr, size_t n) {
  std::vector<T> v(n);
  mem.read(addr, v.data(), n * sizeof(T));
  return v;
}

using kiln::expect_error;  // expect_error.hpp

inline uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Varied floats of both signs, not integers.
inline std::vector<float> test_inputs(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = std::sin(static_cast<float>(i) * 0.37f) * 4.0f + static_cast<float>(i % 13) * 0.01f;
  return x;
}

// y[i] = max(sqrt(|fma(x, 1.5, -0.25) / (x + 3)|), (x - 0.5) * x) for i < n (i <= n with
// `off_by_one`). No product is followed by a sum, so that the host compiler cannot contract the
// reference into an fma.
inline Kernel pointwise_kernel(bool off_by_one = false) {
  KernelBuilder b(off_by_one ? "pointwise_oob" : "pointwise");
  Reg x = b.param("x", Type::u64), y = b.param("y", Type::u64), n = b.param("n", Type::u32);
  Reg i = b.global_index_x();
  b.if_(b.setp(off_by_one ? Cmp::le : Cmp::lt, i, n), [&] {
    Reg v = b.ld(Space::global, Type::f32, b.address(x, i, 4));
    Reg q = b.div(Type::f32, b.fma(Type::f32, v, imm_f32(1.5f), imm_f32(-0.25f)), b.add(Type::f32, v, imm_f32(3)));
    Reg s = b.unary(Opc::Sqrt, Type::f32, b.abs(Type::f32, q));
    Reg w = b.max(Type::f32, s, b.mul(Type::f32, b.sub(Type::f32, v, imm_f32(0.5f)), v));
    b.st(Space::global, Type::f32, b.address(y, i, 4), w);
  });
  return b.finish();
}

// Grid-stride sum of x[0, n) into acc (f32) for this thread.
inline Reg thread_sum(KernelBuilder& b, Reg x, Reg n) {
  Reg acc = b.mov(Type::f32, imm_f32(0));
  Reg stride = b.mul(Type::u32, b.sreg(SReg::nctaid_x), b.sreg(SReg::ntid_x));
  b.for_(b.global_index_x(), n, stride, [&](Reg i) {
    b.assign(Opc::Add, acc, {acc, b.ld(Space::global, Type::f32, b.address(x, i, 4))});
  });
  return acc;
}

// Every lane gets its warp's sum through shfl.bfly and stores it to all[global thread index].
inline Kernel butterfly_kernel() {
  KernelBuilder b("butterfly");
  Reg x = b.param("x", Type::u64), all = b.param("all", Type::u64), n = b.param("n", Type::u32);
  Reg v = thread_sum(b, x, n);
  for (uint32_t d = 16; d > 0; d /= 2) v = b.add(Type::f32, v, b.shfl(ShflMode::bfly, v, imm_u32(d)));
  b.st(Space::global, Type::f32, b.address(all, b.global_index_x(), 4), v);
  return b.finish();
}

}  // namespace kiln::sim::testing
