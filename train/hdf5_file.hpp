// A small RAII layer over the HDF5 C API for kiln's files (weights, checkpoints, batches and
// dumps): datasets of f32, f64 and i32 read into HostTensors and written from them, integer and
// string attributes, hard links. Every error names the file and the dataset or attribute.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <kiln/circuit/ir/host_tensor.hpp>

namespace kiln::h5 {

struct MemoryImage;  // the buffer of a file made in memory (hdf5_file.cpp)

class File {
 public:
  static File open_read(const std::string& path);
  // An existing file for read and write, and a new file on disk (truncating). These two write
  // through HDF5 itself, for tools and tests that edit files in place; kiln's own writers use
  // write_atomically, which survives a full disk.
  static File open_write(const std::string& path);
  static File create(const std::string& path);
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
  // Every name of a dataset in the file ("a/b/c"), each with a key that is the same for names of
  // one object (hard links): another name of a dataset read is not a dataset left unread.
  std::map<std::string, std::string> datasets() const;
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
  File(long long id, std::string path);
  friend void write_atomically(const std::string&, const std::function<void(File&)>&);
  // A new file in memory (HDF5's core driver, no backing store, its buffer kiln's), named `path`
  // in errors.
  static File create_in_memory(const std::string& path);
  // Closes a file made by create_in_memory and returns its bytes, as HDF5 would have left them on
  // disk (closing cleared the superblock's write flag and finished its checksums).
  std::string_view close_to_image();
  [[noreturn]] void fail(const std::string& what) const;
  long long id_;  // hid_t, kept out of this header
  std::string path_;
  std::unique_ptr<MemoryImage> image_;  // the core driver's buffer, for files made in memory
};

// Writes the file at `path` so that it is either complete or not there at all, and never
// destroys the file it replaces until the new one is complete: `fill` writes into a file held in
// memory, whose image kiln then writes to a temporary file of a name unique to this process and
// call, in the same directory, which is fsynced and renamed over `path`, and the directory
// fsynced. Any failure (of `fill` or of the file system: a full disk) removes the temporary
// file, leaves `path` as it was, closes every HDF5 id and throws. The file is held in memory
// because HDF5 must never meet the disk's failure itself: when the sec2 driver's flush fails
// inside H5Fclose, HDF5 1.10 keeps the file's id half closed, and its exit handler
// (H5_term_library -> H5F__close_cb) then crashes the process. Memory: one copy of the file.
void write_atomically(const std::string& path, const std::function<void(File&)>& fill);

}  // namespace kiln::h5
