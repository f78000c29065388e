// Lowering of attention and attention_grad (circuit/prims/attention.cpp), f32 (with bf16
// operands, q, k, v and do rounded to bf16 where they are loaded: product_operand). A warp per row,
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
// An additive mask is read where a score is formed (masked), clamped into its bounds for the
// rows and keys past the ends; where it hides every key seen so far, the online softmax takes 0
// for the running max (softmax_max) so that exp(-inf - -inf) never appears.
// Dropout on the probabilities (keep < 1): each kernel recomputes the factor of probability
// (row, key) from the op's Philox stream, the reference's bits, where it uses it (dropout_factor),
// so no mask is stored.
// Every loop bound depends on the row alone, so it is uniform across a warp and the shuffles
// never see a partial warp. Sums are f32, over the head size in a fixed butterfly order and over
// keys in key order.
#include <cmath>

#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/attention_kernels.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;
using kir::SReg;

namespace attention_detail {

constexpr uint32_t kWarps = 4;  // rows a block

// Bit jj set where key key0 + jj (jj < kTileKeys) of a row is kept: computed once a tile, where
// few registers are live, with one Philox call per four keys where tk is a multiple of 4 (key0
// is one of the tile size, so four keys are one block), else one per key.
Reg tile_keep_bits(KernelBuilder& b, const Sizes& s, const Stream& st, Reg row, Reg key0, int64_t keys) {
  Reg mask = b.mov(Type::u32, imm_u32(0));
  auto set_bit = [&](Reg keep, int64_t jj) {
    b.assign(kir::Opc::Or, mask, {mask, b.selp(Type::u32, imm_u32(1u << jj), imm_u32(0), keep)});
  };
  for (int64_t jj = 0; jj < keys; jj += 4) {
    Reg first = b.add(s.it, key0, imm_index(s.it, jj));
    if (s.tk % 4 == 0) {
      std::vector<Reg> words = stream_words(b, st, stream_element(b, s, row, first));
      for (int64_t e = 0; e < 4; ++e) set_bit(kept(b, s, words[static_cast<size_t>(e)]), jj + e);
    } else {
      for (int64_t e = 0; e < 4; ++e)
        set_bit(kept(b, s, stream_bits(b, s, st, row, b.add(s.it, first, imm_index(s.it, e)))), jj + e);
    }
  }
  return mask;
}
// x times a dropout factor (x itself without dropout).
Reg times(KernelBuilder& b, Reg x, Reg factor) { return factor.valid() ? b.mul(Type::f32, x, factor) : x; }

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

// x as the products read it: rounded to bf16 with bf16 operands (cvt.rn.bf16.f32, then exact).
Reg product_operand(KernelBuilder& b, const Sizes& s, Reg x) {
  return s.bf16 ? b.cvt(Type::f32, b.cvt(Type::bf16, x)) : x;
}
// x (a loaded element) as a product operand (`operand`) or as it is, times `factor`.
Reg loaded(KernelBuilder& b, const Sizes& s, Reg x, bool operand, float factor) {
  if (operand) x = product_operand(b, s, x);
  return factor == 1.0f ? x : b.mul(Type::f32, x, imm_f32(factor));
}

// This lane's columns of a row vector of n elements at element offset `first` of `base`:
// column lane + 32 j in register j (zero past n), as a product operand (q, k, v, do) or not (o).
std::vector<Reg> load_row(KernelBuilder& b, const Sizes& s, Reg base, Reg first, Reg lane, int64_t n, bool operand,
                          float factor = 1.0f) {
  std::vector<Reg> out;
  Reg lane_it = s.it == Type::u32 ? lane : b.cvt(Type::u64, lane);
  for (int64_t j = 0; 32 * j < n; ++j) {
    Reg at = b.add(s.it, first, b.add(s.it, lane_it, imm_index(s.it, 32 * j)));
    Reg x = b.mov(Type::f32, imm_f32(0.0f));
    auto load = [&] {
      b.set(x, loaded(b, s, b.ld(Space::global, Type::f32, b.address(base, at, 4)), operand, factor));
    };
    if (32 * (j + 1) <= n)
      load();
    else
      b.if_(b.setp(Cmp::lt, lane, imm_u32(static_cast<uint32_t>(n - 32 * j))), load);
    out.push_back(x);
  }
  return out;
}

void store_row(KernelBuilder& b, const Sizes& s, Reg base, Reg copy, Reg first, Reg lane, int64_t n,
               const std::vector<Reg>& x, float factor = 1.0f) {
  Reg lane_it = s.it == Type::u32 ? lane : b.cvt(Type::u64, lane);
  for (int64_t j = 0; 32 * j < n; ++j) {
    Reg at = b.add(s.it, first, b.add(s.it, lane_it, imm_index(s.it, 32 * j)));
    auto store = [&] {
      Reg v = factor == 1.0f ? x[static_cast<size_t>(j)] : b.mul(Type::f32, x[static_cast<size_t>(j)], imm_f32(factor));
      b.st(Space::global, Type::f32, b.address(base, at, 4), v);
      store_copy(b, copy, at, v);
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
    b.assign(kir::Opc::Fma, acc[j],
             {w, x[j], keep.valid() ? Operand(b.mul(Type::f32, acc[j], keep)) : Operand(acc[j])});
}

// Rows [entry * t, entry * t + t) for a row index of `t` rows an entry: the row's entry, and its
// position within the entry.
Reg entry_of(KernelBuilder& b, const Sizes& s, Reg row, int64_t t) { return b.div(s.it, row, imm_index(s.it, t)); }
Reg position_of(KernelBuilder& b, const Sizes& s, Reg row, int64_t t) { return b.rem(s.it, row, imm_index(s.it, t)); }

std::vector<Reg> zeros(KernelBuilder& b, size_t n) {
  std::vector<Reg> z;
  for (size_t j = 0; j < n; ++j) z.push_back(b.mov(Type::f32, imm_f32(0.0f)));
  return z;
}

kir::Dim3 grid_for(int64_t rows) { return {static_cast<uint32_t>((rows + kWarps - 1) / kWarps), 1, 1}; }

// The tiled forward: a thread per query row, 64 rows a block (one (batch, head) entry each),
// keys in tiles of 32 staged in shared memory by the whole block (16-byte copies), every thread
// reading the same key at a time (a broadcast, no bank conflict). q and the output accumulator
// stay in the thread's registers, so head sizes up to 64 (multiples of 4) take this path.
constexpr int64_t kTileRows = 64, kTileKeys = 32;

bool tiled_forward(const Sizes& s) {
  return s.d > 0 && s.dv > 0 && s.d <= 64 && s.dv <= 64 && s.d % 4 == 0 && s.dv % 4 == 0 &&
         (s.tq + kTileRows - 1) / kTileRows <= 65535;
}

// Rows [j0, j0 + rows) of `entry` in a tensor of t rows an entry, n floats each (zeros past
// t), into shared memory at `smem` (row-major, n floats a row); the block's kTileRows threads
// copy 16 bytes at a time.
void stage_rows(KernelBuilder& b, const Sizes& s, Reg base, const Piece& piece, Reg entry, Reg j0, int64_t t, int64_t n,
                Reg smem, Reg tid, int64_t rows = kTileKeys) {
  const int64_t chunks = rows * n / 4;
  const auto per_row = static_cast<uint32_t>(n / 4);
  for (int64_t first = 0; first < chunks; first += kTileRows) {
    Reg idx = b.add(Type::u32, tid, imm_u32(static_cast<uint32_t>(first)));
    auto copy = [&] {
      Reg row = b.div(Type::u32, idx, imm_u32(per_row)),
          col = b.mul(Type::u32, b.rem(Type::u32, idx, imm_u32(per_row)), imm_u32(4));
      Reg key = b.add(s.it, j0, in_index_type(b, s, row));
      std::vector<Reg> vals = zeros(b, 4);
      b.if_(b.setp(Cmp::lt, key, imm_index(s.it, t)), [&] {
        Reg at = b.add(s.it, row_first(b, s, entry, key, t, n, piece), in_index_type(b, s, col));
        std::vector<Reg> x = b.ld_vec(Space::global, Type::f32, b.address(base, at, 4), 4);
        for (size_t e = 0; e < 4; ++e) b.set(vals[e], product_operand(b, s, x[e]));  // every staged row is one
      });
      b.st_vec(Space::shared, Type::f32, b.mad(Type::u32, idx, imm_u32(16), smem),
               {vals[0], vals[1], vals[2], vals[3]});
    };
    if (first + kTileRows <= chunks)
      copy();
    else
      b.if_(b.setp(Cmp::lt, idx, imm_u32(static_cast<uint32_t>(chunks))), copy);
  }
}

// One thread's whole row of n floats (n a multiple of 4) at element `first`, as a product operand
// or not, times `factor`.
std::vector<Reg> load_own_row(KernelBuilder& b, const Sizes& s, Reg base, Reg first, int64_t n, bool operand,
                              float factor = 1.0f) {
  std::vector<Reg> out;
  for (int64_t c4 = 0; c4 < n; c4 += 4)
    for (Reg x : b.ld_vec(Space::global, Type::f32, b.address(base, first, 4), 4, 4 * c4))
      out.push_back(loaded(b, s, x, operand, factor));
  return out;
}
void store_own_row(KernelBuilder& b, Reg base, Reg copy, Reg first, const std::vector<Reg>& x, float factor = 1.0f) {
  for (size_t c4 = 0; c4 < x.size(); c4 += 4) {
    std::vector<Reg> v;
    for (size_t e = 0; e < 4; ++e)
      v.push_back(factor == 1.0f ? x[c4 + e] : b.mul(Type::f32, x[c4 + e], imm_f32(factor)));
    b.st_vec(Space::global, Type::f32, b.address(base, first, 4), {v[0], v[1], v[2], v[3]},
             static_cast<int64_t>(4 * c4));
    if (copy.valid())
      for (size_t e = 0; e < 4; ++e)
        store_copy(b, copy, b.add(first.type, first, imm_index(first.type, static_cast<int64_t>(c4 + e))), v[e]);
  }
}
// sum_c x[c] * row[c] over a shared row of x.size() floats at byte offset `at` of `smem`.
Reg dot_shared(KernelBuilder& b, const std::vector<Reg>& x, Reg smem, int64_t at) {
  Reg dot = b.mov(Type::f32, imm_f32(0.0f));
  for (size_t c4 = 0; c4 < x.size(); c4 += 4) {
    std::vector<Reg> r = b.ld_vec(Space::shared, Type::f32, smem, 4, at + static_cast<int64_t>(4 * c4));
    for (size_t e = 0; e < 4; ++e) b.assign(kir::Opc::Fma, dot, {x[c4 + e], r[e], dot});
  }
  return dot;
}
// A thread's own row vector kept in shared memory as a column: element c of thread t at
// own + 4 (kTileRows c) bytes from the array's start (consecutive threads, consecutive banks),
// where registers would not hold it beside the accumulators.
Reg store_own_column(KernelBuilder& b, int array, Reg tid, const std::vector<Reg>& x) {
  Reg own = b.mad(Type::u32, tid, imm_u32(4), b.shared_addr(array));
  for (size_t c = 0; c < x.size(); ++c)
    b.st(Space::shared, Type::f32, own, x[c], static_cast<int64_t>(4 * kTileRows * c));
  return own;
}
// sum_c row[c] * own[c]: a shared row of n floats (broadcast) against the thread's own column.
Reg dot_own_column(KernelBuilder& b, Reg row, Reg own, int64_t n) {
  Reg dot = b.mov(Type::f32, imm_f32(0.0f));
  for (int64_t c4 = 0; c4 < n; c4 += 4) {
    std::vector<Reg> r = b.ld_vec(Space::shared, Type::f32, row, 4, 4 * c4);
    for (int64_t e = 0; e < 4; ++e)
      b.assign(kir::Opc::Fma, dot,
               {r[static_cast<size_t>(e)], b.ld(Space::shared, Type::f32, own, 4 * kTileRows * (c4 + e)), dot});
  }
  return dot;
}
// acc[c] += w * row[c] over a shared row at byte offset `at` of `smem`.
void axpy_shared(KernelBuilder& b, std::vector<Reg>& acc, Reg w, Reg smem, int64_t at) {
  for (size_t c4 = 0; c4 < acc.size(); c4 += 4) {
    std::vector<Reg> r = b.ld_vec(Space::shared, Type::f32, smem, 4, at + static_cast<int64_t>(4 * c4));
    for (size_t e = 0; e < 4; ++e) b.assign(kir::Opc::Fma, acc[c4 + e], {w, r[e], acc[c4 + e]});
  }
}

// A tiled kernel's query row: the block's entry (ctaid.x) and tile of kTileRows rows (ctaid.y),
// this thread's row i (valid below tq), the keys the row sees ([0, limit)) and the keys the
// block stages ([0, key_end): all of them, or under the mask those its last row sees).
struct QueryRow {
  Reg tid, entry, kv_entry, tile, i, valid, limit;
  Operand key_end;
};
QueryRow query_row(KernelBuilder& b, const Sizes& s, const AttentionParams& a) {
  QueryRow r;
  r.tid = b.sreg(SReg::tid_x);
  r.entry = in_index_type(b, s, b.sreg(SReg::ctaid_x));
  r.tile = in_index_type(b, s, b.sreg(SReg::ctaid_y));
  r.kv_entry = kv_entry_of(b, s, r.entry);
  r.i = b.mad(s.it, r.tile, imm_index(s.it, kTileRows), in_index_type(b, s, r.tid));
  r.valid = b.setp(Cmp::lt, r.i, imm_index(s.it, s.tq));
  r.limit = a.causal ? b.min(s.it, b.add(s.it, r.i, imm_index(s.it, 1)), imm_index(s.it, s.tk))
                     : b.mov(s.it, imm_index(s.it, s.tk));
  r.key_end =
      a.causal ? Operand(b.min(s.it, b.mul(s.it, b.add(s.it, r.tile, imm_index(s.it, 1)), imm_index(s.it, kTileRows)),
                               imm_index(s.it, s.tk)))
               : imm_index(s.it, s.tk);
  return r;
}

LoweredOp lower_attention_tiled(const AttentionParams& a, const Sizes& s) {
  KernelBuilder b("kiln_attention_tiled");
  const ForwardParams f = forward_params(b, s);
  const Reg q = f.q, k = f.k, v = f.v, o = f.o, lse = f.lse;
  Reg k_smem = b.shared_addr(b.shared_array("k_tile", kTileKeys * s.d * 4));
  Reg v_smem = b.shared_addr(b.shared_array("v_tile", kTileKeys * s.dv * 4));
  const QueryRow r = query_row(b, s, a);
  const Reg tid = r.tid, entry = r.entry, kv_entry = r.kv_entry, i = r.i, valid = r.valid, limit = r.limit;
  // q, scaled, in registers (zeros for the rows past tq, which compute unused values).
  std::vector<Reg> qv = zeros(b, static_cast<size_t>(s.d));
  b.if_(valid, [&] {
    Reg first = row_first(b, s, entry, i, s.tq, s.d, s.q);
    for (int64_t c4 = 0; c4 < s.d; c4 += 4) {
      std::vector<Reg> x = b.ld_vec(Space::global, Type::f32, b.address(q, first, 4), 4, 4 * c4);
      for (int64_t e = 0; e < 4; ++e)
        b.set(qv[static_cast<size_t>(c4 + e)],
              loaded(b, s, x[static_cast<size_t>(e)], true, static_cast<float>(a.scale)));
    }
  });
  Reg m = b.mov(Type::f32, imm_f32(-INFINITY)), l = b.mov(Type::f32, imm_f32(0.0f));
  std::vector<Reg> acc = zeros(b, static_cast<size_t>(s.dv));
  Reg row = b.mad(s.it, entry, imm_index(s.it, s.tq), i);
  const Reg mask_at = s.mask ? mask_row(b, s, mask_base(b, s, entry), i) : Reg{};
  b.for_(imm_index(s.it, 0), r.key_end, imm_index(s.it, kTileKeys), [&](Reg j0) {
    b.bar();  // the previous tile's readers are done
    stage_rows(b, s, k, s.k, kv_entry, j0, s.tk, s.d, k_smem, tid);
    stage_rows(b, s, v, s.v, kv_entry, j0, s.tk, s.dv, v_smem, tid);
    b.bar();
    const Reg keep_bits = f.stream.on() ? tile_keep_bits(b, s, f.stream, row, j0, kTileKeys) : Reg{};
    std::vector<Reg> score;
    Reg tile_max = b.mov(Type::f32, imm_f32(-INFINITY));
    for (int64_t jj = 0; jj < kTileKeys; ++jj) {
      Reg dot = b.mov(Type::f32, imm_f32(0.0f));
      for (int64_t c4 = 0; c4 < s.d; c4 += 4) {
        std::vector<Reg> kv = b.ld_vec(Space::shared, Type::f32, k_smem, 4, 4 * (jj * s.d + c4));
        for (int64_t e = 0; e < 4; ++e)
          b.assign(kir::Opc::Fma, dot, {qv[static_cast<size_t>(c4 + e)], kv[static_cast<size_t>(e)], dot});
      }
      Reg key = b.add(s.it, j0, imm_index(s.it, jj));
      Reg seen = b.setp(Cmp::lt, key, limit);
      score.push_back(b.selp(Type::f32, masked(b, s, f.mask, mask_at, dot, key), imm_f32(-INFINITY), seen));
      tile_max = b.max(Type::f32, tile_max, score.back());
    }
    Reg m_new = b.max(Type::f32, m, tile_max), m_use = softmax_max(b, s, m_new);
    Reg keep = exp_of(b, b.sub(Type::f32, m, m_use));
    b.assign(kir::Opc::Mul, l, {l, keep});
    for (Reg& x : acc) b.assign(kir::Opc::Mul, x, {x, keep});
    for (int64_t jj = 0; jj < kTileKeys; ++jj) {
      Reg p = exp_of(b, b.sub(Type::f32, score[static_cast<size_t>(jj)], m_use));
      b.assign(kir::Opc::Add, l, {l, p});
      if (f.stream.on())
        p = b.mul(Type::f32, p,
                  factor_of(b, s, b.setp(Cmp::ne, b.and_(Type::u32, keep_bits, imm_u32(1u << jj)), imm_u32(0))));
      for (int64_t c4 = 0; c4 < s.dv; c4 += 4) {
        std::vector<Reg> vv = b.ld_vec(Space::shared, Type::f32, v_smem, 4, 4 * (jj * s.dv + c4));
        for (int64_t e = 0; e < 4; ++e)
          b.assign(kir::Opc::Fma, acc[static_cast<size_t>(c4 + e)],
                   {p, vv[static_cast<size_t>(e)], acc[static_cast<size_t>(c4 + e)]});
      }
    }
    b.set(m, m_new);
  });
  b.if_(valid, [&] {
    Reg inv = b.div(Type::f32, imm_f32(1.0f), l);
    Reg first = row_first(b, s, entry, i, s.tq, s.dv);
    for (int64_t c4 = 0; c4 < s.dv; c4 += 4) {
      std::vector<Reg> x;
      for (int64_t e = 0; e < 4; ++e) x.push_back(b.mul(Type::f32, acc[static_cast<size_t>(c4 + e)], inv));
      b.st_vec(Space::global, Type::f32, b.address(o, first, 4), {x[0], x[1], x[2], x[3]}, 4 * c4);
      for (int64_t e = 0; e < 4 && f.o_copy.valid(); ++e)
        store_copy(b, f.o_copy, b.add(s.it, first, imm_index(s.it, c4 + e)), x[static_cast<size_t>(e)]);
    }
    b.st(Space::global, Type::f32, b.address(lse, row, 4),
         b.add(Type::f32, m, emit_scalar_exp(b, se::log(se::in(0)), {l})));
  });
  const kir::Dim3 grid{static_cast<uint32_t>(s.entries), static_cast<uint32_t>((s.tq + kTileRows - 1) / kTileRows), 1};
  return single_launch(finish_launch(b, "kiln_attention_tiled", grid, {static_cast<uint32_t>(kTileRows), 1, 1}, f.args),
                       std::string("attention") + (a.causal ? " (causal)" : "") + (a.dropout() ? " (dropout)" : "") +
                           ": a thread per query row, 64 rows a block, keys in shared tiles of 32, online softmax "
                           "a tile at a time, o and the row log-sum-exp written");
}

LoweredOp lower_attention(const Circuit& c, const Op& op, const Target& target) {
  require_gpu_dtypes(c, op);
  const AttentionParams a = AttentionParams::of(op);
  const Sizes s = sizes_of(c, op, target);
  if (mma_attention(a, s, target)) return lower_attention_mma(a, s);
  if (tiled_forward(s)) return lower_attention_tiled(a, s);
  const int64_t rows = s.entries * s.tq;
  KernelBuilder b("kiln_attention");
  const ForwardParams f = forward_params(b, s);
  const Reg q = f.q, k = f.k, v = f.v, o = f.o, lse = f.lse;
  const WarpRow w = warp_row(b, s, rows);
  b.if_(w.in_range, [&] {
    const Reg entry = entry_of(b, s, w.row, s.tq), i = position_of(b, s, w.row, s.tq);
    std::vector<Reg> qi =
        load_row(b, s, q, row_first(b, s, entry, i, s.tq, s.d, s.q), w.lane, s.d, true, static_cast<float>(a.scale));
    const Reg kv_entry = kv_entry_of(b, s, entry);
    auto key_row = [&](Operand j, Reg base, int64_t n, const Piece& piece) {
      return load_row(b, s, base, row_first(b, s, kv_entry, j, s.tk, n, piece), w.lane, n, true);
    };
    // The running max, sum and output start empty (key 0's rescale exp(-inf - m) is 0); with a
    // mask, softmax_max keeps a row whose keys so far are all hidden at 0 and l at 0.
    const Reg mask_at = s.mask ? mask_row(b, s, mask_base(b, s, entry), i) : Reg{};
    Reg m = b.mov(Type::f32, imm_f32(-INFINITY)), l = b.mov(Type::f32, imm_f32(0.0f));
    std::vector<Reg> acc = zeros(b, static_cast<size_t>((s.dv + 31) / 32));
    Operand end = a.causal ? Operand(b.add(s.it, i, imm_index(s.it, 1))) : imm_index(s.it, s.tk);
    b.for_(imm_index(s.it, 0), end, imm_index(s.it, 1), [&](Reg j) {
      Reg score = masked(b, s, f.mask, mask_at, warp_dot(b, qi, key_row(j, k, s.d, s.k)), j);
      Reg m_new = b.max(Type::f32, m, score), m_use = softmax_max(b, s, m_new);
      Reg keep = exp_of(b, b.sub(Type::f32, m, m_use)), p = exp_of(b, b.sub(Type::f32, score, m_use));
      b.assign(kir::Opc::Fma, l, {l, keep, p});
      accumulate(b, acc, times(b, p, dropout_factor(b, s, f.stream, w.row, j)), key_row(j, v, s.dv, s.v), keep);
      b.set(m, m_new);
    });
    Reg inv = b.div(Type::f32, imm_f32(1.0f), l);
    for (Reg& x : acc) x = b.mul(Type::f32, x, inv);
    store_row(b, s, o, f.o_copy, row_first(b, s, entry, i, s.tq, s.dv), w.lane, s.dv, acc);
    b.if_(b.setp(Cmp::eq, w.lane, imm_u32(0)), [&] {
      Reg log_l = emit_scalar_exp(b, se::log(se::in(0)), {l});
      b.st(Space::global, Type::f32, b.address(lse, w.row, 4), b.add(Type::f32, m, log_l));
    });
  });
  LoweredOp lo = single_launch(
      finish_launch(b, "kiln_attention", grid_for(rows), {32 * kWarps, 1, 1}, f.args),
      std::string("attention") + (a.causal ? " (causal)" : "") + (a.dropout() ? " (dropout)" : "") +
          ": a warp per query row, keys one at a time, online softmax, o and the row log-sum-exp written");
  return lo;
}

// The tiled backward, the forward's layout, two launches:
//  1. a thread per query row (64 a block): D = rowsum(do * o) - dlse (to scratch), then over
//     tiles of 32 keys and values in shared memory p = exp(s - lse), ds = p (do . v - D),
//     dq += ds k;
//     q waits in a shared column of the thread's own (store_own_column), do and dq in registers;
//  2. a thread per key row (64 a block): its k (scaled) and v in shared columns of its own, over
//     tiles of 16 queries (q, do, lse and D in shared memory) dv += p do, dk += ds q, the two
//     accumulators in registers.
LoweredOp lower_attention_grad_tiled(const Op& op, const AttentionParams& a, const Sizes& s) {
  const bool has_dlse = static_cast<int>(op.inputs.size()) == s.rest + 4;
  const float scale = static_cast<float>(a.scale);
  LoweredOp lo;
  lo.scratch_bytes = {static_cast<size_t>(s.entries * s.tq) * 4};  // D, a value per query row
  {
    KernelBuilder b("kiln_attention_grad_q_tiled");
    const GradQParams g = grad_q_params(b, s, has_dlse);
    const Reg q = g.q, k = g.k, v = g.v, o = g.o, lse = g.lse, d_o = g.d_o, dlse = g.dlse, dq = g.dq, dd = g.dd;
    Reg k_smem = b.shared_addr(b.shared_array("k_tile", kTileKeys * s.d * 4));
    Reg v_smem = b.shared_addr(b.shared_array("v_tile", kTileKeys * s.dv * 4));
    const int q_columns = b.shared_array("q_columns", s.d * kTileRows * 4);
    const QueryRow r = query_row(b, s, a);
    const Reg tid = r.tid, entry = r.entry, kv_entry = r.kv_entry, i = r.i, valid = r.valid, limit = r.limit;
    Reg row = b.mad(s.it, entry, imm_index(s.it, s.tq), i);
    std::vector<Reg> qv = zeros(b, static_cast<size_t>(s.d)), dov = zeros(b, static_cast<size_t>(s.dv));
    Reg row_d = b.mov(Type::f32, imm_f32(0.0f)), lse_i = b.mov(Type::f32, imm_f32(0.0f));
    b.if_(valid, [&] {
      std::vector<Reg> x = load_own_row(b, s, q, row_first(b, s, entry, i, s.tq, s.d, s.q), s.d, true, scale);
      for (size_t c = 0; c < x.size(); ++c) b.set(qv[c], x[c]);
      Reg vfirst = row_first(b, s, entry, i, s.tq, s.dv);
      std::vector<Reg> y = load_own_row(b, s, d_o, vfirst, s.dv, false), z = load_own_row(b, s, o, vfirst, s.dv, false);
      for (size_t c = 0; c < y.size(); ++c) {  // D from do itself, the products from do as an operand
        b.set(dov[c], product_operand(b, s, y[c]));
        b.assign(kir::Opc::Fma, row_d, {y[c], z[c], row_d});
      }
      if (has_dlse) b.assign(kir::Opc::Sub, row_d, {row_d, b.ld(Space::global, Type::f32, b.address(dlse, row, 4))});
      b.st(Space::global, Type::f32, b.address(dd, row, 4), row_d);
      b.set(lse_i, b.ld(Space::global, Type::f32, b.address(lse, row, 4)));
    });
    Reg q_own = store_own_column(b, q_columns, tid, qv);  // read after the loop's first barrier
    const Reg mask_at = s.mask ? mask_row(b, s, mask_base(b, s, entry), i) : Reg{};
    std::vector<Reg> acc = zeros(b, static_cast<size_t>(s.d));
    b.for_(imm_index(s.it, 0), r.key_end, imm_index(s.it, kTileKeys), [&](Reg j0) {
      b.bar();
      stage_rows(b, s, k, s.k, kv_entry, j0, s.tk, s.d, k_smem, tid);
      stage_rows(b, s, v, s.v, kv_entry, j0, s.tk, s.dv, v_smem, tid);
      b.bar();
      // A loop, not unrolled (two row vectors live in registers already); q from its column.
      b.for_(imm_u32(0), imm_u32(static_cast<uint32_t>(kTileKeys)), imm_u32(1), [&](Reg jj) {
        Reg seen = b.setp(Cmp::lt, b.add(s.it, j0, in_index_type(b, s, jj)), limit);
        Reg k_row = b.mad(Type::u32, jj, imm_u32(static_cast<uint32_t>(4 * s.d)), k_smem);
        Reg v_row = b.mad(Type::u32, jj, imm_u32(static_cast<uint32_t>(4 * s.dv)), v_smem);
        Reg key = b.add(s.it, j0, in_index_type(b, s, jj));
        Reg score = masked(b, s, g.mask, mask_at, dot_own_column(b, k_row, q_own, s.d), key);
        Reg p = b.selp(Type::f32, exp_of(b, b.sub(Type::f32, score, lse_i)), imm_f32(0.0f), seen);
        Reg dp = times(b, dot_shared(b, dov, v_row, 0), dropout_factor(b, s, g.stream, row, key));
        Reg ds = b.mul(Type::f32, p, b.sub(Type::f32, dp, row_d));
        axpy_shared(b, acc, ds, k_row, 0);
      });
    });
    b.if_(valid, [&] { store_own_row(b, dq, g.dq_copy, row_first(b, s, entry, i, s.tq, s.d, s.q), acc, scale); });
    const kir::Dim3 grid{static_cast<uint32_t>(s.entries), static_cast<uint32_t>((s.tq + kTileRows - 1) / kTileRows),
                         1};
    lo.launches.push_back(
        finish_launch(b, "kiln_attention_grad_q_tiled", grid, {static_cast<uint32_t>(kTileRows), 1, 1}, g.args));
  }
  {
    KernelBuilder b("kiln_attention_grad_kv_tiled");
    const GradKvParams g = grad_kv_params(b, s);
    const Reg q = g.q, k = g.k, v = g.v, lse = g.lse, d_o = g.d_o, dd = g.dd, dk = g.dk, dv = g.dv, mask = g.mask;
    const Stream stream = g.stream;
    // Queries in tiles of 16: with both own columns, 40 KiB of shared memory at head size 64.
    constexpr int64_t kQueries = kTileKeys / 2;
    Reg q_smem = b.shared_addr(b.shared_array("q_tile", kQueries * s.d * 4));
    Reg do_smem = b.shared_addr(b.shared_array("do_tile", kQueries * s.dv * 4));
    const int k_columns = b.shared_array("k_columns", s.d * kTileRows * 4);
    const int v_columns = b.shared_array("v_columns", s.dv * kTileRows * 4);
    Reg row_smem = b.shared_addr(b.shared_array("lse_and_d", 2 * kQueries * 4));
    Reg tid = b.sreg(SReg::tid_x);
    Reg entry = in_index_type(b, s, b.sreg(SReg::ctaid_x)), tile = in_index_type(b, s, b.sreg(SReg::ctaid_y));
    Reg j = b.mad(s.it, tile, imm_index(s.it, kTileRows), in_index_type(b, s, tid));
    Reg valid = b.setp(Cmp::lt, j, imm_index(s.it, s.tk));
    std::vector<Reg> kv = zeros(b, static_cast<size_t>(s.d)), vv = zeros(b, static_cast<size_t>(s.dv));
    b.if_(valid, [&] {
      std::vector<Reg> x = load_own_row(b, s, k, row_first(b, s, entry, j, s.tk, s.d, s.k), s.d, true, scale);
      for (size_t c = 0; c < x.size(); ++c) b.set(kv[c], x[c]);
      std::vector<Reg> y = load_own_row(b, s, v, row_first(b, s, entry, j, s.tk, s.dv, s.v), s.dv, true);
      for (size_t c = 0; c < y.size(); ++c) b.set(vv[c], y[c]);
    });
    Reg k_own = store_own_column(b, k_columns, tid, kv), v_own = store_own_column(b, v_columns, tid, vv);
    // Queries that see this block's keys: from the block's first key (causal) or 0.
    Operand first_query = a.causal ? Operand(b.mul(s.it, tile, imm_index(s.it, kTileRows))) : imm_index(s.it, 0);
    Reg lo_query = a.causal ? j : b.mov(s.it, imm_index(s.it, 0));
    Reg span = b.sub(s.it, imm_index(s.it, s.tq), lo_query);  // query i is seen when i - lo < tq - lo (unsigned)
    std::vector<Reg> acc_k = zeros(b, static_cast<size_t>(s.d)), acc_v = zeros(b, static_cast<size_t>(s.dv));
    // The query heads that read this key/value head (one without grouped queries).
    b.for_(imm_index(s.it, 0), imm_index(s.it, s.groups), imm_index(s.it, 1), [&](Reg g) {
      Reg q_entry = b.mad(s.it, entry, imm_index(s.it, s.groups), g);
      const Reg mask_first = s.mask ? mask_base(b, s, q_entry) : Reg{};
      b.for_(first_query, imm_index(s.it, s.tq), imm_index(s.it, kQueries), [&](Reg i0) {
        b.bar();
        stage_rows(b, s, q, s.q, q_entry, i0, s.tq, s.d, q_smem, tid, kQueries);
        stage_rows(b, s, d_o, Piece{}, q_entry, i0, s.tq, s.dv, do_smem, tid, kQueries);
        b.if_(b.setp(Cmp::lt, tid, imm_u32(static_cast<uint32_t>(kQueries))), [&] {
          Reg i = b.add(s.it, i0, in_index_type(b, s, tid));
          Reg l_val = b.mov(Type::f32, imm_f32(0.0f)), d_val = b.mov(Type::f32, imm_f32(0.0f));
          b.if_(b.setp(Cmp::lt, i, imm_index(s.it, s.tq)), [&] {
            Reg row = b.mad(s.it, q_entry, imm_index(s.it, s.tq), i);
            b.set(l_val, b.ld(Space::global, Type::f32, b.address(lse, row, 4)));
            b.set(d_val, b.ld(Space::global, Type::f32, b.address(dd, row, 4)));
          });
          Reg at = b.mad(Type::u32, tid, imm_u32(4), row_smem);
          b.st(Space::shared, Type::f32, at, l_val);
          b.st(Space::shared, Type::f32, at, d_val, 4 * kQueries);
        });
        b.bar();
        b.for_(imm_u32(0), imm_u32(static_cast<uint32_t>(kQueries)), imm_u32(1), [&](Reg ii) {
          Reg seen = b.setp(Cmp::lt, b.sub(s.it, b.add(s.it, i0, in_index_type(b, s, ii)), lo_query), span);
          Reg stats = b.mad(Type::u32, ii, imm_u32(4), row_smem);
          Reg q_row = b.mad(Type::u32, ii, imm_u32(static_cast<uint32_t>(4 * s.d)), q_smem);
          Reg do_row = b.mad(Type::u32, ii, imm_u32(static_cast<uint32_t>(4 * s.dv)), do_smem);
          Reg lse_i = b.ld(Space::shared, Type::f32, stats), d_i = b.ld(Space::shared, Type::f32, stats, 4 * kQueries);
          Reg i = b.add(s.it, i0, in_index_type(b, s, ii));
          Reg score = dot_own_column(b, q_row, k_own, s.d);
          if (s.mask) score = masked(b, s, mask, mask_row(b, s, mask_first, i), score, j);
          Reg p = b.selp(Type::f32, exp_of(b, b.sub(Type::f32, score, lse_i)), imm_f32(0.0f), seen);
          Reg factor = dropout_factor(b, s, stream, b.mad(s.it, q_entry, imm_index(s.it, s.tq), i), j);
          axpy_shared(b, acc_v, times(b, p, factor), do_row, 0);
          Reg dp = times(b, dot_own_column(b, do_row, v_own, s.dv), factor);
          axpy_shared(b, acc_k, b.mul(Type::f32, p, b.sub(Type::f32, dp, d_i)), q_row, 0);
        });
      });
    });
    b.if_(valid, [&] {
      store_own_row(b, dk, g.dk_copy, row_first(b, s, entry, j, s.tk, s.d, s.k), acc_k, scale);
      store_own_row(b, dv, g.dv_copy, row_first(b, s, entry, j, s.tk, s.dv, s.v), acc_v);
    });
    const kir::Dim3 grid{static_cast<uint32_t>(s.entries / s.groups),
                         static_cast<uint32_t>((s.tk + kTileRows - 1) / kTileRows), 1};
    lo.launches.push_back(
        finish_launch(b, "kiln_attention_grad_kv_tiled", grid, {static_cast<uint32_t>(kTileRows), 1, 1}, g.args));
  }
  lo.summary = std::string("attention_grad") + (a.causal ? " (causal)" : "") + (a.dropout() ? " (dropout)" : "") +
               ": a thread per query row (D, dq; keys in shared tiles of 32), then a thread per key row (dk, dv; "
               "queries in shared tiles of 32), probabilities recomputed from the row log-sum-exp, no atomics, " +
               launch_text(lo.launches[0]) + "; " + launch_text(lo.launches[1]);
  return lo;
}

LoweredOp lower_attention_grad(const Circuit& c, const Op& op, const Target& target) {
  require_gpu_dtypes(c, op);
  const AttentionParams a = AttentionParams::of(op);
  const Sizes s = sizes_of(c, op, target);
  if (mma_attention(a, s, target)) return lower_attention_grad_mma(op, a, s);
  if (tiled_forward(s) && (s.tk + kTileRows - 1) / kTileRows <= 65535) return lower_attention_grad_tiled(op, a, s);
  const bool has_dlse = static_cast<int>(op.inputs.size()) == s.rest + 4;
  const float scale = static_cast<float>(a.scale);
  LoweredOp lo;
  lo.scratch_bytes = {static_cast<size_t>(s.entries * s.tq) * 4};  // D, a value per query row

  // Launch 1: a warp per query row; D, then dq.
  {
    const int64_t rows = s.entries * s.tq;
    KernelBuilder b("kiln_attention_grad_q");
    const GradQParams g = grad_q_params(b, s, has_dlse);
    const Reg q = g.q, k = g.k, v = g.v, o = g.o, lse = g.lse, d_o = g.d_o, dlse = g.dlse, dq = g.dq, dd = g.dd;
    const WarpRow w = warp_row(b, s, rows);
    b.if_(w.in_range, [&] {
      const Reg entry = entry_of(b, s, w.row, s.tq), i = position_of(b, s, w.row, s.tq);
      const Reg kv_entry = kv_entry_of(b, s, entry);
      std::vector<Reg> qi = load_row(b, s, q, row_first(b, s, entry, i, s.tq, s.d, s.q), w.lane, s.d, true, scale);
      Reg vrow = row_first(b, s, entry, i, s.tq, s.dv);
      std::vector<Reg> doi = load_row(b, s, d_o, vrow, w.lane, s.dv, false);
      Reg row_d = warp_dot(b, doi, load_row(b, s, o, vrow, w.lane, s.dv, false));  // D from do itself
      for (Reg& x : doi) x = product_operand(b, s, x);
      if (has_dlse) row_d = b.sub(Type::f32, row_d, b.ld(Space::global, Type::f32, b.address(dlse, w.row, 4)));
      b.if_(b.setp(Cmp::eq, w.lane, imm_u32(0)),
            [&] { b.st(Space::global, Type::f32, b.address(dd, w.row, 4), row_d); });
      Reg lse_i = b.ld(Space::global, Type::f32, b.address(lse, w.row, 4));
      const Reg mask_at = s.mask ? mask_row(b, s, mask_base(b, s, entry), i) : Reg{};
      std::vector<Reg> acc = zeros(b, qi.size());
      Operand end = a.causal ? Operand(b.add(s.it, i, imm_index(s.it, 1))) : imm_index(s.it, s.tk);
      b.for_(imm_index(s.it, 0), end, imm_index(s.it, 1), [&](Reg j) {
        std::vector<Reg> kj = load_row(b, s, k, row_first(b, s, kv_entry, j, s.tk, s.d, s.k), w.lane, s.d, true);
        std::vector<Reg> vj = load_row(b, s, v, row_first(b, s, kv_entry, j, s.tk, s.dv, s.v), w.lane, s.dv, true);
        Reg p = exp_of(b, b.sub(Type::f32, masked(b, s, g.mask, mask_at, warp_dot(b, qi, kj), j), lse_i));
        Reg dp = times(b, warp_dot(b, doi, vj), dropout_factor(b, s, g.stream, w.row, j));
        Reg ds = b.mul(Type::f32, p, b.sub(Type::f32, dp, row_d));
        accumulate(b, acc, ds, kj);
      });
      store_row(b, s, dq, g.dq_copy, row_first(b, s, entry, i, s.tq, s.d, s.q), w.lane, s.d, acc, scale);
    });
    lo.launches.push_back(finish_launch(b, "kiln_attention_grad_q", grid_for(rows), {32 * kWarps, 1, 1}, g.args));
  }
  // Launch 2: a warp per key row; dk and dv over the queries that see the key.
  {
    const int64_t rows = s.entries / s.groups * s.tk;  // key rows of the key/value entries
    KernelBuilder b("kiln_attention_grad_kv");
    const GradKvParams g = grad_kv_params(b, s);
    const Reg q = g.q, k = g.k, v = g.v, lse = g.lse, d_o = g.d_o, dd = g.dd, dk = g.dk, dv = g.dv, mask = g.mask;
    const Stream stream = g.stream;
    const WarpRow w = warp_row(b, s, rows);
    b.if_(w.in_range, [&] {
      const Reg entry = entry_of(b, s, w.row, s.tk), j = position_of(b, s, w.row, s.tk);
      std::vector<Reg> kj = load_row(b, s, k, row_first(b, s, entry, j, s.tk, s.d, s.k), w.lane, s.d, true, scale);
      std::vector<Reg> vj = load_row(b, s, v, row_first(b, s, entry, j, s.tk, s.dv, s.v), w.lane, s.dv, true);
      std::vector<Reg> acc_k = zeros(b, kj.size()), acc_v = zeros(b, vj.size());
      Operand begin = a.causal ? Operand(j) : imm_index(s.it, 0);
      b.for_(imm_index(s.it, 0), imm_index(s.it, s.groups), imm_index(s.it, 1), [&](Reg g) {
        Reg q_entry = b.mad(s.it, entry, imm_index(s.it, s.groups), g);
        Reg query0 = b.mul(s.it, q_entry, imm_index(s.it, s.tq));
        const Reg mask_first = s.mask ? mask_base(b, s, q_entry) : Reg{};
        b.for_(begin, imm_index(s.it, s.tq), imm_index(s.it, 1), [&](Reg i) {
          Reg qi_at = b.add(s.it, query0, i);
          std::vector<Reg> qi = load_row(b, s, q, row_first(b, s, q_entry, i, s.tq, s.d, s.q), w.lane, s.d, true);
          std::vector<Reg> doi = load_row(b, s, d_o, row_first(b, s, q_entry, i, s.tq, s.dv), w.lane, s.dv, true);
          Reg lse_i = b.ld(Space::global, Type::f32, b.address(lse, qi_at, 4));
          Reg d_i = b.ld(Space::global, Type::f32, b.address(dd, qi_at, 4));
          Reg score = warp_dot(b, qi, kj);
          if (s.mask) score = masked(b, s, mask, mask_row(b, s, mask_first, i), score, j);
          Reg p = exp_of(b, b.sub(Type::f32, score, lse_i));
          Reg factor = dropout_factor(b, s, stream, qi_at, j);
          accumulate(b, acc_v, times(b, p, factor), doi);
          Reg ds = b.mul(Type::f32, p, b.sub(Type::f32, times(b, warp_dot(b, doi, vj), factor), d_i));
          accumulate(b, acc_k, ds, qi);
        });
      });
      store_row(b, s, dk, g.dk_copy, row_first(b, s, entry, j, s.tk, s.d, s.k), w.lane, s.d, acc_k, scale);
      store_row(b, s, dv, g.dv_copy, row_first(b, s, entry, j, s.tk, s.dv, s.v), w.lane, s.dv, acc_v);
    });
    lo.launches.push_back(finish_launch(b, "kiln_attention_grad_kv", grid_for(rows), {32 * kWarps, 1, 1}, g.args));
  }
  lo.summary = std::string("attention_grad") + (a.causal ? " (causal)" : "") + (a.dropout() ? " (dropout)" : "") +
               ": a warp per query row (D, dq), then a warp per key row (dk, dv), probabilities recomputed from "
               "the row log-sum-exp, no atomics, " +
               launch_text(lo.launches[0]) + "; " + launch_text(lo.launches[1]);
  return lo;
}

}  // namespace attention_detail

using namespace attention_detail;

void register_attention_lowering(LoweringTable& t) {
  t.add(PrimId::attention, lower_attention, "warp per query row, online softmax, no (T, T) matrix");
  t.add(PrimId::attention_grad, lower_attention_grad,
        "warp per query row (dq), then warp per key row (dk, dv), probabilities recomputed, no atomics");
}

}  // namespace kiln::cuda
