// HostTensor storage and element access.
#include <cstdlib>
#include <unistd.h>

#include <atomic>
#include <limits>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/host_tensor.hpp>

namespace kiln {

namespace {
std::atomic<uint64_t> allocated_count{0}, allocated_bytes{0};
}  // namespace

StorageAllocations host_storage_allocations() {
  return {allocated_count.load(std::memory_order_relaxed), allocated_bytes.load(std::memory_order_relaxed)};
}

double physical_memory_bytes() {
  static const double bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  }();
  return bytes;
}

HostTensor HostTensor::zeros(DType dtype, Shape shape) {
  HostTensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  // numel() refuses an overflowing shape; so must the byte count (a wrapped size would
  // allocate a small buffer that the caller then overruns).
  size_t n = 0;
  if (t.numel() < 0 || __builtin_mul_overflow(static_cast<size_t>(t.numel()), dtype_size(dtype), &n) ||
      n > std::numeric_limits<size_t>::max() - 64)
    throw Error("HostTensor: " + t.shape_.str() + " " + dtype_name(dtype) + " is too large to allocate");
  // More than the machine's memory cannot succeed: say what it would need instead of bad_alloc.
  const double physical = physical_memory_bytes();
  if (physical > 0 && static_cast<double>(n) > physical)
    throw Error("HostTensor: " + t.shape_.str() + " " + dtype_name(dtype) + " would need " +
                std::to_string(static_cast<double>(n) / (1 << 30)) + " GiB, more than this machine's " +
                std::to_string(physical / (1 << 30)) + " GiB of memory");
  allocated_count.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes.fetch_add(n, std::memory_order_relaxed);
  // Over-allocate so that the data pointer can be 64-byte aligned (vector loads, cache lines).
  // calloc, not a zeroing new: large blocks come as fresh zero pages that take no memory until
  // written, so the slack of a grown arena and a gradient slot never written stay off the
  // resident set (a zeroing new touched every page).
  void* block = std::calloc(n + 64, 1);
  if (!block) throw std::bad_alloc();
  t.owner_ = std::shared_ptr<std::byte[]>(static_cast<std::byte*>(block), [](std::byte* p) { std::free(p); });
  auto addr = reinterpret_cast<uintptr_t>(t.owner_.get());
  t.data_ = t.owner_.get() + ((64 - addr % 64) % 64);
  return t;
}

HostTensor HostTensor::view(DType dtype, Shape shape, void* data) {
  HostTensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  return t;
}

double HostTensor::get(int64_t i) const {
  switch (dtype_) {
    case DType::f32: return data<float>()[i];
    case DType::f64: return data<double>()[i];
    case DType::i32: return data<int32_t>()[i];
    case DType::bf16: return bf16_to_f32(data<Bf16>()[i]);
    default: throw Error(std::string("HostTensor: no host element access for dtype ") + dtype_name(dtype_));
  }
}

void HostTensor::set(int64_t i, double v) {
  switch (dtype_) {
    case DType::f32: data<float>()[i] = static_cast<float>(v); return;
    case DType::f64: data<double>()[i] = v; return;
    case DType::i32: data<int32_t>()[i] = static_cast<int32_t>(v); return;
    case DType::bf16: data<Bf16>()[i] = f32_to_bf16(static_cast<float>(v)); return;
    default: throw Error(std::string("HostTensor: no host element access for dtype ") + dtype_name(dtype_));
  }
}

HostTensor HostTensor::clone() const {
  HostTensor t = zeros(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

HostTensor HostTensor::reshaped(Shape shape) const {
  if (shape.numel() != numel())
    throw Error("HostTensor::reshaped: " + shape_.str() + " has " + std::to_string(numel()) + " elements, " +
                shape.str() + " has " + std::to_string(shape.numel()));
  HostTensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

}  // namespace kiln
