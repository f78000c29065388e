// HostTensor: a dense row-major buffer in host memory with dtype and shape. It either owns its
// storage or views storage owned elsewhere (a parameter's slot in an arena). The Eigen executor
// reads and writes these; Eigen itself stays out of this header.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>

#include <kiln/circuit/ir/types.hpp>

namespace kiln {

// Tensor storage allocated so far in this process (every HostTensor::zeros): how often and how
// many bytes. The executor's memory plan keeps a planned step at zero; tests and --stats read it.
struct StorageAllocations {
  uint64_t count = 0, bytes = 0;
};
StorageAllocations host_storage_allocations();

// This machine's physical memory in bytes (0 where unknown). HostTensor::zeros refuses to
// allocate more; file readers and model builders refuse early with it, naming what they need.
double physical_memory_bytes();

class HostTensor {
 public:
  HostTensor() = default;
  // Owning, zero-filled.
  static HostTensor zeros(DType dtype, Shape shape);
  // Non-owning view of `data` (which must hold shape.numel() elements of dtype).
  static HostTensor view(DType dtype, Shape shape, void* data);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  // False for views of storage owned elsewhere (arena slots, caller buffers).
  bool owns_storage() const { return owner_ != nullptr; }
  // True when another HostTensor shares this one's owned storage.
  bool storage_shared() const { return owner_.use_count() > 1; }

  void* raw() const { return data_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Element i as double (any dtype but f16; bf16 is rounded to nearest even on set); for tests
  // and host reads.
  double get(int64_t i) const;
  void set(int64_t i, double v);
  // An owning deep copy.
  HostTensor clone() const;
  // Same storage, another shape with the same element count.
  HostTensor reshaped(Shape shape) const;

 private:
  DType dtype_ = DType::f32;
  Shape shape_;
  std::shared_ptr<std::byte[]> owner_;
  void* data_ = nullptr;
};

}  // namespace kiln
