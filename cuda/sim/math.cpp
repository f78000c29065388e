// Numerics of the SIMT simulator: f16/bf16 rounding, cvt between all types, f16/bf16 arithmetic
// and the approximate instructions, which return the exact value moved by up to the error the
// PTX ISA documents, so that kernels relying on more accuracy than the hardware gives fail here.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/sim/internal.hpp>

namespace kiln::sim {

using kir::Opc;
using kir::Type;

namespace {

// Rounds v to nearest even in a binary format with `mant` stored mantissa bits and `exp`
// exponent bits (IEEE layout, subnormals, infinities); returns the encoding. NaN -> the
// canonical NaN PTX produces (all bits but the sign set).
uint16_t round_narrow(double v, int mant, int exp) {
  const int bias = (1 << (exp - 1)) - 1, emin = 1 - bias, emax = bias;
  const uint16_t inf = static_cast<uint16_t>(((1u << exp) - 1) << mant);
  const uint16_t sign = std::signbit(v) ? static_cast<uint16_t>(1u << (mant + exp)) : 0;
  if (std::isnan(v)) return static_cast<uint16_t>((1u << (mant + exp)) - 1);
  const double a = std::fabs(v);
  if (std::isinf(a)) return sign | inf;
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): the leading bit has weight 2^(e-1)
  int lead = a == 0 ? emin : std::max(e - 1, emin);
  // The number of quanta of the target format at this exponent; the division is a power-of-two
  // scaling (exact) and nearbyint rounds half to even in the default rounding mode.
  double m = std::nearbyint(std::ldexp(a, mant - lead));
  if (m == std::ldexp(1.0, mant + 1)) {  // rounded up to the next binade
    m /= 2;
    ++lead;
  }
  if (lead > emax) return sign | inf;
  const auto q = static_cast<uint32_t>(m);
  if (q < (1u << mant)) return sign | static_cast<uint16_t>(q);  // subnormal (exponent field 0)
  return sign | static_cast<uint16_t>((static_cast<uint32_t>(lead + bias) << mant) | (q - (1u << mant)));
}

// An integer magnitude as a double that rounds once more to <= 51 bits exactly as the integer
// would: beyond 2^53 the bits shifted out are kept as a sticky bit.
double sticky_double(uint64_t m) {
  if (m < (uint64_t{1} << 53)) return static_cast<double>(m);
  const int shift = std::bit_width(m) - 53;
  const uint64_t kept = (m >> shift) | ((m & ((uint64_t{1} << shift) - 1)) != 0);
  return std::ldexp(static_cast<double>(kept), shift);
}

double float_value(uint64_t bits, Type t) {
  switch (t) {
    case Type::f32: return f32_of(bits);
    case Type::f64: return f64_of(bits);
    case Type::f16: return f16_to_float(static_cast<uint16_t>(bits));
    default: return bf16_to_float(static_cast<uint16_t>(bits));
  }
}

uint64_t float_bits(double v, Type t) {
  switch (t) {
    case Type::f32: return slot_of(static_cast<float>(v));
    case Type::f64: return slot_of(v);
    case Type::f16: return double_to_f16(v);
    default: return double_to_bf16(v);
  }
}

// exact moved by a fraction in [0.5, 1) of `bound` (absolute) in a direction, both drawn from
// `h`, rounded to float and then kept within the bound (the rounding may add half an ulp).
float perturb(double exact, double bound, uint64_t h) {
  if (exact == 0 || std::isinf(exact)) return static_cast<float>(exact);
  if (std::fabs(exact) > FLT_MAX)
    return std::copysign(std::numeric_limits<float>::infinity(), static_cast<float>(exact));
  const double frac = 0.5 + 0x1p-54 * static_cast<double>(h >> 11);
  const double target = exact + ((h & 1) ? bound : -bound) * frac;
  const auto nearest = static_cast<float>(exact);
  auto y = static_cast<float>(target);
  while (y != nearest && std::fabs(static_cast<double>(y) - exact) > bound) y = std::nextafterf(y, nearest);
  return y;
}

}  // namespace

float f16_to_float(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v = 0;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31)
    v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(static_cast<float>(man | 0x400), exp - 25);
  return (h & 0x8000) ? -v : v;
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
uint16_t double_to_f16(double v) { return round_narrow(v, 10, 5); }
uint16_t double_to_bf16(double v) { return round_narrow(v, 7, 8); }

uint64_t convert(uint64_t bits, Type from, Type to) {
  if (from == to) return bits;
  if (kir::is_float_type(from)) {
    const double v = float_value(bits, from);
    switch (to) {
      case Type::pred: return v != 0;
      case Type::u32: return float_to_int<uint32_t>(v);
      case Type::s32: return static_cast<uint32_t>(float_to_int<int32_t>(v));
      case Type::u64: return float_to_int<uint64_t>(v);
      case Type::s64: return static_cast<uint64_t>(float_to_int<int64_t>(v));
      default: return float_bits(v, to);
    }
  }
  // Integer (or predicate) source: extend by the source's signedness, then narrow or convert.
  const uint64_t ext =
      from == Type::s32 ? static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(bits))) : bits;
  const bool negative = kir::is_signed_type(from) && static_cast<int64_t>(ext) < 0;
  switch (to) {
    case Type::pred: return ext != 0;
    case Type::u32:
    case Type::s32: return static_cast<uint32_t>(ext);
    case Type::u64:
    case Type::s64: return ext;
    case Type::f32: return slot_of(negative ? static_cast<float>(static_cast<int64_t>(ext)) : static_cast<float>(ext));
    case Type::f64:
      return slot_of(negative ? static_cast<double>(static_cast<int64_t>(ext)) : static_cast<double>(ext));
    default: {
      const double magnitude = sticky_double(negative ? 0 - ext : ext);
      return float_bits(negative ? -magnitude : magnitude, to);
    }
  }
}

uint64_t half_arith(Opc op, Type t, uint64_t a, uint64_t b, uint64_t c) {
  const double x = float_value(a, t), y = float_value(b, t), z = float_value(c, t);
  // Sums, products and quotients of f16/bf16 values computed in double and rounded once more
  // are correctly rounded (double has more than 2p+2 bits); fma may round twice, very rarely
  // differently from hardware.
  switch (op) {
    case Opc::Add: return float_bits(x + y, t);
    case Opc::Sub: return float_bits(x - y, t);
    case Opc::Mul: return float_bits(x * y, t);
    case Opc::Div: return float_bits(x / y, t);
    case Opc::Fma:
    case Opc::Mad: return float_bits(std::fma(x, y, z), t);
    case Opc::Min: return float_bits(ptx_min(x, y), t);
    case Opc::Max: return float_bits(ptx_max(x, y), t);
    case Opc::Neg: return a ^ 0x8000;
    case Opc::Abs: return a & 0x7fff;
    default: throw Error(std::string("simulator: no ") + kir::opc_name(op) + " for " + kir::type_name(t));
  }
}

bool compare_generic(kir::Cmp cmp, Type t, uint64_t a, uint64_t b) {
  const bool is_float = kir::is_float_type(t);
  const double x = is_float ? float_value(a, t) : static_cast<double>(a);
  const double y = is_float ? float_value(b, t) : static_cast<double>(b);
  switch (cmp) {
    case kir::Cmp::eq: return x == y;
    case kir::Cmp::ne: return x != y;  // unordered: true when either is NaN
    case kir::Cmp::lt: return x < y;
    case kir::Cmp::le: return x <= y;
    case kir::Cmp::gt: return x > y;
    default: return x >= y;
  }
}

double approx_bound(Opc op, double exact) {
  const double a = std::fabs(exact);
  switch (op) {
    case Opc::Ex2: return std::exp2(-22.5) * a;
    case Opc::Lg2: return a <= 1 ? std::exp2(-22.6) : 0x1p-22 * a;  // absolute for x in [0.5, 2], else relative
    case Opc::Rcp: return 0x1p-23 * a;
    case Opc::Rsqrt: return std::exp2(-22.9) * a;
    case Opc::Tanh: return std::exp2(-10.987) * a;
    case Opc::Sin:
    case Opc::Cos: return std::exp2(-20.5);
    default: return 0;
  }
}

float approx(Opc op, float x) {
  // All but tanh are .ftz: subnormal inputs and results are flushed to zero of the same sign.
  const bool ftz = op != Opc::Tanh;
  if (ftz && std::fpclassify(x) == FP_SUBNORMAL) x = std::copysign(0.0f, x);
  const double v = x;
  double exact = 0;
  switch (op) {
    case Opc::Ex2: exact = std::exp2(v); break;
    case Opc::Lg2: exact = v < 0 ? NAN : std::log2(v); break;  // log2(+-0) = -inf
    case Opc::Rcp: exact = 1.0 / v; break;
    case Opc::Rsqrt: exact = v < 0 ? NAN : 1.0 / std::sqrt(v); break;  // rsqrt(-0) = -inf
    case Opc::Tanh: exact = std::tanh(v); break;
    case Opc::Sin: exact = std::sin(v); break;
    case Opc::Cos: exact = std::cos(v); break;
    default: throw Error(std::string("simulator: ") + kir::opc_name(op) + " is not an approximate instruction");
  }
  if (std::isnan(exact)) return std::numeric_limits<float>::quiet_NaN();
  if (std::isinf(x)) return static_cast<float>(exact);  // the limits (0, 1, inf) are exact
  // The direction and size of the error depend on the input only (not on the thread or the
  // schedule): a kernel gets the same result for the same value everywhere.
  float y = perturb(exact, approx_bound(op, exact),
                    mix(std::bit_cast<uint32_t>(x) | uint64_t{static_cast<uint8_t>(op)} << 32));
  // The approximations of bounded functions never leave their range.
  if (op == Opc::Tanh || op == Opc::Sin || op == Opc::Cos) y = std::clamp(y, -1.0f, 1.0f);
  if (ftz && std::fpclassify(y) == FP_SUBNORMAL) y = std::copysign(0.0f, y);
  return y;
}

}  // namespace kiln::sim
