// Batch files: a fixed batch of token ids to run a model on (`kiln dump --batch`, written by
// the comparison scripts): int32 datasets x and y of one shape [B, T], y the targets of x.
#pragma once

#include <string>

#include <kiln/circuit/ir/host_tensor.hpp>

namespace kiln {

struct TokenBatch {
  HostTensor x, y;  // i32 [B, T]
};

// Reads a batch for a model of the given block size and vocabulary and checks it before anything
// runs on it: both datasets int32 of rank 2 and one shape, B >= 1, 1 <= T <= block_size, every
// id in [0, vocab_size). Errors name the file, the dataset and (for an id) its position.
TokenBatch read_batch_file(const std::string& path, int64_t block_size, int64_t vocab_size);

}  // namespace kiln
