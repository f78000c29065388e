// What the attention lowerings share (defined in cuda/lower/attention_kernels.cpp; used by
// cuda/lower/attention.cpp: the FFMA kernels and the choice between kernel families, and by
// cuda/lower/attention_mma.cpp: the tensor-core kernels): the op's sizes and layout, each
// launch's buffer parameters, masks, the dropout stream's bits, and row addressing.
#pragma once

#include <cstdint>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda::attention_detail {

using kir::KernelBuilder;
using kir::Operand;
using kir::Reg;
using kir::Type;

// Where one of q, k, v (or its gradient) lies with heads inside: `stride` elements from one T step
// to the next (0: H times the head size, a tensor of its own) and `offset` to its first element.
struct Piece {
  int64_t stride = 0, offset = 0;
};

struct Sizes {
  int64_t entries, tq, tk, d, dv;
  Piece q, k, v;
  int64_t groups = 1;         // query heads a key/value head (kv entry = query entry / groups)
  bool packed = false;        // q, k, v one input (and one gradient output)
  int64_t heads = 1;          // with heads inside: H of (B, T, H, d)
  bool heads_inside = false;  // q, k, v, o and gradients (B, T, H, d); else (entries, T, d)
  // An additive mask (input mask_input), broadcast over the scores: element (entry, i, j) at
  // base(entry) + i mask_row_stride + j mask_col_stride, base from the scores' batch dims
  // (mask_batch) and the mask's strides along them (0 where it broadcasts).
  bool mask = false;
  int mask_input = 3;
  std::vector<int64_t> mask_batch, mask_strides;
  int64_t mask_row_stride = 0, mask_col_stride = 0;
  bool bf16 = false;    // q, k, v and do read rounded to bf16 (product_operand)
  bool copies = false;  // each main output also stored rounded to bf16 (AttentionParams::bf16_copies)
  double keep = 1.0;    // < 1: dropout, with the stream's key and offset inputs at `stream`
  int stream = 3;
  int rest = 3;  // the input index of o (attention_grad)
  Type it;       // index type
};

Sizes sizes_of(const Circuit& c, const Op& op, const Target& target);

// The key/value entry query entry `entry` reads (grouped-query attention: entry / groups).
Reg kv_entry_of(KernelBuilder& b, const Sizes& s, Reg entry);

// The dropout stream in a kernel: its key and offset (loaded at the start); off without dropout.
struct Stream {
  Reg key0, key1, offset;
  bool on() const { return key0.valid(); }
};

// The buffer parameters of each launch (registers) and where their addresses come from, the
// same for both kernel families.
// A main output's bf16 copy (`copies`) is the register after its name (invalid without copies).
struct ForwardParams {
  Reg q, k, v, o, o_copy, lse, mask;
  Stream stream;
  std::vector<ArgRef> args;
};
ForwardParams forward_params(KernelBuilder& b, const Sizes& s);

struct GradQParams {
  Reg q, k, v, o, lse, d_o, dlse, dq, dq_copy, dd;  // dlse: invalid without one; dd: D, scratch
  Reg mask;
  Stream stream;
  std::vector<ArgRef> args;
};
GradQParams grad_q_params(KernelBuilder& b, const Sizes& s, bool has_dlse);

struct GradKvParams {
  Reg q, k, v, lse, d_o, dd, dk, dk_copy, dv, dv_copy, mask;
  Stream stream;
  std::vector<ArgRef> args;
};
GradKvParams grad_kv_params(KernelBuilder& b, const Sizes& s);

// The additive mask: the element offset of (entry, query 0, key 0); of row `query` (clamped to
// tq - 1); and score + the mask at `key` of that row (clamped to tk - 1; score itself without a
// mask).
Reg mask_base(KernelBuilder& b, const Sizes& s, Reg entry);
Reg mask_row(KernelBuilder& b, const Sizes& s, Reg base, Reg query);
Reg masked(KernelBuilder& b, const Sizes& s, Reg mask, Reg row, Reg score, Operand key);
// The max the online softmax subtracts: the running max, or 0 while a mask hides every key seen
// (max -inf), so that the rescale and the exponentials give 0, never NaN.
Reg softmax_max(KernelBuilder& b, const Sizes& s, Reg m_new);

// Dropout on the probabilities, the reference's bits: element row * tk + key of the Bernoulli
// stream (row = entry * tq + query, in the index type; u64 result); the four Philox words of the
// block holding an element (word element % 4 is the element's); whether a word keeps its
// element; 1 / keep or 0 for a kept flag; and the factor of (row, key) in one call.
Reg stream_element(KernelBuilder& b, const Sizes& s, Reg row, Operand key);
std::vector<Reg> stream_words(KernelBuilder& b, const Stream& st, Reg element);
Reg kept(KernelBuilder& b, const Sizes& s, Reg bits);
Reg factor_of(KernelBuilder& b, const Sizes& s, Reg keep);
Reg stream_bits(KernelBuilder& b, const Sizes& s, const Stream& st, Reg row, Operand key);  // element's word
Reg dropout_factor(KernelBuilder& b, const Sizes& s, const Stream& st, Reg row, Operand key);

// A u32 launch index (tid, ctaid) in the index type.
Reg in_index_type(KernelBuilder& b, const Sizes& s, Reg r32);

// Element offset of row `pos` of entry `entry` in a tensor of `t` rows an entry and n columns
// (heads inside: in the piece `piece` describes).
Reg row_first(KernelBuilder& b, const Sizes& s, Operand entry, Operand pos, int64_t t, int64_t n,
              const Piece& piece = {});

// e^x, accurate to about 3 ulp (emit_scalar_exp).
Reg exp_of(KernelBuilder& b, Reg x);

// Stores value x of a main output at element `at` of its bf16 copy, rounded as a cast rounds;
// nothing when `copy` is invalid (no copies).
void store_copy(KernelBuilder& b, Reg copy, Reg at, Reg x);

// The tensor-core kernels (attention_mma.cpp): whether they take an op of these sizes, and
// its forward and backward launches.
bool mma_attention(const AttentionParams& a, const Sizes& s, const Target& target);
LoweredOp lower_attention_mma(const AttentionParams& a, const Sizes& s);
LoweredOp lower_attention_grad_mma(const Op& op, const AttentionParams& a, const Sizes& s);

}  // namespace kiln::cuda::attention_detail
