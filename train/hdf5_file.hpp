// A small RAII layer over the HDF5 C API for kiln's files (weights, checkpoints, batches and
// dumps): datasets of f32, f64 and i32 read into HostTensors and written from them, integer and
// string attributes, hard links. Every error names the file and the dataset or attribute.
#pragma once

#include <functional>
#include <string>

#include "circuit/ir/host_tensor.hpp"

namespace kiln::h5 {

class File {
 public:
  static File open_read(const std::string& path);
  static File open_write(const std::string& path);  // existing file for read/write
  static File create(const std::string& path);      // truncates
  File(File&& o) noexcept;
  File& operator=(File&&) = delete;
  File(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  // Flushes and closes, throwing if HDF5 reports a failure (a full disk shows here); the
  // destructor closes too, but cannot report.
  void close();
  // True when every component of the path ("a/b/c") exists.
  bool exists(const std::string& path) const;
  // Shape and dtype of a dataset; throws naming it if missing or of another element type.
  DType dataset_dtype(const std::string& path) const;
  Shape dataset_shape(const std::string& path) const;
  // Reads a dataset as stored (f32, f64 or i32).
  HostTensor read(const std::string& path) const;
  // Writes a dataset, creating parent groups.
  void write(const std::string& path, const HostTensor& t);
  // Makes `link` another name of the existing object `target`.
  void hard_link(const std::string& target, const std::string& link);

  bool has_attribute(const std::string& name) const;
  int64_t read_int_attribute(const std::string& name) const;
  double read_real_attribute(const std::string& name) const;
  std::string read_string_attribute(const std::string& name) const;
  void write_attribute(const std::string& name, int64_t value);
  void write_attribute(const std::string& name, double value);
  void write_attribute(const std::string& name, const std::string& value);

 private:
  File(long long id, std::string path) : id_(id), path_(std::move(path)) {}
  [[noreturn]] void fail(const std::string& what) const;
  long long id_;  // hid_t, kept out of this header
  std::string path_;
};

// Writes the file at `path` so that it is either complete or not there at all, and never
// destroys the file it replaces until the new one is complete: `fill` writes into a temporary
// file of a name unique to this process and call, in the same directory, which is closed
// (every HDF5 result checked), fsynced and renamed over `path`, and the directory fsynced. Any
// failure (of `fill` or of the file system) removes the temporary file, leaves `path` as it
// was and throws.
void write_atomically(const std::string& path, const std::function<void(File&)>& fill);

}  // namespace kiln::h5
