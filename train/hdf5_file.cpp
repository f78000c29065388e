// HDF5 C API wrapper (see hdf5_file.hpp).
#include <hdf5.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/atomic_file.hpp>
#include <kiln/train/hdf5_file.hpp>

namespace kiln::h5 {

namespace {

// Turns off HDF5's own error printing: every failure becomes a kiln::Error instead.
void quiet() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

// Closes an HDF5 handle when it goes out of scope.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

// Elements in an attribute's dataspace (1 for a scalar); -1 when it cannot be read.
hssize_t attribute_points(hid_t attribute) {
  Handle space{H5Aget_space(attribute), H5Sclose};
  return space.id < 0 ? -1 : H5Sget_simple_extent_npoints(space.id);
}

hid_t native_type(DType dt) {
  switch (dt) {
    case DType::f32: return H5T_NATIVE_FLOAT;
    case DType::f64: return H5T_NATIVE_DOUBLE;
    case DType::i32: return H5T_NATIVE_INT32;
    default: throw Error(std::string("HDF5: no storage type for dtype ") + dtype_name(dt));
  }
}

}  // namespace

File File::open_read(const std::string& path) {
  quiet();
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) throw Error("cannot open '" + path + "' as an HDF5 file (missing, unreadable or not HDF5)");
  return File(id, path);
}

File File::open_write(const std::string& path) {
  quiet();
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (id < 0) throw Error("cannot open '" + path + "' for writing as an HDF5 file");
  return File(id, path);
}

File File::create(const std::string& path) {
  quiet();
  // The newer file format (HDF5 1.10 and later) checksums its metadata, so a flipped bit in a
  // header is an error on open instead of other bytes read as weights.
  Handle fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
  H5Pset_libver_bounds(fapl.id, H5F_LIBVER_V110, H5F_LIBVER_LATEST);
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id);
  if (id < 0) throw Error("cannot create HDF5 file '" + path + "'");
  return File(id, path);
}

// The core driver's buffer, allocated through these callbacks so that closing the file hands it
// to kiln instead of freeing it. HDF5 copies the callbacks' user data with the access property
// list: every copy is this one object, owned by the File.
struct MemoryImage {
  void* bytes = nullptr;
  size_t capacity = 0;
  bool closed = false;  // the file was closed and `bytes` is ours to write and free
  ~MemoryImage() { std::free(bytes); }
};

namespace {
void* image_malloc(size_t size, H5FD_file_image_op_t op, void* udata) {
  // FILE_OPEN would read an existing file into memory: kiln only creates files in memory (and
  // H5Fcreate's tentative open of the name, refused here, then creates without reading).
  if (op == H5FD_FILE_IMAGE_OP_FILE_OPEN) return nullptr;
  auto* image = static_cast<MemoryImage*>(udata);
  std::free(image->bytes);
  image->bytes = std::malloc(size);
  image->capacity = image->bytes ? size : 0;
  return image->bytes;
}
void* image_memcpy(void* dest, const void* src, size_t size, H5FD_file_image_op_t, void*) {
  return std::memcpy(dest, src, size);
}
void* image_realloc(void* ptr, size_t size, H5FD_file_image_op_t, void* udata) {
  auto* image = static_cast<MemoryImage*>(udata);
  if (ptr == nullptr && image->bytes != nullptr) return nullptr;  // one buffer a file, never two
  void* grown = std::realloc(ptr, size);
  if (!grown) return nullptr;  // HDF5 reports the failure; `ptr` is still the buffer
  image->bytes = grown;
  image->capacity = size;
  return grown;
}
herr_t image_free(void* ptr, H5FD_file_image_op_t op, void* udata) {
  auto* image = static_cast<MemoryImage*>(udata);
  if (op == H5FD_FILE_IMAGE_OP_FILE_CLOSE && ptr == image->bytes) {
    image->closed = true;  // kept: close_to_image writes it out
    return 0;
  }
  if (ptr == image->bytes) image->bytes = nullptr, image->capacity = 0;
  std::free(ptr);
  return 0;
}
void* image_udata_copy(void* udata) { return udata; }
herr_t image_udata_free(void*) { return 0; }

// The end-of-file address in a version 2 or 3 superblock with 8-byte offsets (HDF5 File Format
// Specification, "Superblock"): signature (8 bytes), version, offset and length sizes, flags,
// base address (8), extension address (8), then this field. 0 where the bytes are not such a
// superblock.
uint64_t superblock_end_of_file(const unsigned char* bytes, size_t size) {
  static const unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (size < 48 || std::memcmp(bytes, kSignature, 8) != 0 || (bytes[8] != 2 && bytes[8] != 3) || bytes[9] != 8)
    return 0;
  uint64_t eof = 0;
  for (int i = 7; i >= 0; --i) eof = (eof << 8) | bytes[28 + i];  // little-endian
  return eof;
}
}  // namespace

File::File(long long id, std::string path) : id_(id), path_(std::move(path)) {}

File File::create_in_memory(const std::string& path) {
  quiet();
  auto image = std::make_unique<MemoryImage>();
  Handle fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
  H5Pset_libver_bounds(fapl.id, H5F_LIBVER_V110, H5F_LIBVER_LATEST);
  // Closing closes every object still open, so that the close hands the buffer back.
  H5Pset_fclose_degree(fapl.id, H5F_CLOSE_STRONG);
  H5FD_file_image_callbacks_t callbacks{image_malloc,     image_memcpy,     image_realloc, image_free,
                                        image_udata_copy, image_udata_free, image.get()};
  // Grown 16 MiB at a time (realloc of large blocks remaps pages rather than copying them).
  if (fapl.id < 0 || H5Pset_fapl_core(fapl.id, size_t{16} << 20, /*backing_store=*/0) < 0 ||
      H5Pset_file_image_callbacks(fapl.id, &callbacks) < 0)
    throw Error("HDF5 file '" + path + "': cannot set up the in-memory driver");
  // The name is only a label, of no file on disk: without a backing store the core driver
  // creates nothing there (H5Fcreate's tentative open would read a file of that name). It is
  // unique to the call: HDF5 refuses to create a file of the name of one still open.
  static std::atomic<uint64_t> files{0};
  const std::string label = "kiln-in-memory-" + std::to_string(files++) + ":" + path;
  hid_t id = H5Fcreate(label.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id);
  if (id < 0) throw Error("cannot create HDF5 file '" + path + "' in memory");
  File f(id, path);
  f.image_ = std::move(image);
  return f;
}

std::string_view File::close_to_image() {
  close();  // in memory: fails only where memory ran out (then ~File keeps the buffer alive)
  if (!image_ || !image_->closed) fail("the file in memory was not handed back on closing");
  const auto* bytes = static_cast<const unsigned char*>(image_->bytes);
  const uint64_t size = superblock_end_of_file(bytes, image_->capacity);
  if (size == 0 || size > image_->capacity) fail("the file in memory does not start with the superblock kiln writes");
  return {static_cast<const char*>(image_->bytes), static_cast<size_t>(size)};
}

File::File(File&& o) noexcept : id_(o.id_), path_(std::move(o.path_)), image_(std::move(o.image_)) { o.id_ = -1; }

File::~File() {
  // A close that failed leaves HDF5 holding the file, and the core driver its buffer: that buffer
  // (with the callbacks' user data) must then outlive this object.
  if (id_ >= 0 && H5Fclose(static_cast<hid_t>(id_)) < 0 && image_) (void)image_.release();
}

void File::close() {
  if (id_ < 0) return;
  const hid_t id = static_cast<hid_t>(id_);
  id_ = -1;
  const bool flushed = H5Fflush(id, H5F_SCOPE_GLOBAL) >= 0;
  const bool closed = H5Fclose(id) >= 0;
  if (!closed && image_) (void)image_.release();  // HDF5 still holds it (see ~File)
  if (!closed || !flushed) fail("writing it out failed (is the disk full?)");
}

void write_atomically(const std::string& path, const std::function<void(File&)>& fill) {
  File f = File::create_in_memory(path);
  fill(f);
  write_file_atomically(path, f.close_to_image());
}

void File::fail(const std::string& what) const { throw Error("HDF5 file '" + path_ + "': " + what); }

bool File::exists(const std::string& path) const {
  std::string prefix;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    prefix += (prefix.empty() ? "" : "/") + part;
    if (part.empty() || H5Lexists(static_cast<hid_t>(id_), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

DType File::dataset_dtype(const std::string& path) const {
  if (!exists(path)) fail("dataset '" + path + "' is missing");
  Handle ds{H5Dopen2(static_cast<hid_t>(id_), path.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) fail("'" + path + "' is not a dataset");
  Handle type{H5Dget_type(ds.id), H5Tclose};
  H5T_class_t cls = H5Tget_class(type.id);
  size_t size = H5Tget_size(type.id);
  if (cls == H5T_FLOAT && size == 4) return DType::f32;
  if (cls == H5T_FLOAT && size == 8) return DType::f64;
  if (cls == H5T_INTEGER && size == 4 && H5Tget_sign(type.id) == H5T_SGN_2) return DType::i32;
  fail("dataset '" + path + "' has element type class " + std::to_string(static_cast<int>(cls)) + " of " +
       std::to_string(size) + " bytes; expected float32, float64 or int32");
}

Shape File::dataset_shape(const std::string& path) const {
  if (!exists(path)) fail("dataset '" + path + "' is missing");
  Handle ds{H5Dopen2(static_cast<hid_t>(id_), path.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) fail("'" + path + "' is not a dataset");
  Handle space{H5Dget_space(ds.id), H5Sclose};
  int rank = H5Sget_simple_extent_ndims(space.id);
  if (rank < 0) fail("dataset '" + path + "' has no simple dataspace");
  if (rank > 32) fail("dataset '" + path + "' has rank " + std::to_string(rank) + "; kiln reads at most 32 dimensions");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (H5Sget_simple_extent_dims(space.id, dims.data(), nullptr) < 0)
    fail("dataset '" + path + "': unreadable dimensions");
  std::vector<int64_t> out;
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(std::numeric_limits<int64_t>::max()))
      fail("dataset '" + path + "' has a dimension of " + std::to_string(d));
    out.push_back(static_cast<int64_t>(d));
  }
  Shape shape(out);
  try {
    (void)shape.numel();
  } catch (const Error&) {
    fail("dataset '" + path + "' has shape " + shape.str() + ": more elements than a 64-bit count holds");
  }
  return shape;
}

HostTensor File::read(const std::string& path) const {
  DType dt = dataset_dtype(path);
  const Shape shape = dataset_shape(path);
  // A size no machine could hold is a corrupt or hostile file, not an allocation to try.
  const double bytes = static_cast<double>(shape.numel()) * static_cast<double>(dtype_size(dt));
  const double physical = physical_memory_bytes();
  if (physical > 0 && bytes > physical)
    fail("dataset '" + path + "' " + shape.str() + " would need " + std::to_string(bytes / (1 << 30)) +
         " GiB, more than this machine's " + std::to_string(physical / (1 << 30)) + " GiB of memory");
  HostTensor t = HostTensor::zeros(dt, shape);
  Handle ds{H5Dopen2(static_cast<hid_t>(id_), path.c_str(), H5P_DEFAULT), H5Dclose};
  if (t.numel() > 0 && H5Dread(ds.id, native_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()) < 0)
    fail("reading dataset '" + path + "' failed: the file is corrupt (a checksum does not match) or truncated");
  return t;
}

void File::write(const std::string& path, const HostTensor& t) {
  Handle lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  std::vector<hsize_t> dims(t.shape().dims().begin(), t.shape().dims().end());
  Handle space{t.shape().rank() == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(t.shape().rank(), dims.data(), nullptr),
               H5Sclose};
  hid_t type = native_type(t.dtype());
  // Each dataset carries a Fletcher-32 checksum of its data (the filter needs chunks: one chunk
  // of the whole array, cut to HDF5's 4 GiB chunk limit along the first axis).
  Handle dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  if (t.numel() > 0 && t.shape().rank() > 0) {
    std::vector<hsize_t> chunk = dims;
    const hsize_t row_bytes = static_cast<hsize_t>(t.nbytes()) / chunk[0];
    chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(chunk[0], (hsize_t{1} << 31) / std::max<hsize_t>(row_bytes, 1)));
    H5Pset_chunk(dcpl.id, static_cast<int>(chunk.size()), chunk.data());
    H5Pset_fletcher32(dcpl.id);
  }
  Handle ds{H5Dcreate2(static_cast<hid_t>(id_), path.c_str(), type, space.id, lcpl.id, dcpl.id, H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) fail("cannot create dataset '" + path + "' (does it exist already?)");
  if (t.numel() > 0 && H5Dwrite(ds.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()) < 0)
    fail("writing dataset '" + path + "' failed");
}

namespace {
// H5Lvisit's callback: records each hard link to a dataset with its object's address (HDF5 1.10)
// or token (1.12 and later) as the key.
#if H5_VERSION_GE(1, 12, 0)
herr_t record_dataset(hid_t group, const char* name, const H5L_info2_t* info, void* out) {
  if (info->type != H5L_TYPE_HARD) return 0;
  char* token = nullptr;  // the token as HDF5 prints it: its raw bytes may hold padding
  if (H5Otoken_to_str(group, &info->u.token, &token) < 0 || !token) return 0;
  std::string key(token);
  H5free_memory(token);
#else
herr_t record_dataset(hid_t group, const char* name, const H5L_info_t* info, void* out) {
  if (info->type != H5L_TYPE_HARD) return 0;
  std::string key = std::to_string(info->u.address);
#endif
  Handle object{H5Oopen(group, name, H5P_DEFAULT), H5Oclose};
  if (object.id >= 0 && H5Iget_type(object.id) == H5I_DATASET)
    (*static_cast<std::map<std::string, std::string>*>(out))[name] = std::move(key);
  return 0;
}
}  // namespace

std::map<std::string, std::string> File::datasets() const {
  std::map<std::string, std::string> out;
#if H5_VERSION_GE(1, 12, 0)
  const herr_t rc = H5Lvisit2(static_cast<hid_t>(id_), H5_INDEX_NAME, H5_ITER_INC, record_dataset, &out);
#else
  const herr_t rc = H5Lvisit(static_cast<hid_t>(id_), H5_INDEX_NAME, H5_ITER_INC, record_dataset, &out);
#endif
  if (rc < 0) fail("cannot list its datasets: the file is corrupt or truncated");
  return out;
}

void File::hard_link(const std::string& target, const std::string& link) {
  Handle lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  if (H5Lcreate_hard(static_cast<hid_t>(id_), target.c_str(), static_cast<hid_t>(id_), link.c_str(), lcpl.id,
                     H5P_DEFAULT) < 0)
    fail("cannot link '" + link + "' to '" + target + "'");
}

bool File::has_attribute(const std::string& name) const { return H5Aexists(static_cast<hid_t>(id_), name.c_str()) > 0; }

int64_t File::read_int_attribute(const std::string& name) const {
  if (!has_attribute(name)) fail("attribute '" + name + "' is missing");
  Handle a{H5Aopen(static_cast<hid_t>(id_), name.c_str(), H5P_DEFAULT), H5Aclose};
  Handle type{H5Aget_type(a.id), H5Tclose};
  if (H5Tget_class(type.id) != H5T_INTEGER) fail("attribute '" + name + "' is not an integer");
  if (attribute_points(a.id) != 1) fail("attribute '" + name + "' is not a single integer (an array?)");
  int64_t v = 0;
  if (H5Aread(a.id, H5T_NATIVE_INT64, &v) < 0) fail("reading attribute '" + name + "' failed");
  return v;
}

double File::read_real_attribute(const std::string& name) const {
  if (!has_attribute(name)) fail("attribute '" + name + "' is missing");
  Handle a{H5Aopen(static_cast<hid_t>(id_), name.c_str(), H5P_DEFAULT), H5Aclose};
  Handle type{H5Aget_type(a.id), H5Tclose};
  const H5T_class_t cls = H5Tget_class(type.id);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) fail("attribute '" + name + "' is not a number");
  if (attribute_points(a.id) != 1) fail("attribute '" + name + "' is not a single number (an array?)");
  double v = 0;
  if (H5Aread(a.id, H5T_NATIVE_DOUBLE, &v) < 0) fail("reading attribute '" + name + "' failed");
  return v;
}

std::string File::read_string_attribute(const std::string& name) const {
  if (!has_attribute(name)) fail("attribute '" + name + "' is missing");
  Handle a{H5Aopen(static_cast<hid_t>(id_), name.c_str(), H5P_DEFAULT), H5Aclose};
  Handle type{H5Aget_type(a.id), H5Tclose};
  if (H5Tget_class(type.id) != H5T_STRING) fail("attribute '" + name + "' is not a string");
  if (attribute_points(a.id) != 1) fail("attribute '" + name + "' is not a single string (an array?)");
  if (H5Tis_variable_str(type.id) > 0) {
    Handle mem{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(mem.id, H5T_VARIABLE);
    H5Tset_cset(mem.id, H5Tget_cset(type.id));
    char* s = nullptr;
    if (H5Aread(a.id, mem.id, &s) < 0 || !s) fail("reading attribute '" + name + "' failed");
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  size_t size = H5Tget_size(type.id);
  if (size > (size_t{1} << 20)) fail("attribute '" + name + "' is a string of " + std::to_string(size) + " bytes");
  std::string out(size, '\0');
  if (H5Aread(a.id, type.id, out.data()) < 0) fail("reading attribute '" + name + "' failed");
  return out.substr(0, out.find('\0'));
}

void File::write_attribute(const std::string& name, int64_t value) {
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle a{H5Acreate2(static_cast<hid_t>(id_), name.c_str(), H5T_STD_I64LE, space.id, H5P_DEFAULT, H5P_DEFAULT),
           H5Aclose};
  if (a.id < 0 || H5Awrite(a.id, H5T_NATIVE_INT64, &value) < 0) fail("cannot write attribute '" + name + "'");
}

void File::write_attribute(const std::string& name, double value) {
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle a{H5Acreate2(static_cast<hid_t>(id_), name.c_str(), H5T_IEEE_F64LE, space.id, H5P_DEFAULT, H5P_DEFAULT),
           H5Aclose};
  if (a.id < 0 || H5Awrite(a.id, H5T_NATIVE_DOUBLE, &value) < 0) fail("cannot write attribute '" + name + "'");
}

// Fixed-length strings (null-padded UTF-8), not variable-length ones: a variable-length string
// lives in the file's global heap, which no HDF5 format version checksums, and a corrupted
// global heap can hang libhdf5 1.10 inside H5Aread (found by tests/fuzz/fuzz_weights). Files
// without variable-length data have every piece of metadata checksummed. Reading still takes
// both kinds: kiln files written before this change hold variable-length strings.
void File::write_attribute(const std::string& name, const std::string& value) {
  Handle type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, std::max<size_t>(value.size(), 1));
  H5Tset_strpad(type.id, H5T_STR_NULLPAD);
  H5Tset_cset(type.id, H5T_CSET_UTF8);
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle a{H5Acreate2(static_cast<hid_t>(id_), name.c_str(), type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  std::string padded = value;
  padded.resize(std::max<size_t>(value.size(), 1), '\0');
  if (a.id < 0 || H5Awrite(a.id, type.id, padded.data()) < 0) fail("cannot write attribute '" + name + "'");
}

}  // namespace kiln::h5
