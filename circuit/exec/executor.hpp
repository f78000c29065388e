// The Eigen reference executor: runs any Circuit on the host in f32 or f64 through each
// Prim's reference. A Program is a Circuit prepared once and run many times with new bindings:
// verified, with a static memory plan (every intermediate at a fixed offset of one workspace
// kept between runs, as on the GPU), scratch for the references' temporaries kept between runs,
// and the values that depend on no binding (fills, iotas, masks built from them) computed once.
// After its first run a Program allocates no tensor storage but the outputs it returns.
#pragma once

#include <atomic>
#include <vector>

#include <kiln/circuit/exec/thread_governor.hpp>
#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/eval_buffers.hpp>

namespace kiln {

class Program {
 public:
  // `outputs` are the values run() returns, in order. `target`: the Target the circuit was
  // optimized for; its CPU kernel choices (CpuBf16Products) steer the references.
  Program(Circuit circuit, std::vector<ValueId> outputs, Target target = cpu_target());

  // `bindings` holds one tensor per circuit().externals(), in order; each must match the
  // external's dtype and shape exactly (an error names the value otherwise). Persistent
  // externals are written in place by assign ops, all at the end of a run that succeeded, or
  // (Storage::InBuffer) by an update that only ops which cannot fail follow. Bindings of
  // persistent externals must not share memory with other bindings.
  // The results own their storage (or view a binding, through a reshape): later runs leave
  // them alone. One run at a time: a Program keeps its workspace between runs.
  std::vector<HostTensor> run(const std::vector<HostTensor>& bindings) const;

  const Circuit& circuit() const { return circuit_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const Target& target() const { return target_; }
  // Bytes of the workspace holding every planned intermediate, and the most of them live at
  // once (the least any placement could use).
  size_t workspace_bytes() const { return workspace_bytes_; }
  size_t peak_live_bytes() const { return peak_live_bytes_; }
  // Ops computed once per Program (their values depend on no binding).
  size_t constant_ops() const;
  // The OpenMP team size of the next run: fixed_num_threads() when set, else the governor's
  // choice (see thread_governor.hpp), or with adaptive threads off, omp_get_max_threads() when
  // the Program was made. Eigen's GEMM blocks by team size, so the size changes the last bits
  // of a result: a run that must repeat bit for bit keeps it fixed.
  int threads() const;
  void set_adaptive_threads(bool on) { adaptive_threads_ = on; }
  // With recording on, each run times every op it computes: last_op_ms()[i] is op i's time in the
  // last run (0 for ops it did not compute). The autotuner times its candidates within a step so.
  void set_record_op_times(bool on) { record_op_times_ = on; }
  const std::vector<double>& last_op_ms() const { return op_ms_; }
  bool adaptive_threads() const { return adaptive_threads_; }

 private:
  // InBuffer: written straight into the persistent buffer it is assigned to.
  enum class Storage : uint8_t { External, Planned, Fresh, Constant, InBuffer };
  void prepare_storage() const;
  // Where an op that no failing op follows computes a buffer's new contents from its old ones
  // (AdamW's weights and moments), and nothing reads the old ones after it, the new contents
  // are written over the old (Storage::InBuffer): the update stages no copy of the state.
  void store_updates_in_their_buffers();
  // Throws unless the persistent buffers written in place share no memory with other bindings.
  void check_in_buffer_bindings(const std::vector<HostTensor>& bindings) const;
  // The block of an input of op `op_index` that its output `output` may be stored over (see
  // PrimDef::may_overwrite), or -1. `last`: per planned root, its last reader; `block_of`: per
  // planned root, its block so far; `taken`: blocks the op's earlier outputs are stored over.
  int dying_input_to_overwrite(size_t op_index, size_t output, const std::vector<int>& last,
                               const std::vector<int>& block_of, const std::vector<int>& taken) const;
  // Whether `op` reads the value rooted at `root` and every input slot reading it (pointwise(x, x)
  // reads x twice) has the output's dtype and shape and lets output `output` be written over it.
  // `inputs`: the infos of op's inputs.
  bool every_read_allows_overwrite(const Op& op, const std::vector<ValueInfo>& inputs, size_t output,
                                   size_t root) const;

  Circuit circuit_;
  std::vector<ValueId> outputs_;
  Target target_;
  std::vector<ValueId> root_;       // value -> the value whose storage it shares
  std::vector<Storage> storage_;    // per root
  std::vector<size_t> offset_;      // per planned root: its workspace offset
  std::vector<char> constant_op_;   // per op: computed once, on the first run
  std::vector<char> overwrites_;    // per op: stores an output over an input
  std::vector<ValueId> in_buffer_;  // per value: the persistent buffer it is written into, or kNoValue
  bool writes_in_buffers_ = false;  // some value is (Storage::InBuffer)
  size_t workspace_bytes_ = 0, peak_live_bytes_ = 0;
  bool adaptive_threads_ = true;
  bool record_op_times_ = false;
  mutable std::vector<double> op_ms_;

  // Kept between runs (a run is logically const: the same bindings give the same results).
  mutable HostTensor workspace_;
  mutable std::vector<HostTensor> planned_;  // per value: its view of the workspace
  mutable std::vector<HostTensor> constants_;
  mutable bool constants_ready_ = false;
  mutable std::vector<EvalBuffers::OpState> op_state_;  // per op: scratch blocks, its compiled form
  mutable std::atomic<bool> running_{false};
  mutable ThreadGovernor governor_;
};

// Throws kiln::Error (prefixed with `who`) unless `bindings` holds one tensor per external of c,
// each with the external's dtype and shape; the message names the value.
void check_bindings(const Circuit& c, const std::vector<HostTensor>& bindings, const std::string& who);

// One-shot convenience: Program(c, outputs).run(bindings).
std::vector<HostTensor> execute(const Circuit& c, const std::vector<HostTensor>& bindings,
                                const std::vector<ValueId>& outputs);

// A debugging aid of the executor (the test suite's main turns it on; `--poison-buffers` too):
// every Program fills each planned output and scratch buffer with 0xff bytes before a reference
// writes it (NaN, or -1 for i32), so that a reference that leaves elements unwritten shows. Off
// by default. It changes what a run costs, never what a plan is.
void set_poison_buffers(bool on);
bool poison_buffers();

}  // namespace kiln
