// Base value types of the graph IR: element types (DType) and shapes (Shape).
// Everything above circuit/ describes tensors with these two.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kiln {

// Element types. f32/f64/i32 are computed in; bf16 is a storage type: values are stored in
// bf16 and computed in f32 (cast converts, matmul takes bf16 operands and accumulates in f32,
// the data-movement Prims copy them). f16 is declared for the GPU back end only.
enum class DType : uint8_t { f32, f64, i32, bf16, f16 };

const char* dtype_name(DType dt);
size_t dtype_size(DType dt);
bool is_float(DType dt);  // f32, f64, bf16, f16
// The dtype of a gradient with respect to a value of dtype `dt`: f32 for the storage types
// (bf16, f16), so that gradients are accumulated in f32; `dt` otherwise.
DType gradient_dtype(DType dt);

// A tensor shape: dims in row-major order; rank 0 is a scalar with one element.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int axis) const { return dims_[static_cast<size_t>(axis)]; }
  int64_t& operator[](int axis) { return dims_[static_cast<size_t>(axis)]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t numel() const;
  // Row-major strides in elements.
  std::vector<int64_t> strides() const;
  // Normalizes a possibly negative axis; throws kiln::Error naming `op` when out of range.
  int normalize_axis(int axis, const std::string& op) const;
  std::string str() const;  // "[2, 3]"

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

// numpy broadcasting of two shapes (align trailing dims; a dim of 1 stretches).
// Throws kiln::Error naming `op` when the shapes do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& op);

}  // namespace kiln
