// Tensor-core attention (FlashAttention-2's schedule on mma.sync m16n8k16 bf16) for attention and
// attention_grad with bf16 operands (q, k, v and do read rounded to bf16, as the reference and the
// FFMA kernels read them), head sizes 16-128 in multiples of 16, with or without an additive mask
// (read where a score is formed, as the FFMA kernels read it) and dropout (each factor drawn from
// the op's Philox stream where it is used, the reference's bits); other ops keep the FFMA
// kernels of attention.cpp. Each warp owns 16 of its block's rows; the other operand streams
// through shared memory a tile at a time (Blocking: 64 own rows and tiles of 64 up to head size
// 64, tiles of 32 and in the backward 32 own rows above it).
//  - forward: a block per (entry, query rows); S = q k^T on the tensor cores, the online softmax
//    on S's accumulator fragments (a row's scores are spread over the 4 lanes of a quad: maxima
//    by two shuffles, sums kept per lane until the end), o += P v;
//  - backward, two launches as the FFMA kernels (no atomics): a block per query rows writes D
//    and dq (S, P = exp(S - lse), dP = do v^T, dS = P (dP - D), dq += dS k), then a block per key
//    rows dk and dv (S^T = k q^T, P^T, dv += P^T do, dP^T = v do^T, dk += dS^T q).
// Fragments: an accumulator tile of 16 x 8 (c0..c3: rows g and g + 8, columns 2t, 2t + 1 where
// g = lane / 4, t = lane % 4) holds exactly the A fragment of the next product's k-step (two
// n-tiles side by side), so P and dS go from one product to the next in registers
// (pack_bf16x2). They enter that product as two bf16 halves, hi = bf16(x) and lo = bf16(x - hi),
// so the product keeps about 16 bits of x where one bf16 would keep 8: the reference keeps P and
// dS in f32, and these kernels agree with it at f32-like tolerances. Staged rows (f32 in global
// memory) are rounded to bf16 by pack_bf16x2 and stored with rows padded by 16 bytes, so the 8
// rows an ldmatrix phase reads fall on distinct banks. Sums are f32; the order over keys is not
// the reference's.
#include <array>
#include <cmath>
#include <functional>

#include <kiln/cuda/lower/attention_kernels.hpp>
#include <kiln/cuda/lower/elementwise.hpp>

namespace kiln::cuda::attention_detail {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::MmaShape;
using kir::Space;
using kir::SReg;

namespace {

// A kernel's blocking: `rows` own rows a block (16 a warp: 2 rows a thread), the streamed
// operand `tile` rows a step. Head sizes up to 64 take 64 and 64; larger ones (up to 128) stream
// tiles of 32 rows, and the backward kernels own 32 rows too, so that the staged tiles stay
// within the 48 KiB of static shared memory a block may declare.
struct Blocking {
  int64_t rows, tile;
  uint32_t threads() const { return static_cast<uint32_t>(2 * rows); }
};
Blocking forward_blocking(const Sizes& s) { return {64, std::max(s.d, s.dv) <= 64 ? 64 : 32}; }
Blocking backward_blocking(const Sizes& s) {
  const int64_t r = std::max(s.d, s.dv) <= 64 ? 64 : 32;
  return {r, r};
}

using Acc = std::array<Reg, 4>;  // a 16 x 8 f32 accumulator tile (c0..c3)

// Bytes from one staged bf16 row of n elements to the next.
uint32_t pitch_of(int64_t n) { return static_cast<uint32_t>(2 * n + 16); }

// The lane's roles: g = lane / 4 and t = lane % 4 (fragment rows and columns), and its part of
// an ldmatrix.x4 address: matrix m = lane / 8, row r = lane % 8.
struct Lanes {
  Reg tid, warp, g, t, m_lo, m_hi, r;  // m_lo = m & 1, m_hi = m >> 1
};
Lanes lanes(KernelBuilder& b) {
  Lanes l;
  l.tid = b.sreg(SReg::tid_x);
  Reg lane = b.and_(Type::u32, l.tid, imm_u32(31));
  l.warp = b.shr(Type::u32, l.tid, imm_u32(5));
  l.g = b.shr(Type::u32, lane, imm_u32(2));
  l.t = b.and_(Type::u32, lane, imm_u32(3));
  Reg m = b.shr(Type::u32, lane, imm_u32(3));
  l.m_lo = b.and_(Type::u32, m, imm_u32(1));
  l.m_hi = b.shr(Type::u32, m, imm_u32(1));
  l.r = b.and_(Type::u32, lane, imm_u32(7));
  return l;
}

// The lane's ldmatrix.x4 row address, relative to tile (row0, col0) of a staged array:
//  - a_order: A fragments (rows x k) and, with .trans, B fragments of a [k][n] array: matrix m
//    at rows 8 (m & 1), columns 8 (m >> 1), so the four registers are a0..a3, or b0, b1 of
//    n-tiles 0 and 1;
//  - b_order: B fragments of an [n][k] array (no .trans): matrix m at rows 8 (m >> 1), columns
//    8 (m & 1): b0, b1 of n-tile 0, then b0, b1 of n-tile 1.
Reg lane_offset(KernelBuilder& b, const Lanes& l, uint32_t pitch, bool a_order) {
  Reg row = b.add(Type::u32, b.shl(Type::u32, a_order ? l.m_lo : l.m_hi, imm_u32(3)), l.r);
  return b.mad(Type::u32, row, imm_u32(pitch), b.shl(Type::u32, a_order ? l.m_hi : l.m_lo, imm_u32(4)));
}
// The a_order ldmatrix base of the warp's 16 rows of a staged array (rows from `warp_rows`).
Reg warp_a_base(KernelBuilder& b, const Lanes& l, Reg smem, uint32_t pitch, Reg warp_rows) {
  return b.add(Type::u32, b.add(Type::u32, smem, lane_offset(b, l, pitch, true)),
               b.mul(Type::u32, warp_rows, imm_u32(pitch)));
}
std::vector<Reg> ldmatrix_at(KernelBuilder& b, Reg base, int64_t row0, int64_t col0, uint32_t pitch, bool trans) {
  return b.ldmatrix(4, trans, b.add(Type::u32, base, imm_u32(static_cast<uint32_t>(row0 * pitch + 2 * col0))));
}

Acc zero_acc(KernelBuilder& b) {
  Acc a;
  for (Reg& x : a) x = b.mov(Type::f32, imm_f32(0.0f));
  return a;
}
std::vector<Acc> zero_accs(KernelBuilder& b, int64_t n) {
  std::vector<Acc> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(zero_acc(b));
  return v;
}

// acc += A B on the tensor cores, in place (acc is loop-carried).
void mma_into(KernelBuilder& b, Acc& acc, const std::vector<Reg>& a, Reg b0, Reg b1) {
  kir::Instr in;
  in.op = kir::Opc::Mma;
  in.type = Type::f32;
  in.mma = MmaShape::m16n8k16_bf16;
  for (Reg x : a) in.srcs.push_back(x);
  in.srcs.push_back(b0);
  in.srcs.push_back(b1);
  for (Reg x : acc) in.srcs.push_back(x);
  in.dsts.assign(acc.begin(), acc.end());
  b.emit(std::move(in));
}

// The A fragments (hi and lo halves) of k-step kk of a product whose A operand is the 16 x n
// matrix held in accumulator tiles x (n / 8 of them): tiles 2 kk and 2 kk + 1.
struct SplitFrag {
  std::vector<Reg> hi, lo;
};
SplitFrag split_frag(KernelBuilder& b, const std::vector<Acc>& x, size_t kk) {
  SplitFrag f;
  auto pair = [&](Reg e0, Reg e1) {
    Reg h0 = b.cvt(Type::f32, b.cvt(Type::bf16, e0)), h1 = b.cvt(Type::f32, b.cvt(Type::bf16, e1));
    f.hi.push_back(b.pack_bf16x2(h0, h1));
    f.lo.push_back(b.pack_bf16x2(b.sub(Type::f32, e0, h0), b.sub(Type::f32, e1, h1)));
  };
  const Acc &left = x[2 * kk], &right = x[2 * kk + 1];
  pair(left[0], left[1]);    // a0: row g, columns 2t, 2t + 1
  pair(left[2], left[3]);    // a1: row g + 8
  pair(right[0], right[1]);  // a2: row g, columns 8 + 2t, 8 + 2t + 1
  pair(right[2], right[3]);  // a3: row g + 8
  return f;
}

// acc[nt] += X Y for X the 16 x (8 x.size()) matrix in accumulator tiles x (split into halves)
// and Y the staged [8 x.size()][n] array (rows: the k index) at `base`, which holds the lane's
// a_order offset: fragments by ldmatrix.trans.
void product_from_acc(KernelBuilder& b, std::vector<Acc>& acc, const std::vector<Acc>& x, Reg base, uint32_t pitch,
                      int64_t n) {
  for (size_t kk = 0; kk < x.size() / 2; ++kk) {
    const SplitFrag f = split_frag(b, x, kk);
    for (int64_t np = 0; np < n / 16; ++np) {
      std::vector<Reg> y = ldmatrix_at(b, base, 16 * static_cast<int64_t>(kk), 16 * np, pitch, true);
      for (const std::vector<Reg>* a : {&f.hi, &f.lo}) {
        mma_into(b, acc[static_cast<size_t>(2 * np)], *a, y[0], y[1]);
        mma_into(b, acc[static_cast<size_t>(2 * np + 1)], *a, y[2], y[3]);
      }
    }
  }
}

// acc[nt] += X Y^T for X the warp's 16 rows of a staged [rows][k] array (fragments at x_base,
// which holds the lane's a_order offset and the warp's rows) and Y a staged [tile][k] array
// (y_base with the lane's b_order offset): acc has tile / 8 tiles, k elements a row.
void product_of_rows(KernelBuilder& b, std::vector<Acc>& acc, Reg x_base, Reg y_base, uint32_t pitch, int64_t k) {
  for (int64_t kk = 0; kk < k / 16; ++kk) {
    std::vector<Reg> a = ldmatrix_at(b, x_base, 0, 16 * kk, pitch, false);
    for (int64_t np = 0; np < static_cast<int64_t>(acc.size()) / 2; ++np) {
      std::vector<Reg> y = ldmatrix_at(b, y_base, 16 * np, 16 * kk, pitch, false);
      mma_into(b, acc[static_cast<size_t>(2 * np)], a, y[0], y[1]);
      mma_into(b, acc[static_cast<size_t>(2 * np + 1)], a, y[2], y[3]);
    }
  }
}

// Rows [row0, row0 + count) of `entry` in a tensor of t rows an entry and n floats a row (zeros
// past t), rounded to bf16 into the staged array at `smem` (pitch_of(n)). A thread moves 8
// floats at a time (two 16-byte loads, one 16-byte store); every load of the thread is in flight
// before its first store. Each 8 lanes' 16-byte stores must fall on distinct banks: where a row
// is whole 128-byte lines of bf16 (n a multiple of 64) consecutive threads take consecutive
// chunks of a row (coalesced loads); else consecutive rows at the same columns, as ldmatrix
// reads them (rows 16 (n / 8 + 1) bytes apart, an odd number of 16-byte slots).
void stage(KernelBuilder& b, const Sizes& s, Reg base, const Piece& piece, Reg entry, Reg row0, int64_t t, int64_t n,
           Reg smem, Reg tid, int64_t count, uint32_t threads) {
  const int64_t chunks = count * n / 8;
  std::vector<std::array<Reg, 8>> vals;
  std::vector<Reg> rows, cols, in_range;
  for (int64_t first = 0; first < chunks; first += threads) {
    Reg idx = b.add(Type::u32, tid, imm_u32(static_cast<uint32_t>(first)));
    // The last round may be partial (e.g. 32 rows of 80 floats, 320 chunks, for 128 threads).
    in_range.push_back(first + threads <= chunks ? Reg{}
                                                 : b.setp(Cmp::lt, idx, imm_u32(static_cast<uint32_t>(chunks))));
    const bool along_rows = n % 64 == 0;
    const auto across = static_cast<uint32_t>(along_rows ? n / 8 : count);  // the fast-moving index's extent
    Reg fast = b.rem(Type::u32, idx, imm_u32(across)), slow = b.div(Type::u32, idx, imm_u32(across));
    Reg row = along_rows ? slow : fast, col8 = along_rows ? fast : slow;
    std::array<Reg, 8> v;
    for (Reg& x : v) x = b.mov(Type::f32, imm_f32(0.0f));
    Reg at_row = b.add(Type::u32, row0, row);
    Reg wanted = b.setp(Cmp::lt, at_row, imm_u32(static_cast<uint32_t>(t)));
    if (in_range.back().valid()) wanted = b.and_(Type::pred, wanted, in_range.back());
    b.if_(wanted, [&] {
      Reg at = b.add(s.it, row_first(b, s, entry, in_index_type(b, s, at_row), t, n, piece),
                     in_index_type(b, s, b.shl(Type::u32, col8, imm_u32(3))));
      Reg address = b.address(base, at, 4);
      for (int64_t half = 0; half < 2; ++half) {
        std::vector<Reg> x = b.ld_vec(Space::global, Type::f32, address, 4, 16 * half);
        for (size_t e = 0; e < 4; ++e) b.set(v[static_cast<size_t>(4 * half) + e], x[e]);
      }
    });
    vals.push_back(v);
    rows.push_back(row);
    cols.push_back(col8);
  }
  const uint32_t pitch = pitch_of(n);
  for (size_t c = 0; c < vals.size(); ++c) {
    auto store = [&] {
      Reg at = b.mad(Type::u32, rows[c], imm_u32(pitch), b.mad(Type::u32, cols[c], imm_u32(16), smem));
      const std::array<Reg, 8>& v = vals[c];
      b.st_vec(
          Space::shared, Type::u32, at,
          {b.pack_bf16x2(v[0], v[1]), b.pack_bf16x2(v[2], v[3]), b.pack_bf16x2(v[4], v[5]), b.pack_bf16x2(v[6], v[7])});
    };
    if (in_range[c].valid())
      b.if_(in_range[c], store);
    else
      store();
  }
}

// The score tile's element (nt, e) of a lane: column 8 nt + 2 t + (e & 1) of row g + 8 (e >> 1).
// Sets the elements whose (row, column) `hidden` says are hidden to -inf.
void hide(KernelBuilder& b, std::vector<Acc>& sc, Reg row_lo, Reg col0,
          const std::function<Reg(Reg row, Reg col)>& hidden) {
  Reg row_hi = b.add(Type::u32, row_lo, imm_u32(8));
  for (size_t nt = 0; nt < sc.size(); ++nt)
    for (uint32_t e = 0; e < 4; ++e) {
      Reg col = b.add(Type::u32, col0, imm_u32(static_cast<uint32_t>(8 * nt) + (e & 1)));
      Reg& x = sc[nt][e];
      b.assign(kir::Opc::Selp, x, {imm_f32(-INFINITY), x, hidden(e < 2 ? row_lo : row_hi, col)});
    }
}

// Adds the additive mask to every element of a score tile laid out as hide() says, rows from
// row_lo and columns from col0 (u32): queries along the rows and keys along the columns, or
// with keys_are_rows (S^T) the other way round. `base` is the entry's mask_base.
void add_mask(KernelBuilder& b, const Sizes& s, Reg mask, Reg base, std::vector<Acc>& sc, Reg row_lo, Reg col0,
              bool keys_are_rows) {
  for (size_t nt = 0; nt < sc.size(); ++nt)
    for (uint32_t e = 0; e < 4; ++e) {
      Reg row = b.add(Type::u32, row_lo, imm_u32(8 * (e >> 1)));
      Reg col = b.add(Type::u32, col0, imm_u32(static_cast<uint32_t>(8 * nt) + (e & 1)));
      Reg query = keys_are_rows ? col : row, key = keys_are_rows ? row : col;
      Reg at = mask_row(b, s, base, in_index_type(b, s, query));
      b.set(sc[nt][e], masked(b, s, mask, at, sc[nt][e], in_index_type(b, s, key)));
    }
}

// The dropout factors (1 / keep or 0, the reference's bits) of a lane's elements (key, key + 1)
// of query row `row` (entry * tq + query, in the index type), key (u32) even: with tk a multiple
// of 4 both lie in one Philox block (words 0, 1 or 2, 3), one call for the pair; else one each.
std::array<Reg, 2> pair_factors(KernelBuilder& b, const Sizes& s, const Stream& st, Reg row, Reg key) {
  Reg key_it = in_index_type(b, s, key);
  if (s.tk % 4 == 0) {
    std::vector<Reg> w = stream_words(b, st, stream_element(b, s, row, key_it));
    Reg high = b.setp(Cmp::ne, b.and_(Type::u32, key, imm_u32(2)), imm_u32(0));
    return {factor_of(b, s, kept(b, s, b.selp(Type::u32, w[2], w[0], high))),
            factor_of(b, s, kept(b, s, b.selp(Type::u32, w[3], w[1], high)))};
  }
  return {dropout_factor(b, s, st, row, key_it),
          dropout_factor(b, s, st, row, b.add(s.it, key_it, imm_index(s.it, 1)))};
}

// The stream row (entry * tq + query) of a lane's query rows row_lo and row_lo + 8.
std::array<Reg, 2> stream_rows(KernelBuilder& b, const Sizes& s, Reg entry, Reg row_lo) {
  std::array<Reg, 2> r;
  for (uint32_t h = 0; h < 2; ++h)
    r[h] = b.mad(s.it, entry, imm_index(s.it, s.tq), in_index_type(b, s, b.add(Type::u32, row_lo, imm_u32(8 * h))));
  return r;
}

// max over the 4 lanes of a quad (the lanes holding one fragment row).
Reg quad_max(KernelBuilder& b, Reg x) {
  for (uint32_t d : {1u, 2u}) x = b.max(Type::f32, x, b.shfl(kir::ShflMode::bfly, x, imm_u32(d)));
  return x;
}
Reg quad_sum(KernelBuilder& b, Reg x) {
  for (uint32_t d : {1u, 2u}) x = b.add(Type::f32, x, b.shfl(kir::ShflMode::bfly, x, imm_u32(d)));
  return x;
}

// Stores rows row_lo and row_lo + 8 (those below t) of accumulator tiles acc (n columns), times
// `factor`, to `base` as a tensor of t rows an entry (piece: where it lies with heads inside),
// and to its bf16 copy `copy` where valid (a column pair as one packed 4-byte store: the pair
// starts at an even column of rows of even length).
void store_rows(KernelBuilder& b, const Sizes& s, const Lanes& l, Reg base, Reg copy, const Piece& piece, Reg entry,
                Reg row_lo, int64_t t, int64_t n, const std::vector<Acc>& acc, const std::array<Reg, 2>& factor) {
  for (uint32_t h = 0; h < 2; ++h) {
    Reg row = b.add(Type::u32, row_lo, imm_u32(8 * h));
    b.if_(b.setp(Cmp::lt, row, imm_u32(static_cast<uint32_t>(t))), [&] {
      Reg first = b.add(s.it, row_first(b, s, entry, in_index_type(b, s, row), t, n, piece),
                        in_index_type(b, s, b.shl(Type::u32, l.t, imm_u32(1))));
      Reg at = b.address(base, first, 4);
      Reg copy_at = copy.valid() ? b.address(copy, first, 2) : Reg{};
      for (size_t nt = 0; nt < acc.size(); ++nt) {
        Reg x0 = b.mul(Type::f32, acc[nt][2 * h], factor[h]), x1 = b.mul(Type::f32, acc[nt][2 * h + 1], factor[h]);
        b.st_vec(Space::global, Type::f32, at, {x0, x1}, static_cast<int64_t>(4 * 8 * nt));
        if (copy.valid())
          b.st(Space::global, Type::u32, copy_at, b.pack_bf16x2(x0, x1), static_cast<int64_t>(2 * 8 * nt));
      }
    });
  }
}

// The scores of a tile whose rows are queries (row_lo and row_lo + 8 of this lane; the warp's
// first is warp_first) and whose columns are keys j0 ..: S times the scale, plus the mask, and
// the keys past tk (causal: past the row) hidden where the tile reaches them.
void query_scores(KernelBuilder& b, const Sizes& s, const AttentionParams& a, std::vector<Acc>& sc, Reg mask,
                  Reg mask_first, const Lanes& l, Reg row_lo, Reg warp_first, Reg j0, int64_t tile) {
  const auto tk = static_cast<uint32_t>(s.tk);
  for (Acc& t : sc)
    for (Reg& x : t) b.assign(kir::Opc::Mul, x, {x, imm_f32(static_cast<float>(a.scale))});
  Reg col0 = b.add(Type::u32, j0, b.shl(Type::u32, l.t, imm_u32(1)));
  if (s.mask) add_mask(b, s, mask, mask_first, sc, row_lo, col0, false);
  Reg tile_end = b.add(Type::u32, j0, imm_u32(static_cast<uint32_t>(tile)));
  Reg needs = b.setp(Cmp::gt, tile_end, imm_u32(tk));
  if (a.causal) needs = b.or_(Type::pred, needs, b.setp(Cmp::gt, tile_end, warp_first));
  b.if_(needs, [&] {
    hide(b, sc, row_lo, col0, [&](Reg row, Reg col) {
      Reg past = b.setp(Cmp::ge, col, imm_u32(tk));
      return a.causal ? b.or_(Type::pred, past, b.setp(Cmp::gt, col, row)) : past;
    });
  });
}

// A block of query rows: its entry (ctaid.x) and that entry's key/value entry, and its first row
// q0 of `rows` (ctaid.y; causal: the last tiles, the heaviest, first, so that the light ones fill
// the tail); `tiles` blocks cover tq.
struct QueryBlock {
  Reg entry, kv_entry, q0;
  uint32_t tiles;
};
QueryBlock query_block(KernelBuilder& b, const Sizes& s, const AttentionParams& a, int64_t rows) {
  QueryBlock q;
  q.tiles = static_cast<uint32_t>((s.tq + rows - 1) / rows);
  Reg tile = a.causal ? b.sub(Type::u32, imm_u32(q.tiles - 1), b.sreg(SReg::ctaid_y)) : b.sreg(SReg::ctaid_y);
  q.entry = in_index_type(b, s, b.sreg(SReg::ctaid_x));
  q.kv_entry = kv_entry_of(b, s, q.entry);
  q.q0 = b.mul(Type::u32, tile, imm_u32(static_cast<uint32_t>(rows)));
  return q;
}

// The bytes of a staged array of `rows` rows of n bf16.
int64_t staged_bytes(int64_t rows, int64_t n) { return rows * pitch_of(n); }

std::string description(const AttentionParams& a, const char* what, const Blocking& bl) {
  return std::string(what) + (a.causal ? " (causal)" : "") + (a.dropout() ? " (dropout)" : "") +
         ": bf16 mma.sync m16n8k16, " + std::to_string(bl.rows) + " rows a block (16 a warp), the streamed operand's " +
         std::to_string(bl.tile) + "-row tiles staged as bf16 in shared memory";
}

}  // namespace

bool mma_attention(const AttentionParams&, const Sizes& s, const Target& target) {
  auto head_ok = [](int64_t n) { return n >= 16 && n <= 128 && n % 16 == 0; };
  return target.attention == AttentionPath::mma && s.bf16 && head_ok(s.d) && head_ok(s.dv) &&
         (s.tq + 31) / 32 <= 65535 && (s.tk + 31) / 32 <= 65535 && s.tq < (int64_t{1} << 31) &&
         s.tk < (int64_t{1} << 31);
}

LoweredOp lower_attention_mma(const AttentionParams& a, const Sizes& s) {
  KernelBuilder b("kiln_attention_mma");
  const Blocking bl = forward_blocking(s);
  const ForwardParams f = forward_params(b, s);
  const uint32_t pd = pitch_of(s.d), pv = pitch_of(s.dv);
  Reg q_s = b.shared_addr(b.shared_array("q_tile", staged_bytes(bl.rows, s.d)));
  Reg k_s = b.shared_addr(b.shared_array("k_tile", staged_bytes(bl.tile, s.d)));
  Reg v_s = b.shared_addr(b.shared_array("v_tile", staged_bytes(bl.tile, s.dv)));
  const Lanes l = lanes(b);
  const QueryBlock qb = query_block(b, s, a, bl.rows);
  const Reg entry = qb.entry, kv_entry = qb.kv_entry, q0 = qb.q0;
  stage(b, s, f.q, s.q, entry, q0, s.tq, s.d, q_s, l.tid, bl.rows, bl.threads());
  b.bar();
  Reg warp_rows = b.mul(Type::u32, l.warp, imm_u32(16));
  Reg q_frags = warp_a_base(b, l, q_s, pd, warp_rows);
  Reg k_frags = b.add(Type::u32, k_s, lane_offset(b, l, pd, false));
  Reg v_trans = b.add(Type::u32, v_s, lane_offset(b, l, pv, true));
  Reg row_lo = b.add(Type::u32, b.add(Type::u32, q0, warp_rows), l.g);  // this lane's rows: row_lo, row_lo + 8
  std::array<Reg, 2> m_run, l_run;
  for (int h = 0; h < 2; ++h)
    m_run[h] = b.mov(Type::f32, imm_f32(-INFINITY)), l_run[h] = b.mov(Type::f32, imm_f32(0.0f));
  std::vector<Acc> acc = zero_accs(b, s.dv / 8);
  const Reg mask_first = s.mask ? mask_base(b, s, entry) : Reg{};
  const std::array<Reg, 2> stream_row = f.stream.on() ? stream_rows(b, s, entry, row_lo) : std::array<Reg, 2>{};
  const auto tk = static_cast<uint32_t>(s.tk);
  Operand key_end =
      a.causal ? Operand(b.min(Type::u32, b.add(Type::u32, q0, imm_u32(bl.rows)), imm_u32(tk))) : imm_u32(tk);
  b.for_(imm_u32(0), key_end, imm_u32(bl.tile), [&](Reg j0) {
    b.bar();  // the previous tile's readers are done
    stage(b, s, f.k, s.k, kv_entry, j0, s.tk, s.d, k_s, l.tid, bl.tile, bl.threads());
    stage(b, s, f.v, s.v, kv_entry, j0, s.tk, s.dv, v_s, l.tid, bl.tile, bl.threads());
    b.bar();
    std::vector<Acc> sc = zero_accs(b, bl.tile / 8);
    product_of_rows(b, sc, q_frags, k_frags, pd, s.d);
    query_scores(b, s, a, sc, f.mask, mask_first, l, row_lo, b.add(Type::u32, q0, warp_rows), j0, bl.tile);
    for (uint32_t h = 0; h < 2; ++h) {
      Reg mx = b.mov(Type::f32, imm_f32(-INFINITY));
      for (const Acc& t : sc) mx = b.max(Type::f32, mx, b.max(Type::f32, t[2 * h], t[2 * h + 1]));
      Reg m_new = b.max(Type::f32, m_run[h], quad_max(b, mx)), m_use = softmax_max(b, s, m_new);
      Reg keep = exp_of(b, b.sub(Type::f32, m_run[h], m_use));
      b.assign(kir::Opc::Mul, l_run[h], {l_run[h], keep});
      for (Acc& t : acc)
        for (uint32_t e : {2 * h, 2 * h + 1}) b.assign(kir::Opc::Mul, t[e], {t[e], keep});
      for (size_t nt = 0; nt < sc.size(); ++nt) {
        Acc& t = sc[nt];
        for (uint32_t e : {2 * h, 2 * h + 1}) {
          b.set(t[e], exp_of(b, b.sub(Type::f32, t[e], m_use)));
          b.assign(kir::Opc::Add, l_run[h], {l_run[h], t[e]});
        }
        if (f.stream.on()) {  // o sums the dropped probabilities; l, the softmax's, does not
          Reg key = b.add(Type::u32, b.add(Type::u32, j0, b.shl(Type::u32, l.t, imm_u32(1))), imm_u32(8 * nt));
          const std::array<Reg, 2> factor = pair_factors(b, s, f.stream, stream_row[h], key);
          for (uint32_t e : {0u, 1u}) b.assign(kir::Opc::Mul, t[2 * h + e], {t[2 * h + e], factor[e]});
        }
      }
      b.set(m_run[h], m_new);
    }
    product_from_acc(b, acc, sc, v_trans, pv, s.dv);
  });
  std::array<Reg, 2> inv;
  for (int h = 0; h < 2; ++h) {
    b.set(l_run[h], quad_sum(b, l_run[h]));
    inv[h] = b.div(Type::f32, imm_f32(1.0f), l_run[h]);
  }
  store_rows(b, s, l, f.o, f.o_copy, Piece{}, entry, row_lo, s.tq, s.dv, acc, inv);
  b.if_(b.setp(Cmp::eq, l.t, imm_u32(0)), [&] {
    for (uint32_t h = 0; h < 2; ++h) {
      Reg row = b.add(Type::u32, row_lo, imm_u32(8 * h));
      b.if_(b.setp(Cmp::lt, row, imm_u32(static_cast<uint32_t>(s.tq))), [&] {
        Reg at = b.mad(s.it, entry, imm_index(s.it, s.tq), in_index_type(b, s, row));
        b.st(Space::global, Type::f32, b.address(f.lse, at, 4),
             b.add(Type::f32, m_run[h], emit_scalar_exp(b, se::log(se::in(0)), {l_run[h]})));
      });
    }
  });
  const kir::Dim3 grid{static_cast<uint32_t>(s.entries), qb.tiles, 1};
  return single_launch(finish_launch(b, "kiln_attention_mma", grid, {bl.threads(), 1, 1}, f.args),
                       description(a, "attention", bl) + ", online softmax, o and the row log-sum-exp written");
}

namespace {

// The first backward launch, a block per query rows: D = rowsum(do * o) - dlse (to the scratch,
// for the second launch) and dq. has_dlse: the op takes the gradient of the row log-sum-exp.
Launch grad_q_launch(const AttentionParams& a, const Sizes& s, bool has_dlse) {
  const float scale = static_cast<float>(a.scale);
  const uint32_t pd = pitch_of(s.d), pv = pitch_of(s.dv);
  const auto tq = static_cast<uint32_t>(s.tq), tk = static_cast<uint32_t>(s.tk);
  KernelBuilder b("kiln_attention_grad_q_mma");
  const Blocking bl = backward_blocking(s);
  const GradQParams g = grad_q_params(b, s, has_dlse);
  Reg q_s = b.shared_addr(b.shared_array("q_tile", staged_bytes(bl.rows, s.d)));
  Reg do_s = b.shared_addr(b.shared_array("do_tile", staged_bytes(bl.rows, s.dv)));
  Reg k_s = b.shared_addr(b.shared_array("k_tile", staged_bytes(bl.tile, s.d)));
  Reg v_s = b.shared_addr(b.shared_array("v_tile", staged_bytes(bl.tile, s.dv)));
  Reg rows_s = b.shared_addr(b.shared_array("lse_and_d", 2 * bl.rows * 4));
  const Lanes l = lanes(b);
  const QueryBlock qb = query_block(b, s, a, bl.rows);
  const Reg entry = qb.entry, kv_entry = qb.kv_entry, q0 = qb.q0;
  stage(b, s, g.q, s.q, entry, q0, s.tq, s.d, q_s, l.tid, bl.rows, bl.threads());
  stage(b, s, g.d_o, Piece{}, entry, q0, s.tq, s.dv, do_s, l.tid, bl.rows, bl.threads());
  // D = rowsum(do * o) - dlse from do itself (f32): two threads a row, half a row each.
  {
    Reg local = b.shr(Type::u32, l.tid, imm_u32(1)), half = b.and_(Type::u32, l.tid, imm_u32(1));
    Reg i = b.add(Type::u32, q0, local);
    Reg part = b.mov(Type::f32, imm_f32(0.0f)), lse_i = b.mov(Type::f32, imm_f32(0.0f));
    Reg valid = b.setp(Cmp::lt, i, imm_u32(tq));
    b.if_(valid, [&] {
      Reg first = b.add(s.it, row_first(b, s, entry, in_index_type(b, s, i), s.tq, s.dv),
                        in_index_type(b, s, b.mul(Type::u32, half, imm_u32(static_cast<uint32_t>(s.dv / 2)))));
      for (int64_t c4 = 0; c4 < s.dv / 2; c4 += 4) {
        std::vector<Reg> y = b.ld_vec(Space::global, Type::f32, b.address(g.d_o, first, 4), 4, 4 * c4);
        std::vector<Reg> z = b.ld_vec(Space::global, Type::f32, b.address(g.o, first, 4), 4, 4 * c4);
        for (size_t e = 0; e < 4; ++e) b.assign(kir::Opc::Fma, part, {y[e], z[e], part});
      }
    });
    b.assign(kir::Opc::Add, part, {part, b.shfl(kir::ShflMode::bfly, part, imm_u32(1))});
    b.if_(valid, [&] {
      Reg row = b.mad(s.it, entry, imm_index(s.it, s.tq), in_index_type(b, s, i));
      if (has_dlse) b.assign(kir::Opc::Sub, part, {part, b.ld(Space::global, Type::f32, b.address(g.dlse, row, 4))});
      b.set(lse_i, b.ld(Space::global, Type::f32, b.address(g.lse, row, 4)));
      b.if_(b.setp(Cmp::eq, half, imm_u32(0)), [&] { b.st(Space::global, Type::f32, b.address(g.dd, row, 4), part); });
    });
    b.if_(b.setp(Cmp::eq, half, imm_u32(0)), [&] {
      Reg at = b.mad(Type::u32, local, imm_u32(4), rows_s);
      b.st(Space::shared, Type::f32, at, lse_i);
      b.st(Space::shared, Type::f32, at, part, 4 * bl.rows);
    });
  }
  b.bar();
  Reg warp_rows = b.mul(Type::u32, l.warp, imm_u32(16));
  Reg row_lo = b.add(Type::u32, b.add(Type::u32, q0, warp_rows), l.g);
  std::array<Reg, 2> lse_h, d_h;
  for (uint32_t h = 0; h < 2; ++h) {
    Reg at = b.mad(Type::u32, b.add(Type::u32, b.add(Type::u32, warp_rows, l.g), imm_u32(8 * h)), imm_u32(4), rows_s);
    lse_h[h] = b.ld(Space::shared, Type::f32, at);
    d_h[h] = b.ld(Space::shared, Type::f32, at, 4 * bl.rows);
  }
  Reg q_frags = warp_a_base(b, l, q_s, pd, warp_rows);
  Reg do_frags = warp_a_base(b, l, do_s, pv, warp_rows);
  Reg k_frags = b.add(Type::u32, k_s, lane_offset(b, l, pd, false));
  Reg v_frags = b.add(Type::u32, v_s, lane_offset(b, l, pv, false));
  Reg k_trans = b.add(Type::u32, k_s, lane_offset(b, l, pd, true));
  std::vector<Acc> dq = zero_accs(b, s.d / 8);
  const Reg mask_first = s.mask ? mask_base(b, s, entry) : Reg{};
  const std::array<Reg, 2> stream_row = g.stream.on() ? stream_rows(b, s, entry, row_lo) : std::array<Reg, 2>{};
  Operand key_end =
      a.causal ? Operand(b.min(Type::u32, b.add(Type::u32, q0, imm_u32(bl.rows)), imm_u32(tk))) : imm_u32(tk);
  b.for_(imm_u32(0), key_end, imm_u32(bl.tile), [&](Reg j0) {
    b.bar();
    stage(b, s, g.k, s.k, kv_entry, j0, s.tk, s.d, k_s, l.tid, bl.tile, bl.threads());
    stage(b, s, g.v, s.v, kv_entry, j0, s.tk, s.dv, v_s, l.tid, bl.tile, bl.threads());
    b.bar();
    std::vector<Acc> p = zero_accs(b, bl.tile / 8), dp = zero_accs(b, bl.tile / 8);
    product_of_rows(b, p, q_frags, k_frags, pd, s.d);
    product_of_rows(b, dp, do_frags, v_frags, pv, s.dv);
    query_scores(b, s, a, p, g.mask, mask_first, l, row_lo, b.add(Type::u32, q0, warp_rows), j0, bl.tile);
    // p = exp(s - lse), then ds = p (dp - D) in dp's registers (dp times the dropout factor).
    for (size_t nt = 0; nt < p.size(); ++nt)
      for (uint32_t h = 0; h < 2; ++h) {
        std::array<Reg, 2> factor;
        if (g.stream.on()) {
          Reg key = b.add(Type::u32, b.add(Type::u32, j0, b.shl(Type::u32, l.t, imm_u32(1))), imm_u32(8 * nt));
          factor = pair_factors(b, s, g.stream, stream_row[h], key);
        }
        for (uint32_t e : {2 * h, 2 * h + 1}) {
          b.set(p[nt][e], exp_of(b, b.sub(Type::f32, p[nt][e], lse_h[h])));
          Reg dpe = g.stream.on() ? b.mul(Type::f32, dp[nt][e], factor[e & 1]) : dp[nt][e];
          b.set(dp[nt][e], b.mul(Type::f32, p[nt][e], b.sub(Type::f32, dpe, d_h[h])));
        }
      }
    product_from_acc(b, dq, dp, k_trans, pd, s.d);
  });
  store_rows(b, s, l, g.dq, g.dq_copy, s.q, entry, row_lo, s.tq, s.d, dq,
             {b.mov(Type::f32, imm_f32(scale)), b.mov(Type::f32, imm_f32(scale))});
  const kir::Dim3 grid{static_cast<uint32_t>(s.entries), qb.tiles, 1};
  return finish_launch(b, "kiln_attention_grad_q_mma", grid, {bl.threads(), 1, 1}, g.args);
}

// The second backward launch, a block per key rows: dk and dv, from q, do, the row log-sum-exp
// and the D that grad_q_launch wrote (no atomics: the block loops over all query rows of its group).
Launch grad_kv_launch(const AttentionParams& a, const Sizes& s) {
  const float scale = static_cast<float>(a.scale);
  const uint32_t pd = pitch_of(s.d), pv = pitch_of(s.dv);
  const auto tq = static_cast<uint32_t>(s.tq);
  KernelBuilder b("kiln_attention_grad_kv_mma");
  const Blocking bl = backward_blocking(s);
  const GradKvParams g = grad_kv_params(b, s);
  Reg k_s = b.shared_addr(b.shared_array("k_tile", staged_bytes(bl.rows, s.d)));
  Reg v_s = b.shared_addr(b.shared_array("v_tile", staged_bytes(bl.rows, s.dv)));
  Reg q_s = b.shared_addr(b.shared_array("q_tile", staged_bytes(bl.tile, s.d)));
  Reg do_s = b.shared_addr(b.shared_array("do_tile", staged_bytes(bl.tile, s.dv)));
  Reg rows_s = b.shared_addr(b.shared_array("lse_and_d", 2 * bl.tile * 4));
  const Lanes l = lanes(b);
  const auto tiles = static_cast<uint32_t>((s.tk + bl.rows - 1) / bl.rows);
  // (Causal: the first key tiles see the most queries, and they come first anyway.)
  Reg tile = b.sreg(SReg::ctaid_y);
  Reg entry = in_index_type(b, s, b.sreg(SReg::ctaid_x));
  Reg k0 = b.mul(Type::u32, tile, imm_u32(bl.rows));
  stage(b, s, g.k, s.k, entry, k0, s.tk, s.d, k_s, l.tid, bl.rows, bl.threads());
  stage(b, s, g.v, s.v, entry, k0, s.tk, s.dv, v_s, l.tid, bl.rows, bl.threads());
  Reg warp_rows = b.mul(Type::u32, l.warp, imm_u32(16));
  Reg key_lo = b.add(Type::u32, b.add(Type::u32, k0, warp_rows), l.g);
  Reg k_frags = warp_a_base(b, l, k_s, pd, warp_rows);
  Reg v_frags = warp_a_base(b, l, v_s, pv, warp_rows);
  Reg q_frags = b.add(Type::u32, q_s, lane_offset(b, l, pd, false));
  Reg do_frags = b.add(Type::u32, do_s, lane_offset(b, l, pv, false));
  Reg q_trans = b.add(Type::u32, q_s, lane_offset(b, l, pd, true));
  Reg do_trans = b.add(Type::u32, do_s, lane_offset(b, l, pv, true));
  std::vector<Acc> dk = zero_accs(b, s.d / 8), dv = zero_accs(b, s.dv / 8);
  Operand first_query = a.causal ? Operand(k0) : imm_u32(0);
  b.for_(imm_index(s.it, 0), imm_index(s.it, s.groups), imm_index(s.it, 1), [&](Reg grp) {
    Reg q_entry = b.mad(s.it, entry, imm_index(s.it, s.groups), grp);
    const Reg mask_first = s.mask ? mask_base(b, s, q_entry) : Reg{};
    b.for_(first_query, imm_u32(tq), imm_u32(bl.tile), [&](Reg i0) {
      b.bar();  // the previous tile's readers are done (and, the first time, k and v are staged)
      stage(b, s, g.q, s.q, q_entry, i0, s.tq, s.d, q_s, l.tid, bl.tile, bl.threads());
      stage(b, s, g.d_o, Piece{}, q_entry, i0, s.tq, s.dv, do_s, l.tid, bl.tile, bl.threads());
      b.if_(b.setp(Cmp::lt, l.tid, imm_u32(bl.tile)), [&] {
        Reg i = b.add(Type::u32, i0, l.tid);
        Reg lse_i = b.mov(Type::f32, imm_f32(0.0f)), d_i = b.mov(Type::f32, imm_f32(0.0f));
        b.if_(b.setp(Cmp::lt, i, imm_u32(tq)), [&] {
          Reg row = b.mad(s.it, q_entry, imm_index(s.it, s.tq), in_index_type(b, s, i));
          b.set(lse_i, b.ld(Space::global, Type::f32, b.address(g.lse, row, 4)));
          b.set(d_i, b.ld(Space::global, Type::f32, b.address(g.dd, row, 4)));
        });
        Reg at = b.mad(Type::u32, l.tid, imm_u32(4), rows_s);
        b.st(Space::shared, Type::f32, at, lse_i);
        b.st(Space::shared, Type::f32, at, d_i, 4 * bl.tile);
      });
      b.bar();
      std::vector<Acc> p = zero_accs(b, bl.tile / 8), dp = zero_accs(b, bl.tile / 8);
      product_of_rows(b, p, k_frags, q_frags, pd, s.d);     // S^T: keys x queries
      product_of_rows(b, dp, v_frags, do_frags, pv, s.dv);  // dP^T
      for (Acc& t : p)
        for (Reg& x : t) b.assign(kir::Opc::Mul, x, {x, imm_f32(scale)});
      Reg col0 = b.shl(Type::u32, l.t, imm_u32(1));  // the lane's first query column in the tile
      if (s.mask) add_mask(b, s, g.mask, mask_first, p, key_lo, b.add(Type::u32, i0, col0), true);
      Reg tile_end = b.add(Type::u32, i0, imm_u32(bl.tile));
      Reg needs = b.setp(Cmp::gt, tile_end, imm_u32(tq));
      if (a.causal)
        needs = b.or_(Type::pred, needs,
                      b.setp(Cmp::lt, i0, b.add(Type::u32, b.add(Type::u32, k0, warp_rows), imm_u32(16))));
      b.if_(needs, [&] {
        hide(b, p, key_lo, b.add(Type::u32, i0, col0), [&](Reg key, Reg query) {
          Reg past = b.setp(Cmp::ge, query, imm_u32(tq));
          return a.causal ? b.or_(Type::pred, past, b.setp(Cmp::lt, query, key)) : past;
        });
      });
      // P^T = exp(S^T - lse[query]), dS^T = P^T (dP^T - D[query]): the query is the column.
      for (size_t nt = 0; nt < p.size(); ++nt) {
        Reg at = b.mad(Type::u32, b.add(Type::u32, col0, imm_u32(static_cast<uint32_t>(8 * nt))), imm_u32(4), rows_s);
        std::vector<Reg> lse2 = b.ld_vec(Space::shared, Type::f32, at, 2);
        std::vector<Reg> d2 = b.ld_vec(Space::shared, Type::f32, at, 2, 4 * bl.tile);
        for (uint32_t e = 0; e < 4; ++e) {
          b.set(p[nt][e], exp_of(b, b.sub(Type::f32, p[nt][e], lse2[e & 1])));
          if (!g.stream.on()) {
            b.set(dp[nt][e], b.mul(Type::f32, p[nt][e], b.sub(Type::f32, dp[nt][e], d2[e & 1])));
            continue;
          }
          // Dropout: ds = p (dp f - D) and dv takes p f; a Philox call an element (a column's
          // queries are tk elements apart in the stream).
          Reg query = b.add(Type::u32, b.add(Type::u32, i0, col0), imm_u32(static_cast<uint32_t>(8 * nt) + (e & 1)));
          Reg key = b.add(Type::u32, key_lo, imm_u32(8 * (e >> 1)));
          Reg row = b.mad(s.it, q_entry, imm_index(s.it, s.tq), in_index_type(b, s, query));
          Reg factor = dropout_factor(b, s, g.stream, row, in_index_type(b, s, key));
          b.set(dp[nt][e],
                b.mul(Type::f32, p[nt][e], b.sub(Type::f32, b.mul(Type::f32, dp[nt][e], factor), d2[e & 1])));
          b.assign(kir::Opc::Mul, p[nt][e], {p[nt][e], factor});
        }
      }
      product_from_acc(b, dv, p, do_trans, pv, s.dv);
      product_from_acc(b, dk, dp, q_trans, pd, s.d);
    });
  });
  store_rows(b, s, l, g.dk, g.dk_copy, s.k, entry, key_lo, s.tk, s.d, dk,
             {b.mov(Type::f32, imm_f32(scale)), b.mov(Type::f32, imm_f32(scale))});
  store_rows(b, s, l, g.dv, g.dv_copy, s.v, entry, key_lo, s.tk, s.dv, dv,
             {b.mov(Type::f32, imm_f32(1.0f)), b.mov(Type::f32, imm_f32(1.0f))});
  const kir::Dim3 grid{static_cast<uint32_t>(s.entries / s.groups), tiles, 1};
  return finish_launch(b, "kiln_attention_grad_kv_mma", grid, {bl.threads(), 1, 1}, g.args);
}

}  // namespace

LoweredOp lower_attention_grad_mma(const Op& op, const AttentionParams& a, const Sizes& s) {
  const bool has_dlse = static_cast<int>(op.inputs.size()) == s.rest + 4;
  LoweredOp lo;
  lo.scratch_bytes = {static_cast<size_t>(s.entries * s.tq) * 4};  // D, a value per query row
  lo.launches.push_back(grad_q_launch(a, s, has_dlse));
  lo.launches.push_back(grad_kv_launch(a, s));
  lo.summary = description(a, "attention_grad", backward_blocking(s)) +
               "; a block of query rows (D, dq), then a block of key rows (dk, dv), probabilities recomputed from "
               "the row log-sum-exp, no atomics, " +
               launch_text(lo.launches[0]) + "; " + launch_text(lo.launches[1]);
  return lo;
}

}  // namespace kiln::cuda::attention_detail
