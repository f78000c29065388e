// Lowering of attention and attention_grad (circuit/prims/attention.cpp), f32. A warp per row,
// four rows a block of 128 threads; lane l holds head columns l, l + 32, ... of the row's
// vectors in registers (head sizes up to 128 take four registers a vector).
//  - attention: a warp per query row walks its keys in order (only j <= i when causal), one at a
//    time: the score is the lanes' partial dot products summed by a butterfly, and the softmax
//    is online (running max m, running sum l, the output accumulator rescaled by exp(m_old - m)).
//    It writes o = acc / l and lse = m + log l; no (Tq, Tk) matrix exists anywhere.
//  - attention_grad, two launches, no atomics (the same bits run after run):
//    1. a warp per query row: D = rowsum(do * o) - dlse (kept in scratch for launch 2), and over
//       its keys p = exp(s - lse), ds = p (do . v_j - D), dq += ds k_j;
//    2. a warp per key row: over the queries that see it, the same p and ds, dv += p do_i,
//       dk += ds q_i.
// Rows are addressed through row_first: (entry, T, d) operands, or with heads inside (B, T, H, d)
// ones read in place (a row's d elements are contiguous either way).
// Every loop bound depends on the row alone, so it is uniform across a warp and the shuffles
// never see a partial warp. Sums are f32, over the head size in a fixed butterfly order and over
// keys in key order.
#include "circuit/ir/error.hpp"
#include "circuit/prims/prim_params.hpp"
#include "cuda/lower/elementwise.hpp"
#include "cuda/lower/families.hpp"

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;
using kir::SReg;

namespace {

constexpr uint32_t kWarps = 4;  // rows a block

struct Sizes {
  int64_t entries, tq, tk, d, dv;
  int64_t heads = 1;          // with heads inside: H of (B, T, H, d)
  bool heads_inside = false;  // q, k, v, o and gradients (B, T, H, d); else (entries, T, d)
  Type it;                    // index type
};

Sizes sizes_of(const Circuit& c, const Op& op) {
  const Shape &q = c.info(op.inputs[0]).shape, &v = c.info(op.inputs[2]).shape;
  Sizes s;
  s.heads_inside = AttentionParams::of(op).heads_inside;
  const int t_axis = s.heads_inside ? 1 : q.rank() - 2;
  s.tq = q[t_axis];
  s.d = q[q.rank() - 1];
  s.tk = v[t_axis];
  s.dv = v[v.rank() - 1];
  s.heads = s.heads_inside ? q[2] : 1;
  s.entries = 1;
  for (int a = 0; a < q.rank() - 2; ++a) s.entries *= q[a];
  if (s.heads_inside) s.entries = q[0] * q[2];
  if (s.d > 128 || s.dv > 128 || s.tk == 0)
    fail(op.prim->name, op.scope,
         "the GPU lowering takes head sizes up to 128 and at least one key, received q " + q.str() + " and v " + v.str());
  int64_t largest = 0;
  for (ValueId x : op.inputs) largest = std::max(largest, c.info(x).shape.numel());
  s.it = index_type(largest);
  return s;
}

// The row this warp works on (u32 from the launch; in the index type), and the lane.
struct WarpRow {
  Reg row, lane, in_range;
};

WarpRow warp_row(KernelBuilder& b, const Sizes& s, int64_t rows) {
  Reg tid = b.sreg(SReg::tid_x);
  Reg lane = b.and_(Type::u32, tid, imm_u32(31));
  Reg row32 = b.mad(Type::u32, b.sreg(SReg::ctaid_x), imm_u32(kWarps), b.shr(Type::u32, tid, imm_u32(5)));
  Reg row = s.it == Type::u32 ? row32 : b.cvt(Type::u64, row32);
  return {row, lane, b.setp(Cmp::lt, row, imm_index(s.it, rows))};
}

// This lane's columns of a row vector of n elements at element offset `first` of `base`:
// column lane + 32 j in register j (zero past n).
std::vector<Reg> load_row(KernelBuilder& b, const Sizes& s, Reg base, Reg first, Reg lane, int64_t n,
                          float factor = 1.0f) {
  std::vector<Reg> out;
  Reg lane_it = s.it == Type::u32 ? lane : b.cvt(Type::u64, lane);
  for (int64_t j = 0; 32 * j < n; ++j) {
    Reg at = b.add(s.it, first, b.add(s.it, lane_it, imm_index(s.it, 32 * j)));
    Reg x = b.mov(Type::f32, imm_f32(0.0f));
    auto load = [&] {
      Reg v = b.ld(Space::global, Type::f32, b.address(base, at, 4));
      b.set(x, factor == 1.0f ? v : b.mul(Type::f32, v, imm_f32(factor)));
    };
    if (32 * (j + 1) <= n)
      load();
    else
      b.if_(b.setp(Cmp::lt, lane, imm_u32(static_cast<uint32_t>(n - 32 * j))), load);
    out.push_back(x);
  }
  return out;
}

void store_row(KernelBuilder& b, const Sizes& s, Reg base, Reg first, Reg lane, int64_t n, const std::vector<Reg>& x,
               float factor = 1.0f) {
  Reg lane_it = s.it == Type::u32 ? lane : b.cvt(Type::u64, lane);
  for (int64_t j = 0; 32 * j < n; ++j) {
    Reg at = b.add(s.it, first, b.add(s.it, lane_it, imm_index(s.it, 32 * j)));
    auto store = [&] {
      Reg v = factor == 1.0f ? x[static_cast<size_t>(j)] : b.mul(Type::f32, x[static_cast<size_t>(j)], imm_f32(factor));
      b.st(Space::global, Type::f32, b.address(base, at, 4), v);
    };
    if (32 * (j + 1) <= n)
      store();
    else
      b.if_(b.setp(Cmp::lt, lane, imm_u32(static_cast<uint32_t>(n - 32 * j))), store);
  }
}

// The dot product of two row vectors held as load_row gives them, in every lane.
Reg warp_dot(KernelBuilder& b, const std::vector<Reg>& x, const std::vector<Reg>& y) {
  Reg acc = b.mul(Type::f32, x[0], y[0]);
  for (size_t j = 1; j < x.size(); ++j) acc = b.fma(Type::f32, x[j], y[j], acc);
  return warp_reduce(b, ReduceKind::Sum, acc);
}

// acc[j] = acc[j] * keep + w * x[j] (keep omitted: acc += w x).
void accumulate(KernelBuilder& b, std::vector<Reg>& acc, Reg w, const std::vector<Reg>& x, Reg keep = {}) {
  for (size_t j = 0; j < acc.size(); ++j)
    b.assign(kir::Opc::Fma, acc[j], {w, x[j], keep.valid() ? Operand(b.mul(Type::f32, acc[j], keep)) : Operand(acc[j])});
}

Reg exp_of(KernelBuilder& b, Reg x) { return emit_scalar_exp(b, se::exp(se::in(0)), {x}); }

// Rows [entry * t, entry * t + t) for a row index of `t` rows an entry: the row's entry and
// its position within the entry.
std::pair<Reg, Reg> entry_and_position(KernelBuilder& b, const Sizes& s, Reg row, int64_t t) {
  return {b.div(s.it, row, imm_index(s.it, t)), b.rem(s.it, row, imm_index(s.it, t))};
}

// Element offset of row `pos` of entry `entry` in a tensor of `t` rows an entry and n columns.
Reg row_first(KernelBuilder& b, const Sizes& s, Operand entry, Operand pos, int64_t t, int64_t n) {
  if (!s.heads_inside) return b.mul(s.it, b.mad(s.it, entry, imm_index(s.it, t), pos), imm_index(s.it, n));
  Reg batch = b.div(s.it, entry, imm_index(s.it, s.heads)), head = b.rem(s.it, entry, imm_index(s.it, s.heads));
  Reg row = b.mad(s.it, b.mad(s.it, batch, imm_index(s.it, t), pos), imm_index(s.it, s.heads), head);
  return b.mul(s.it, row, imm_index(s.it, n));
}

std::vector<Reg> zeros(KernelBuilder& b, size_t n) {
  std::vector<Reg> z;
  for (size_t j = 0; j < n; ++j) z.push_back(b.mov(Type::f32, imm_f32(0.0f)));
  return z;
}

sim::Dim3 grid_for(int64_t rows) { return {static_cast<uint32_t>((rows + kWarps - 1) / kWarps), 1, 1}; }

LoweredOp lower_attention(const Circuit& c, const Op& op) {
  require_gpu_dtypes(c, op);
  const AttentionParams a = AttentionParams::of(op);
  const Sizes s = sizes_of(c, op);
  const int64_t rows = s.entries * s.tq;
  KernelBuilder b("kiln_attention");
  Reg q = b.param("q", Type::u64), k = b.param("k", Type::u64), v = b.param("v", Type::u64);
  Reg o = b.param("o", Type::u64), lse = b.param("lse", Type::u64);
  const WarpRow w = warp_row(b, s, rows);
  b.if_(w.in_range, [&] {
    auto [entry, i] = entry_and_position(b, s, w.row, s.tq);
    std::vector<Reg> qi = load_row(b, s, q, row_first(b, s, entry, i, s.tq, s.d), w.lane, s.d,
                                   static_cast<float>(a.scale));
    auto key_row = [&](Operand j, Reg base, int64_t n) {
      return load_row(b, s, base, row_first(b, s, entry, j, s.tk, n), w.lane, n);
    };
    // Key 0 (every query sees it) starts the running max, sum and output.
    Reg m = b.mov(Type::f32, warp_dot(b, qi, key_row(imm_index(s.it, 0), k, s.d)));
    Reg l = b.mov(Type::f32, imm_f32(1.0f));
    std::vector<Reg> acc;
    for (Reg x : key_row(imm_index(s.it, 0), v, s.dv)) acc.push_back(b.mov(Type::f32, x));
    Operand end = a.causal ? Operand(b.add(s.it, i, imm_index(s.it, 1))) : imm_index(s.it, s.tk);
    b.for_(imm_index(s.it, 1), end, imm_index(s.it, 1), [&](Reg j) {
      Reg score = warp_dot(b, qi, key_row(j, k, s.d));
      Reg m_new = b.max(Type::f32, m, score);
      Reg keep = exp_of(b, b.sub(Type::f32, m, m_new)), p = exp_of(b, b.sub(Type::f32, score, m_new));
      b.assign(kir::Opc::Fma, l, {l, keep, p});
      accumulate(b, acc, p, key_row(j, v, s.dv), keep);
      b.set(m, m_new);
    });
    Reg inv = b.div(Type::f32, imm_f32(1.0f), l);
    for (Reg& x : acc) x = b.mul(Type::f32, x, inv);
    store_row(b, s, o, row_first(b, s, entry, i, s.tq, s.dv), w.lane, s.dv, acc);
    b.if_(b.setp(Cmp::eq, w.lane, imm_u32(0)), [&] {
      Reg log_l = emit_scalar_exp(b, se::log(se::in(0)), {l});
      b.st(Space::global, Type::f32, b.address(lse, w.row, 4), b.add(Type::f32, m, log_l));
    });
  });
  LoweredOp lo = single_launch(
      finish_launch(b, "kiln_attention", grid_for(rows), {32 * kWarps, 1, 1},
                    {kIn0, kIn1, kIn2, kOut0, {ArgRef::Kind::Output, 1}}),
      std::string("attention") + (a.causal ? " (causal)" : "") +
          ": a warp per query row, keys one at a time, online softmax, o and the row log-sum-exp written");
  return lo;
}

LoweredOp lower_attention_grad(const Circuit& c, const Op& op) {
  require_gpu_dtypes(c, op);
  const AttentionParams a = AttentionParams::of(op);
  const Sizes s = sizes_of(c, op);
  const bool has_dlse = op.inputs.size() == 7;
  const float scale = static_cast<float>(a.scale);
  LoweredOp lo;
  lo.scratch_bytes = {static_cast<size_t>(s.entries * s.tq) * 4};  // D, a value per query row

  // Launch 1: a warp per query row; D, then dq.
  {
    const int64_t rows = s.entries * s.tq;
    KernelBuilder b("kiln_attention_grad_q");
    Reg q = b.param("q", Type::u64), k = b.param("k", Type::u64), v = b.param("v", Type::u64);
    Reg o = b.param("o", Type::u64), lse = b.param("lse", Type::u64), d_o = b.param("do", Type::u64);
    Reg dlse = has_dlse ? b.param("dlse", Type::u64) : Reg{};
    Reg dq = b.param("dq", Type::u64), dd = b.param("D", Type::u64);
    std::vector<ArgRef> args = {kIn0, kIn1, kIn2, {ArgRef::Kind::Input, 3}, {ArgRef::Kind::Input, 4},
                                {ArgRef::Kind::Input, 5}};
    if (has_dlse) args.push_back({ArgRef::Kind::Input, 6});
    args.push_back(kOut0);
    args.push_back({ArgRef::Kind::Scratch, 0});
    const WarpRow w = warp_row(b, s, rows);
    b.if_(w.in_range, [&] {
      auto [entry, i] = entry_and_position(b, s, w.row, s.tq);
      std::vector<Reg> qi = load_row(b, s, q, row_first(b, s, entry, i, s.tq, s.d), w.lane, s.d, scale);
      Reg vrow = row_first(b, s, entry, i, s.tq, s.dv);
      std::vector<Reg> doi = load_row(b, s, d_o, vrow, w.lane, s.dv);
      Reg row_d = warp_dot(b, doi, load_row(b, s, o, vrow, w.lane, s.dv));
      if (has_dlse) row_d = b.sub(Type::f32, row_d, b.ld(Space::global, Type::f32, b.address(dlse, w.row, 4)));
      b.if_(b.setp(Cmp::eq, w.lane, imm_u32(0)), [&] { b.st(Space::global, Type::f32, b.address(dd, w.row, 4), row_d); });
      Reg lse_i = b.ld(Space::global, Type::f32, b.address(lse, w.row, 4));
      std::vector<Reg> acc = zeros(b, qi.size());
      Operand end = a.causal ? Operand(b.add(s.it, i, imm_index(s.it, 1))) : imm_index(s.it, s.tk);
      b.for_(imm_index(s.it, 0), end, imm_index(s.it, 1), [&](Reg j) {
        std::vector<Reg> kj = load_row(b, s, k, row_first(b, s, entry, j, s.tk, s.d), w.lane, s.d);
        std::vector<Reg> vj = load_row(b, s, v, row_first(b, s, entry, j, s.tk, s.dv), w.lane, s.dv);
        Reg p = exp_of(b, b.sub(Type::f32, warp_dot(b, qi, kj), lse_i));
        Reg ds = b.mul(Type::f32, p, b.sub(Type::f32, warp_dot(b, doi, vj), row_d));
        accumulate(b, acc, ds, kj);
      });
      store_row(b, s, dq, row_first(b, s, entry, i, s.tq, s.d), w.lane, s.d, acc, scale);
    });
    lo.launches.push_back(finish_launch(b, "kiln_attention_grad_q", grid_for(rows), {32 * kWarps, 1, 1}, args));
  }
  // Launch 2: a warp per key row; dk and dv over the queries that see the key.
  {
    const int64_t rows = s.entries * s.tk;
    KernelBuilder b("kiln_attention_grad_kv");
    Reg q = b.param("q", Type::u64), k = b.param("k", Type::u64), v = b.param("v", Type::u64);
    Reg lse = b.param("lse", Type::u64), d_o = b.param("do", Type::u64), dd = b.param("D", Type::u64);
    Reg dk = b.param("dk", Type::u64), dv = b.param("dv", Type::u64);
    const WarpRow w = warp_row(b, s, rows);
    b.if_(w.in_range, [&] {
      auto [entry, j] = entry_and_position(b, s, w.row, s.tk);
      std::vector<Reg> kj = load_row(b, s, k, row_first(b, s, entry, j, s.tk, s.d), w.lane, s.d, scale);
      std::vector<Reg> vj = load_row(b, s, v, row_first(b, s, entry, j, s.tk, s.dv), w.lane, s.dv);
      Reg query0 = b.mul(s.it, entry, imm_index(s.it, s.tq));
      std::vector<Reg> acc_k = zeros(b, kj.size()), acc_v = zeros(b, vj.size());
      Operand begin = a.causal ? Operand(j) : imm_index(s.it, 0);
      b.for_(begin, imm_index(s.it, s.tq), imm_index(s.it, 1), [&](Reg i) {
        Reg qi_at = b.add(s.it, query0, i);
        std::vector<Reg> qi = load_row(b, s, q, row_first(b, s, entry, i, s.tq, s.d), w.lane, s.d);
        std::vector<Reg> doi = load_row(b, s, d_o, row_first(b, s, entry, i, s.tq, s.dv), w.lane, s.dv);
        Reg lse_i = b.ld(Space::global, Type::f32, b.address(lse, qi_at, 4));
        Reg d_i = b.ld(Space::global, Type::f32, b.address(dd, qi_at, 4));
        Reg p = exp_of(b, b.sub(Type::f32, warp_dot(b, qi, kj), lse_i));
        accumulate(b, acc_v, p, doi);
        Reg ds = b.mul(Type::f32, p, b.sub(Type::f32, warp_dot(b, doi, vj), d_i));
        accumulate(b, acc_k, ds, qi);
      });
      store_row(b, s, dk, row_first(b, s, entry, j, s.tk, s.d), w.lane, s.d, acc_k, scale);
      store_row(b, s, dv, row_first(b, s, entry, j, s.tk, s.dv), w.lane, s.dv, acc_v);
    });
    lo.launches.push_back(finish_launch(b, "kiln_attention_grad_kv", grid_for(rows), {32 * kWarps, 1, 1},
                                        {kIn0, kIn1, kIn2, {ArgRef::Kind::Input, 4}, {ArgRef::Kind::Input, 5},
                                         {ArgRef::Kind::Scratch, 0}, {ArgRef::Kind::Output, 1},
                                         {ArgRef::Kind::Output, 2}}));
  }
  lo.summary = std::string("attention_grad") + (a.causal ? " (causal)" : "") +
               ": a warp per query row (D, dq), then a warp per key row (dk, dv), probabilities recomputed from "
               "the row log-sum-exp, no atomics, " +
               launch_text(lo.launches[0]) + "; " + launch_text(lo.launches[1]);
  return lo;
}

}  // namespace

void register_attention_lowering(LoweringTable& t) {
  t.add(PrimId::attention, lower_attention, "warp per query row, online softmax, no (T, T) matrix");
  t.add(PrimId::attention_grad, lower_attention_grad,
        "warp per query row (dq), then warp per key row (dk, dv), probabilities recomputed, no atomics");
}

}  // namespace kiln::cuda
