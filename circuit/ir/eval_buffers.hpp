// EvalBuffers: where a Prim's reference writes. The executor hands each op the storage its
// memory plan chose for every output (a slice of the plan's workspace, or a fresh buffer for a
// value the caller keeps) and a scratch pool for the op's temporaries, both reused from run to
// run, so that a planned step allocates nothing. Contents are undefined unless asked zeroed: a
// reference writes every element of what it takes (tests poison the storage to check that).
#pragma once

#include <vector>

#include "circuit/ir/host_tensor.hpp"

namespace kiln {

struct ValueInfo;

class EvalBuffers {
 public:
  // Scratch storage of one op, kept by the executor between runs: the k-th scratch request of
  // an op reuses the k-th block, grown when a request is larger.
  using ScratchBlocks = std::vector<HostTensor>;

  // `planned` holds one tensor per output, or is empty: an undefined entry (or none) gets a
  // fresh buffer. Without `scratch`, temporaries are fresh buffers too.
  EvalBuffers(const std::vector<ValueInfo>& infos, std::vector<HostTensor> planned = {},
              ScratchBlocks* scratch = nullptr, bool poison = false);

  size_t size() const;
  const ValueInfo& info(size_t k) const;
  const std::vector<ValueInfo>& infos() const { return infos_; }

  // Output k's storage, with output k's dtype and shape; contents undefined.
  HostTensor output(size_t k);
  // The same, every byte zero (for references that accumulate).
  HostTensor zeroed_output(size_t k);
  // A temporary of the op, valid until the op returns; contents undefined.
  HostTensor scratch(DType dtype, const Shape& shape);

 private:
  const std::vector<ValueInfo>& infos_;
  std::vector<HostTensor> planned_;
  ScratchBlocks* blocks_;
  size_t next_scratch_ = 0;
  bool poison_;
};

// Fills a buffer with 0xff bytes: NaN for floats, -1 for integers (an index no gather accepts),
// so that a reference reading storage it never wrote shows it.
void poison_bytes(const HostTensor& t);

}  // namespace kiln
