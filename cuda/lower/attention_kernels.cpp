// What the attention lowerings share (attention_kernels.hpp): the op's sizes and layout, each
// launch's buffer parameters, masks, the dropout stream's bits, and row addressing.
#include <algorithm>
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/attention_kernels.hpp>
#include <kiln/cuda/lower/elementwise.hpp>

namespace kiln::cuda::attention_detail {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;

Sizes sizes_of(const Circuit& c, const Op& op, const Target& target) {
  const AttentionParams a = AttentionParams::of(op);
  Sizes s;
  s.heads_inside = a.heads_inside;
  s.groups = a.kv_groups;
  if (a.packed_heads > 0) {  // (B, T, 3 H d)
    const Shape& qkv = c.info(op.inputs[0]).shape;
    const int64_t width = qkv[2] / 3;
    s.packed = true;
    s.stream = s.rest = 1;
    s.tq = s.tk = qkv[1];
    s.heads = a.packed_heads;
    s.d = s.dv = width / s.heads;
    s.entries = qkv[0] * s.heads;
    s.q = {qkv[2], 0};
    s.k = {qkv[2], width};
    s.v = {qkv[2], 2 * width};
  } else {
    const Shape &q = c.info(op.inputs[0]).shape, &v = c.info(op.inputs[2]).shape;
    const int t_axis = s.heads_inside ? 1 : q.rank() - 2;
    s.tq = q[t_axis];
    s.d = q[q.rank() - 1];
    s.tk = v[t_axis];
    s.dv = v[v.rank() - 1];
    s.heads = s.heads_inside ? q[2] : 1;
    s.entries = 1;
    for (int ax = 0; ax < q.rank() - 2; ++ax) s.entries *= q[ax];
    if (s.heads_inside) s.entries = q[0] * q[2];
  }
  s.mask_input = s.stream;
  if (a.mask) {
    // The scores' shape (batch..., Tq, Tk), heads inside (B, H, Tq, Tk); the mask aligned right.
    s.mask = true;
    std::vector<int64_t> scores;
    if (s.packed || s.heads_inside) {
      scores = {s.entries / s.heads, s.heads};
    } else {
      const Shape& q = c.info(op.inputs[0]).shape;
      scores.assign(q.dims().begin(), q.dims().end() - 2);
    }
    scores.push_back(s.tq);
    scores.push_back(s.tk);
    const Shape& m = c.info(op.inputs[static_cast<size_t>(s.mask_input)]).shape;
    const int r = static_cast<int>(scores.size()), pad = r - m.rank();
    std::vector<int64_t> stride(scores.size(), 0);
    int64_t step = 1;
    for (int d = r - 1; d >= pad; --d) {
      stride[static_cast<size_t>(d)] = m[d - pad] == 1 ? 0 : step;
      step *= m[d - pad];
    }
    s.mask_batch.assign(scores.begin(), scores.end() - 2);
    s.mask_strides.assign(stride.begin(), stride.end() - 2);
    s.mask_row_stride = stride[static_cast<size_t>(r - 2)];
    s.mask_col_stride = stride[static_cast<size_t>(r - 1)];
    s.stream += 1;
    s.rest += 1;
  }
  s.bf16 = a.bf16;
  s.copies = a.bf16_copies;
  s.keep = a.keep;
  if (a.dropout()) s.rest += 2;
  const Shape& q = c.info(op.inputs[0]).shape;
  const Shape& v = c.info(op.inputs[s.packed ? 0 : 2]).shape;
  if (s.d > 128 || s.dv > 128 || s.tk == 0)
    fail(op.prim->name, op.scope,
         "the GPU lowering takes head sizes up to 128 and at least one key, received q " + q.str() + " and v " +
             v.str());
  if (s.d == 0 || s.dv == 0)
    fail(op.prim->name, op.scope,
         "the GPU lowering needs head sizes of at least 1, received q " + q.str() + " and v " + v.str());
  int64_t largest = 0;
  for (ValueId x : op.inputs) largest = std::max(largest, c.info(x).shape.numel());
  for (ValueId x : op.outputs) largest = std::max(largest, c.info(x).shape.numel());
  s.it = index_type(target, largest);
  return s;
}

// The key/value entry query entry `entry` reads (grouped-query attention: entry / groups).
Reg kv_entry_of(KernelBuilder& b, const Sizes& s, Reg entry) {
  return s.groups == 1 ? entry : b.div(s.it, entry, imm_index(s.it, s.groups));
}

// Kernel arguments: q, k and v (packed: input 0 three times), input `rest + i` (o, lse, do, dlse),
// and output `piece` of the gradients (packed: output 0 three times).
std::vector<ArgRef> with(std::vector<ArgRef> a, const std::vector<ArgRef>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
std::vector<ArgRef> qkv_args(const Sizes& s) {
  return {kIn0, {ArgRef::Kind::Input, s.packed ? 0 : 1}, {ArgRef::Kind::Input, s.packed ? 0 : 2}};
}
ArgRef after_qkv(const Sizes& s, int i) { return {ArgRef::Kind::Input, s.rest + i}; }
ArgRef gradient_of(const Sizes& s, int piece) { return {ArgRef::Kind::Output, s.packed ? 0 : piece}; }
// The bf16 copy of a gradient: after the gradients (one output packed, else three).
ArgRef gradient_copy_of(const Sizes& s, int piece) { return {ArgRef::Kind::Output, s.packed ? 1 : 3 + piece}; }
// A copy's parameter, declared after the launch's buffers (before the mask and stream); invalid
// without copies.
Reg copy_param(KernelBuilder& b, const Sizes& s, const char* name, ArgRef output, std::vector<ArgRef>& args) {
  if (!s.copies) return {};
  args.push_back(output);
  return b.param(name, Type::u64);
}

// The additive mask in a kernel (its address; invalid without one), declared after the launch's
// buffers and before the stream.
Reg mask_param(KernelBuilder& b, const Sizes& s, std::vector<ArgRef>& args) {
  if (!s.mask) return {};
  args.push_back({ArgRef::Kind::Input, s.mask_input});
  return b.param("mask", Type::u64);
}
// Element offset of (entry, query 0, key 0) in the mask.
Reg mask_base(KernelBuilder& b, const Sizes& s, Reg entry) {
  Reg at = b.mov(s.it, imm_index(s.it, 0)), rest = entry;
  for (size_t d = s.mask_batch.size(); d-- > 0;) {
    const int64_t n = s.mask_batch[d];
    if (s.mask_strides[d] != 0)
      b.assign(kir::Opc::Mad, at, {b.rem(s.it, rest, imm_index(s.it, n)), imm_index(s.it, s.mask_strides[d]), at});
    if (d > 0) rest = b.div(s.it, rest, imm_index(s.it, n));
  }
  return at;
}
// Element offset of row `query` (clamped to tq - 1: rows past the end compute unused values).
Reg mask_row(KernelBuilder& b, const Sizes& s, Reg base, Reg query) {
  return b.mad(s.it, b.min(s.it, query, imm_index(s.it, s.tq - 1)), imm_index(s.it, s.mask_row_stride), base);
}
// score + the mask at key `key` of a row (key clamped to tk - 1); score itself without a mask.
Reg masked(KernelBuilder& b, const Sizes& s, Reg mask, Reg row, Reg score, Operand key) {
  if (!mask.valid()) return score;
  Reg at = b.mad(s.it, b.min(s.it, key, imm_index(s.it, s.tk - 1)), imm_index(s.it, s.mask_col_stride), row);
  return b.add(Type::f32, score, b.ld(Space::global, Type::f32, b.address(mask, at, 4)));
}
// The max the online softmax subtracts: the running max, or 0 while a mask hides every key seen
// (max -inf), so that the rescale exp(m - max) and exp(score - max) are 0, never NaN.
Reg softmax_max(KernelBuilder& b, const Sizes& s, Reg m_new) {
  if (!s.mask) return m_new;
  return b.selp(Type::f32, imm_f32(0.0f), m_new, b.setp(Cmp::eq, m_new, imm_f32(-INFINITY)));
}

// Declares the stream's parameters last (after the launch's buffers) and adds their arguments.
Stream stream_params(KernelBuilder& b, const Sizes& s, std::vector<ArgRef>& args) {
  if (s.keep >= 1.0) return {};
  Reg key = b.param("key", Type::u64), offset = b.param("offset", Type::u64);
  args.push_back({ArgRef::Kind::Input, s.stream});
  args.push_back({ArgRef::Kind::Input, s.stream + 1});
  return {b.ld(Space::global, Type::u32, key), b.ld(Space::global, Type::u32, key, 4),
          b.ld(Space::global, Type::u32, offset)};
}

// The dropout factor of probability (row, key), row = entry * tq + query: 1 / keep where element
// row * tk + key of the Bernoulli(keep) stream is kept, else 0 (the reference's bits: word
// element % 4 of Philox block element / 4, kept when (bits >> 8) < ceil(keep 2^24), as the random
// lowering tests it). Invalid without dropout.
Reg stream_element(KernelBuilder& b, const Sizes& s, Reg row, Operand key) {
  auto wide = [&](Operand x) { return s.it == Type::u64 ? x : Operand(b.cvt(Type::u64, x)); };
  return b.mad(Type::u64, wide(row), kir::imm_u64(static_cast<uint64_t>(s.tk)), wide(key));
}
// The four words of the Philox block holding `element`.
std::vector<Reg> stream_words(KernelBuilder& b, const Stream& st, Reg element) {
  Reg block = b.shr(Type::u64, element, imm_u32(2));
  return emit_philox(b,
                     {b.cvt(Type::u32, block), b.cvt(Type::u32, b.shr(Type::u64, block, imm_u32(32))), st.offset,
                      b.mov(Type::u32, imm_u32(0))},
                     {st.key0, st.key1});
}
// Whether a stream word keeps its element: (bits >> 8) < ceil(keep 2^24).
Reg kept(KernelBuilder& b, const Sizes& s, Reg bits) {
  const double threshold = std::min(std::ceil(s.keep * 16777216.0), 16777216.0);
  return b.setp(Cmp::lt, b.shr(Type::u32, bits, imm_u32(8)), imm_u32(static_cast<uint32_t>(threshold)));
}
Reg factor_of(KernelBuilder& b, const Sizes& s, Reg keep) {
  return b.selp(Type::f32, imm_f32(static_cast<float>(1.0 / s.keep)), imm_f32(0.0f), keep);
}
// The stream word of element row * tk + key.
Reg stream_bits(KernelBuilder& b, const Sizes& s, const Stream& st, Reg row, Operand key) {
  Reg element = stream_element(b, s, row, key);
  std::vector<Reg> r = stream_words(b, st, element);
  Reg word = b.cvt(Type::u32, b.and_(Type::u64, element, kir::imm_u64(3)));
  Reg bits = r[3];
  for (int w = 2; w >= 0; --w)
    bits = b.selp(Type::u32, r[static_cast<size_t>(w)], bits, b.setp(Cmp::eq, word, imm_u32(static_cast<uint32_t>(w))));
  return bits;
}
Reg dropout_factor(KernelBuilder& b, const Sizes& s, const Stream& st, Reg row, Operand key) {
  if (!st.on()) return {};
  return factor_of(b, s, kept(b, s, stream_bits(b, s, st, row, key)));
}
ForwardParams forward_params(KernelBuilder& b, const Sizes& s) {
  ForwardParams f;
  f.q = b.param("q", Type::u64), f.k = b.param("k", Type::u64), f.v = b.param("v", Type::u64);
  f.o = b.param("o", Type::u64), f.lse = b.param("lse", Type::u64);
  f.args = with(qkv_args(s), {kOut0, {ArgRef::Kind::Output, 1}});
  f.o_copy = copy_param(b, s, "o_bf16", {ArgRef::Kind::Output, 2}, f.args);
  f.mask = mask_param(b, s, f.args);
  f.stream = stream_params(b, s, f.args);
  return f;
}
GradQParams grad_q_params(KernelBuilder& b, const Sizes& s, bool has_dlse) {
  GradQParams g;
  g.q = b.param("q", Type::u64), g.k = b.param("k", Type::u64), g.v = b.param("v", Type::u64);
  g.o = b.param("o", Type::u64), g.lse = b.param("lse", Type::u64), g.d_o = b.param("do", Type::u64);
  if (has_dlse) g.dlse = b.param("dlse", Type::u64);
  g.dq = b.param("dq", Type::u64), g.dd = b.param("D", Type::u64);
  g.args = with(qkv_args(s), {after_qkv(s, 0), after_qkv(s, 1), after_qkv(s, 2)});
  if (has_dlse) g.args.push_back(after_qkv(s, 3));
  g.args.push_back(kOut0);
  g.args.push_back({ArgRef::Kind::Scratch, 0});
  g.dq_copy = copy_param(b, s, "dq_bf16", gradient_copy_of(s, 0), g.args);
  g.mask = mask_param(b, s, g.args);
  g.stream = stream_params(b, s, g.args);
  return g;
}
GradKvParams grad_kv_params(KernelBuilder& b, const Sizes& s) {
  GradKvParams g;
  g.q = b.param("q", Type::u64), g.k = b.param("k", Type::u64), g.v = b.param("v", Type::u64);
  g.lse = b.param("lse", Type::u64), g.d_o = b.param("do", Type::u64), g.dd = b.param("D", Type::u64);
  g.dk = b.param("dk", Type::u64), g.dv = b.param("dv", Type::u64);
  g.args = with(qkv_args(s),
                {after_qkv(s, 1), after_qkv(s, 2), {ArgRef::Kind::Scratch, 0}, gradient_of(s, 1), gradient_of(s, 2)});
  g.dk_copy = copy_param(b, s, "dk_bf16", gradient_copy_of(s, 1), g.args);
  g.dv_copy = copy_param(b, s, "dv_bf16", gradient_copy_of(s, 2), g.args);
  g.mask = mask_param(b, s, g.args);
  g.stream = stream_params(b, s, g.args);
  return g;
}

Reg exp_of(KernelBuilder& b, Reg x) { return emit_scalar_exp(b, se::exp(se::in(0)), {x}); }

void store_copy(KernelBuilder& b, Reg copy, Reg at, Reg x) {
  if (copy.valid()) store_from_f32(b, DType::bf16, copy, at, x);
}

// Element offset of row `pos` of entry `entry` in a tensor of `t` rows an entry and n columns
// (heads inside: in the piece `piece` describes).
Reg row_first(KernelBuilder& b, const Sizes& s, Operand entry, Operand pos, int64_t t, int64_t n, const Piece& piece) {
  if (!s.heads_inside) return b.mul(s.it, b.mad(s.it, entry, imm_index(s.it, t), pos), imm_index(s.it, n));
  const int64_t stride = piece.stride > 0 ? piece.stride : s.heads * n;
  Reg batch = b.div(s.it, entry, imm_index(s.it, s.heads)), head = b.rem(s.it, entry, imm_index(s.it, s.heads));
  Reg step = b.mad(s.it, batch, imm_index(s.it, t), pos);
  return b.mad(s.it, step, imm_index(s.it, stride),
               b.mad(s.it, head, imm_index(s.it, n), imm_index(s.it, piece.offset)));
}

Reg in_index_type(KernelBuilder& b, const Sizes& s, Reg r32) { return s.it == Type::u32 ? r32 : b.cvt(Type::u64, r32); }

}  // namespace kiln::cuda::attention_detail
