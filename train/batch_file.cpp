// Batch files: read, then checked against the model they are for.
#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/batch_file.hpp>
#include <kiln/train/hdf5_file.hpp>

namespace kiln {

TokenBatch read_batch_file(const std::string& path, int64_t block_size, int64_t vocab_size) {
  h5::File f = h5::File::open_read(path);
  auto read_ids = [&](const char* name) {
    // Shape and type first: a dataset of another kind is refused before it is read.
    const DType dtype = f.dataset_dtype(name);
    const Shape shape = f.dataset_shape(name);
    if (dtype != DType::i32 || shape.rank() != 2 || shape[0] < 1 || shape[1] < 1)
      throw Error("batch '" + path + "': dataset '" + name + "' must be int32 [B, T] with B, T >= 1, received " +
                  dtype_name(dtype) + shape.str());
    if (shape[1] > block_size)
      throw Error("batch '" + path + "': dataset '" + name + "' has T = " + std::to_string(shape[1]) +
                  ", more than the model's block_size " + std::to_string(block_size));
    HostTensor t = f.read(name);
    const int32_t* ids = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab_size)
        throw Error("batch '" + path + "': dataset '" + name + "' holds token id " + std::to_string(ids[i]) + " at [" +
                    std::to_string(i / shape[1]) + ", " + std::to_string(i % shape[1]) +
                    "], outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")");
    return t;
  };
  TokenBatch b{read_ids("x"), read_ids("y")};
  if (b.x.shape() != b.y.shape())
    throw Error("batch '" + path + "': x " + b.x.shape().str() + " and y " + b.y.shape().str() + " differ");
  return b;
}

}  // namespace kiln
