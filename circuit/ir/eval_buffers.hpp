// EvalBuffers: where a Prim's reference writes. The executor hands each op the storage its
// memory plan chose for every output (a slice of the plan's workspace, or a fresh buffer for a
// value the caller keeps), a scratch pool for the op's temporaries and what the reference
// compiled on an earlier run, all kept from run to run, so that a planned step allocates
// nothing. Contents are undefined unless asked zeroed: a reference writes every element of what
// it takes (tests poison the storage to check that).
#pragma once

#include <memory>
#include <typeinfo>
#include <vector>

#include <kiln/circuit/ir/host_tensor.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

struct ValueInfo;

class EvalBuffers {
 public:
  // What the executor keeps of one op between runs of a Program, whose op has the same params
  // and input dtypes and shapes on every run: its scratch blocks (the k-th scratch request of a
  // run reuses the k-th block, grown when a request is larger) and what its reference compiled
  // from the op alone, and the op's kernel choice (the plan Target's tuned one, else the defaults).
  struct OpState {
    std::vector<HostTensor> blocks;
    std::shared_ptr<void> compiled;
    const std::type_info* compiled_type = nullptr;
    KernelChoice choice;
  };

  // `planned` holds one tensor per output, or is empty: an undefined entry (or none) gets a
  // fresh buffer. Without `state`, temporaries are fresh buffers and nothing compiled is kept.
  // `target` (kept by the caller): the Target the op's plan was made for (the host's without).
  EvalBuffers(const std::vector<ValueInfo>& infos, std::vector<HostTensor> planned = {}, OpState* state = nullptr,
              bool poison = false, const Target* target = nullptr);

  size_t size() const;
  const ValueInfo& info(size_t k) const;
  const std::vector<ValueInfo>& infos() const { return infos_; }
  // The plan's Target: the kernel choices a reference has (CpuBf16Products for bf16 matmuls).
  const Target& target() const;
  // This op's kernel choice (KernelChoice: the GEMM, attention's row blocks, row chunks).
  const KernelChoice& choice() const;

  // Output k's storage, with output k's dtype and shape; contents undefined.
  HostTensor output(size_t k);
  // The same, every byte zero (for references that accumulate).
  HostTensor zeroed_output(size_t k);
  // A temporary of the op, valid until the op returns; contents undefined.
  HostTensor scratch(DType dtype, const Shape& shape);

  // The reference's compiled form of this op (what depends on its params and input dtypes and
  // shapes only): make() builds it on the op's first run, and later runs get it back. A run's
  // inputs and outputs may lie elsewhere on the next, so any pointer to them the compiled form
  // holds must be bound again by every run.
  template <class C, class Make>
  C& compiled(Make&& make) {
    OpState& s = state_ ? *state_ : local_;
    if (!s.compiled || *s.compiled_type != typeid(C)) {
      s.compiled = std::make_shared<C>(make());
      s.compiled_type = &typeid(C);
    }
    return *static_cast<C*>(s.compiled.get());
  }

 private:
  const std::vector<ValueInfo>& infos_;
  std::vector<HostTensor> planned_;
  OpState* state_;
  OpState local_;  // without an executor's state: the compiled form of this run only
  size_t next_scratch_ = 0;
  bool poison_;
  const Target* target_;
};

// Fills a buffer with 0xff bytes: NaN for floats, -1 for integers (an index no gather accepts),
// so that a reference reading storage it never wrote shows it.
void poison_bytes(const HostTensor& t);

}  // namespace kiln
