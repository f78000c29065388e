// Shape and DType helpers.
#include <algorithm>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/types.hpp>

namespace kiln {

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}

bool is_float(DType dt) { return dt != DType::i32; }

DType gradient_dtype(DType dt) { return dt == DType::bf16 || dt == DType::f16 ? DType::f32 : dt; }

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_)
    if (__builtin_mul_overflow(n, d, &n))
      throw Error("shape " + str() + " has more elements than a 64-bit count holds");
  return n;
}

std::vector<int64_t> Shape::strides() const {
  std::vector<int64_t> s(dims_.size(), 1);
  for (int i = rank() - 2; i >= 0; --i)
    s[static_cast<size_t>(i)] = s[static_cast<size_t>(i) + 1] * dims_[static_cast<size_t>(i) + 1];
  return s;
}

int Shape::normalize_axis(int axis, const std::string& op) const {
  int a = axis < 0 ? axis + rank() : axis;
  if (a < 0 || a >= rank())
    fail(op, "", "axis " + std::to_string(axis) + " is out of range for a tensor of shape " + str());
  return a;
}

std::string Shape::str() const {
  std::string s = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& op) {
  int r = std::max(a.rank(), b.rank());
  std::vector<int64_t> out(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) {
    int ia = a.rank() - r + i, ib = b.rank() - r + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      fail(op, "",
           "shapes " + a.str() + " and " + b.str() + " do not broadcast (dim " + std::to_string(i) + ": " +
               std::to_string(da) + " vs " + std::to_string(db) + ")");
    out[static_cast<size_t>(i)] = da == 1 ? db : da;
  }
  return Shape(std::move(out));
}

void fail(const std::string& op, const std::string& layer, const std::string& message) {
  std::string s = "op '" + op + "'";
  if (!layer.empty()) s += " in layer '" + layer + "'";
  throw Error(s + ": " + message);
}

}  // namespace kiln
