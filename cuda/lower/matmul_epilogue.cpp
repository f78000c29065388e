// The matmul kernel's epilogue (emit_matmul_epilogue; see matmul.hpp), and the wgmma kernel's
// stores through shared memory that it takes where they apply (StagedStores).
#include <algorithm>
#include <functional>
#include <limits>
#include <map>

#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/matmul.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;
using kir::SReg;

namespace {
constexpr int kQuadrant = kMatmulQuadrant, kQuadrantSpacing = kMatmulQuadrantSpacing;
constexpr int kWarpTileM = kMatmulWarpTileM, kWarpsN = kMatmulWarpsN;

// The epilogue's state: the inputs under the names the kernel gave them, and what prepare()
// computes (the tensor-core tiles' first row and column, the block sums' partials, how interior
// tiles are stored). The phases emit in the order emit_matmul_epilogue calls them, each in its
// original order: the kernel's text depends on it.
struct Epilogue {
  explicit Epilogue(const MatmulEpilogueInputs& in)
      : b(in.b),
        it(in.it),
        f(in.f),
        M(f.m),
        N(f.n),
        nb(static_cast<int>(f.batch.size())),
        read_extras(in.read_extras),
        extra_strides(in.extra_strides),
        extra_base(in.extra_base),
        p_out(in.p_out),
        acc(in.acc),
        tile(in.tile),
        mma(in.mma),
        mma_stages(in.mma_stages),
        threads(in.threads),
        m_tiles(in.m_tiles),
        splits(in.splits),
        grid_m(in.grid_m),
        grid_n(in.grid_n),
        out_off(in.out_off),
        p_block_sums(in.p_block_sums),
        p_partials(in.p_partials),
        p_counters(in.p_counters),
        z(in.z),
        grid_z(in.grid_z),
        m0(in.m0),
        n0(in.n0),
        tid(in.tid),
        as(in.as),
        tx(in.tx),
        ty(in.ty),
        warp_m(in.warp_m),
        warp_n(in.warp_n),
        g(in.g),
        q(in.q) {}

  KernelBuilder& b;
  const Type it;
  const FusedMatmul& f;
  const int64_t M, N;
  const int nb;
  const std::vector<int>& read_extras;
  const std::vector<std::vector<int64_t>>& extra_strides;
  const std::vector<Reg>& extra_base;
  const std::vector<Reg>& p_out;
  const std::vector<Reg>& acc;
  const MatmulTiling tile;
  const MmaTiling& mma;
  const std::optional<std::array<MmaStage, 2>>& mma_stages;
  const int threads, m_tiles;
  const int64_t splits, grid_m, grid_n;
  const Reg out_off, p_block_sums, p_partials, p_counters, z, grid_z, m0, n0, tid, as, tx, ty, warp_m, warp_n, g, q;
  // Set by prepare().
  int n_tiles = 0;
  Reg row0, col0;
  std::vector<Reg> partials;
  bool pairs = false;
  std::vector<uint32_t> bytes;
  bool whole_chunks = false;
  std::optional<StagedStores> staged;
  bool staged_chunks = false;
  bool staging_emitted = false;  // the kernel's interior blocks store through the staged tiles

  Reg widen(Reg r) { return it == Type::u32 ? r : b.cvt(Type::u64, r); }
  static int thread_offset(int i) { return (i % kQuadrant) + kQuadrantSpacing * (i / kQuadrant); }
  int out_bytes(size_t r) const { return f.stored_bf16(r) ? 2 : 4; }  // output r's element

  // The block sums body's value from the epilogues' values (the same body: not evaluated twice).
  Reg block_sum_value(const std::vector<Reg>& values, const std::vector<Reg>& inputs) {
    for (size_t r = 0; r < f.epilogues.size(); ++r)
      if (f.epilogues[r] == f.block_sums_body) return values[r];
    return emit_scalar_exp(b, f.block_sums_body, inputs);
  }

  // Epilogue: per element in bounds, the extras at its logical coordinates, then each output;
  // with block sums the element's block sums body is added to `partial`.
  void store_element(Reg value, Reg row, Reg col, Reg partial) {
    Reg ok = b.and_(Type::pred, b.setp(Cmp::lt, row, imm_index(it, M)), b.setp(Cmp::lt, col, imm_index(it, N)));
    b.if_(ok, [&] {
      std::vector<Reg> inputs(static_cast<size_t>(1 + f.extras), value);
      for (int x : read_extras) {
        const std::vector<int64_t>& st = extra_strides[static_cast<size_t>(x)];
        Reg at = b.mul(it, row, imm_index(it, st[static_cast<size_t>(nb)]));
        at = b.mad(it, col, imm_index(it, st[static_cast<size_t>(nb + 1)]), at);
        inputs[static_cast<size_t>(1 + x)] = load_as_f32(b, DType::f32, extra_base[static_cast<size_t>(x)], at);
      }
      Reg at = scaled_add(b, it, row, f.out_row, out_off);
      at = scaled_add(b, it, col, f.out_col, at);
      std::vector<Reg> values;
      for (size_t r = 0; r < f.epilogues.size(); ++r) {
        values.push_back(f.epilogues[r] == se::in(0) ? inputs[0] : emit_scalar_exp(b, f.epilogues[r], inputs));
        store_from_f32(b, f.stored_bf16(r) ? DType::bf16 : DType::f32, p_out[r], at,
                       values.back());  // bf16: as a cast rounds
      }
      if (f.block_sums) b.assign(kir::Opc::Add, partial, {partial, block_sum_value(values, inputs)});
    });
  }

  // Tensor-core tiles: acc[(mi * n_tiles + ni) * 4 + i] sits at row row0 + mi * 16 + 8 (i / 2),
  // column col0 + ni * 8 + i % 2; for_each_accumulator(fn) calls fn(index, row, column) for each.
  void for_each_accumulator(const std::function<void(size_t, Reg, Reg)>& fn) {
    for (int mi = 0; mi < m_tiles; ++mi)
      for (int ni = 0; ni < n_tiles; ++ni)
        for (int i = 0; i < 4; ++i)
          fn(static_cast<size_t>((mi * n_tiles + ni) * 4 + i), b.add(it, row0, imm_index(it, mi * 16 + 8 * (i / 2))),
             b.add(it, col0, imm_index(it, ni * 8 + i % 2)));
  }

  // The tensor-core tiles' first row and column (row0, col0), the block sums' partials (zero),
  // and how interior tiles are stored (pairs, staged): emits the first two only.
  void prepare() {
    n_tiles = mma.wgmma ? tile.tn / 8 : tile.tn / kWarpsN / 8;
    if (tile.tf32) {
      row0 = b.add(it, m0, widen(b.add(Type::u32, warp_m, g)));
      col0 = b.add(it, n0, widen(b.add(Type::u32, warp_n, b.mul(Type::u32, q, imm_u32(2)))));
    }
    // Block sums: the thread's partial sums of its columns over its rows, added in the epilogue
    // (tensor-core tiles: per n-tile and column of the pair, acc's index e at (e / 4 % n_tiles) * 2
    // + e % 2; FFMA tiles: its pn columns). Split-K's last block keeps one of its own.
    if (f.block_sums && splits == 1)
      for (int i = 0; i < (tile.tf32 ? 2 * n_tiles : tile.pn); ++i) partials.push_back(b.mov(Type::f32, imm_f32(0.0f)));
    // Tensor-core tiles whose output columns are unit-stride, with rows and batch items of even
    // stride, store a column pair as one store (each output buffer's alignment checked at run time).
    // wgmma tiles whose rows cannot (an odd stride: GPT-2's logits) store their interior blocks
    // through shared memory where the tiles fit in the stages (StagedStores, below); with
    // MatmulPolicy::staged_stores = all the others too, 16 bytes a store, where every output's rows and
    // batch items start at 16-byte boundaries (each buffer's checked at run time).
    pairs = f.out_col == 1 && f.out_row % 2 == 0;
    for (int64_t st : f.out_batch) pairs = pairs && st % 2 == 0;
    for (size_t r = 0; r < f.epilogues.size(); ++r) bytes.push_back(static_cast<uint32_t>(out_bytes(r)));
    whole_chunks = f.out_col == 1;
    for (uint32_t e : bytes) {
      whole_chunks = whole_chunks && f.out_row * e % 16 == 0;
      for (int64_t st : f.out_batch) whole_chunks = whole_chunks && st * e % 16 == 0;
    }
    const MmaStaging staging = mma.staging;
    const bool odd_rows = f.out_col == 1 && !pairs;
    if (mma.wgmma && splits == 1 &&
        ((staging != MmaStaging::none && odd_rows) || (staging == MmaStaging::all && pairs && whole_chunks))) {
      const int64_t stages_bytes =
          mma.stages * (mma.stage_bytes((*mma_stages)[0], tile.tm) + mma.stage_bytes((*mma_stages)[1], tile.tn));
      staged = StagedStores::plan(tile.tm, tile.tn, threads, bytes, pairs && whole_chunks, stages_bytes, f.out_row);
    }
    staged_chunks = staged && pairs && whole_chunks;
  }

  Reg partial_of_acc(size_t e) {
    return f.block_sums ? partials[(e / 4 % static_cast<size_t>(n_tiles)) * 2 + e % 2] : Reg{};
  }

  // Adds the block's partial sums through shared memory (the stages or tiles, free once every
  // warp is past the main loop): `writes` (value, column in the tile) of the threads `writer`
  // picks (all where invalid) go to row `slot` of `slots` rows of tn floats; then thread t < tn
  // adds column t's rows in order and stores block (batch, ctaid.y)'s sum of column n0 + t.
  void store_block_sums(int64_t slots, Reg slot, const std::vector<std::pair<Reg, Reg>>& writes, Reg writer) {
    b.bar();
    auto write = [&] {
      for (const std::pair<Reg, Reg>& w : writes)
        b.st(
            Space::shared, Type::f32,
            b.mad(Type::u32, b.mad(Type::u32, slot, imm_u32(static_cast<uint32_t>(tile.tn)), w.second), imm_u32(4), as),
            w.first);
    };
    if (writer.valid())
      b.if_(writer, write);
    else
      write();
    b.bar();
    Reg column = b.add(it, n0, widen(tid));
    b.if_(b.and_(Type::pred, b.setp(Cmp::lt, tid, imm_u32(static_cast<uint32_t>(tile.tn))),
                 b.setp(Cmp::lt, column, imm_index(it, N))),
          [&] {
            Reg at = b.mad(Type::u32, tid, imm_u32(4), as);
            Reg total = b.ld(Space::shared, Type::f32, at);
            for (int64_t sl = 1; sl < slots; ++sl)
              b.assign(kir::Opc::Add, total, {total, b.ld(Space::shared, Type::f32, at, sl * tile.tn * 4)});
            Reg block = b.mad(it, z, imm_index(it, (M + tile.tm - 1) / tile.tm), widen(b.sreg(SReg::ctaid_y)));
            b.st(Space::global, Type::f32, b.address(p_block_sums, b.mad(it, block, imm_index(it, N), column), 4),
                 total);
          });
  }

  // Tensor-core tiles, a block wholly inside c: every output and extra addressed once from the
  // thread's first (row0, col0) and each element at an immediate offset (store_tensor_core_tiles
  // checks that they fit); `through_shared`: by the staged tiles (staged), else each pair or
  // element to global memory.
  void store_interior(bool through_shared) {
    std::vector<Reg> out_addr;
    if (through_shared) {
      staged->begin(b, as, b.add(Type::u32, warp_m, g), b.add(Type::u32, warp_n, b.shl(Type::u32, q, imm_u32(1))));
      staging_emitted = true;
    } else {
      Reg out_at = scaled_add(b, it, col0, f.out_col, scaled_add(b, it, row0, f.out_row, out_off));
      for (size_t r = 0; r < p_out.size(); ++r) out_addr.push_back(b.address(p_out[r], out_at, out_bytes(r)));
    }
    std::vector<Reg> extra_addr(static_cast<size_t>(f.extras));
    std::vector<std::map<int64_t, Reg>> loaded(static_cast<size_t>(f.extras));  // by byte offset
    for (int x : read_extras) {
      const std::vector<int64_t>& st = extra_strides[static_cast<size_t>(x)];
      Reg at = b.mul(it, row0, imm_index(it, st[static_cast<size_t>(nb)]));
      at = b.mad(it, col0, imm_index(it, st[static_cast<size_t>(nb + 1)]), at);
      extra_addr[static_cast<size_t>(x)] = b.address(extra_base[static_cast<size_t>(x)], at, 4);
    }
    // Extra x's element at (dr, dc) from the thread's first: loaded once.
    auto extra_at = [&](int x, int64_t dr, int64_t dc) {
      const std::vector<int64_t>& st = extra_strides[static_cast<size_t>(x)];
      const int64_t at = 4 * (dr * st[static_cast<size_t>(nb)] + dc * st[static_cast<size_t>(nb + 1)]);
      auto [slot, fresh] = loaded[static_cast<size_t>(x)].try_emplace(at);
      if (fresh) slot->second = b.ld(Space::global, Type::f32, extra_addr[static_cast<size_t>(x)], at);
      return slot->second;
    };
    // Units: row g + dr (dr = 16 mi + 8 half) of the 16x8 product (mi, ni), two columns. The extras
    // of kUnitsAhead units are loaded before the first of their stores: ptxas does not move a
    // load above a store that may alias it, so loads placed between stores each wait their
    // full latency (one product's GELU-gradient epilogue took 280 us for 160 of main loop).
    constexpr int kUnitsAhead = 8;
    struct Unit {
      int mi, ni, half;
      int64_t dr;
    };
    std::vector<Unit> units;
    for (int mi = 0; mi < m_tiles; ++mi)
      for (int ni = 0; ni < n_tiles; ++ni)
        for (int half = 0; half < 2; ++half) units.push_back({mi, ni, half, mi * 16 + 8 * half});
    for (size_t u0 = 0; u0 < units.size(); u0 += kUnitsAhead) {
      const size_t u1 = std::min(units.size(), u0 + kUnitsAhead);
      for (size_t u = u0; u < u1; ++u)
        for (int j = 0; j < 2; ++j)
          for (int x : read_extras) extra_at(x, units[u].dr, units[u].ni * 8 + j);
      for (size_t u = u0; u < u1; ++u) {
        const auto [mi, ni, half, dr] = units[u];
        std::vector<std::array<Reg, 2>> values(f.epilogues.size());
        for (int j = 0; j < 2; ++j) {
          const int64_t dc = ni * 8 + j;
          std::vector<Reg> inputs(static_cast<size_t>(1 + f.extras),
                                  acc[static_cast<size_t>((mi * n_tiles + ni) * 4 + 2 * half + j)]);
          for (int x : read_extras) inputs[static_cast<size_t>(1 + x)] = extra_at(x, dr, dc);
          std::vector<Reg> of_j;
          for (size_t r = 0; r < f.epilogues.size(); ++r) {
            values[r][static_cast<size_t>(j)] =
                f.epilogues[r] == se::in(0) ? inputs[0] : emit_scalar_exp(b, f.epilogues[r], inputs);
            of_j.push_back(values[r][static_cast<size_t>(j)]);
          }
          if (f.block_sums) {
            Reg& partial = partials[static_cast<size_t>(ni * 2 + j)];
            b.assign(kir::Opc::Add, partial, {partial, block_sum_value(of_j, inputs)});
          }
        }
        for (size_t r = 0; r < f.epilogues.size(); ++r) {
          const int64_t e = out_bytes(r), at = e * (dr * f.out_row + ni * 8 * f.out_col);
          if (through_shared) {
            staged->put(b, r, dr, ni * 8, values[r]);
          } else if (f.stored_bf16(r) && pairs) {  // a pair of bf16: one 4-byte store
            b.st(Space::global, Type::u32, out_addr[r], b.pack_bf16x2(values[r][0], values[r][1]), at);
          } else if (f.stored_bf16(r)) {
            b.st(Space::global, Type::bf16, out_addr[r], b.cvt(Type::bf16, values[r][0]), at);
            b.st(Space::global, Type::bf16, out_addr[r], b.cvt(Type::bf16, values[r][1]), at + e * f.out_col);
          } else if (pairs) {
            b.st_vec(Space::global, Type::f32, out_addr[r], {values[r][0], values[r][1]}, at);
          } else {
            b.st(Space::global, Type::f32, out_addr[r], values[r][0], at);
            b.st(Space::global, Type::f32, out_addr[r], values[r][1], at + e * f.out_col);
          }
        }
      }
    }
    if (through_shared) {
      Reg tile_at = b.add(it, n0, scaled_add(b, it, m0, f.out_row, out_off));  // element (0, 0)
      std::vector<Reg> tiles;
      for (size_t r = 0; r < p_out.size(); ++r) tiles.push_back(b.address(p_out[r], tile_at, out_bytes(r)));
      staged->copy_out(b, it, tid, tiles);
    }
  }

  // Tensor-core tiles' epilogue on the accumulators: interior blocks unchecked (store_interior,
  // staged or not), the others (or all where the offsets would not fit) element by element.
  void store_tensor_core_tiles() {
    auto store_checked = [&] {
      for_each_accumulator([&](size_t e, Reg row, Reg col) { store_element(acc[e], row, col, partial_of_acc(e)); });
    };
    // Blocks wholly inside c (all but the last row and column of tiles) store without bounds
    // checks: each output and extra is addressed once, every element at an immediate byte offset
    // from the thread's first (row0, col0), and where columns are unit-stride and rows of even
    // stride a column pair (c0 c1, c2 c3) goes out as one 8-byte store, or for an output
    // stored as bf16 one 4-byte store of the rounded pair (each output buffer's alignment
    // checked at run time). Each distinct extra element (a bias: one per column) is loaded
    // once. The offsets (counted in 4-byte elements: bf16's are half) must fit PTX's 32-bit
    // immediates and the strides be non-negative.
    const int64_t last_row = (m_tiles - 1) * 16 + 8, last_col = (n_tiles - 1) * 8 + 1;
    auto reach = [&](int64_t row_stride, int64_t col_stride) {
      return row_stride < 0 || col_stride < 0 ? std::numeric_limits<int64_t>::max()
                                              : 4 * (last_row * row_stride + last_col * col_stride);
    };
    int64_t farthest = reach(f.out_row, f.out_col);
    for (int x : read_extras) {
      const std::vector<int64_t>& st = extra_strides[static_cast<size_t>(x)];
      farthest = std::max(farthest, reach(st[static_cast<size_t>(nb)], st[static_cast<size_t>(nb + 1)]));
    }
    if (farthest > std::numeric_limits<int32_t>::max()) {
      store_checked();
    } else {
      Reg inside = b.and_(Type::pred, b.setp(Cmp::le, b.add(it, m0, imm_index(it, tile.tm)), imm_index(it, M)),
                          b.setp(Cmp::le, b.add(it, n0, imm_index(it, tile.tn)), imm_index(it, N)));
      // Inside, with every output buffer aligned to `bytes` (1: no condition).
      auto inside_aligned = [&](int64_t bytes) {
        Reg all = inside;
        if (bytes > 1)
          for (Reg p : p_out)
            all =
                b.and_(Type::pred, all,
                       b.setp(Cmp::eq, b.and_(Type::u64, p, imm_index(Type::u64, bytes - 1)), imm_index(Type::u64, 0)));
        return all;
      };
      auto unstaged = [&] {
        b.if_(
            inside_aligned(pairs ? 8 : 1), [&] { store_interior(false); }, store_checked);
      };
      if (!staged)
        unstaged();
      else if (!staged_chunks)  // odd rows: no alignment beyond the element's
        b.if_(
            inside, [&] { store_interior(true); }, store_checked);
      else  // 16-byte copies where every buffer allows them, else pairs
        b.if_(
            inside_aligned(16), [&] { store_interior(true); }, unstaged);
    }
  }

  // The epilogue on the block's accumulators (no split): tensor-core tiles by
  // store_tensor_core_tiles, FFMA tiles element by element.
  void epilogue() {
    if (tile.tf32) {
      store_tensor_core_tiles();
    } else {
      Reg row0 = b.add(it, m0, widen(b.mul(Type::u32, ty, imm_u32(kQuadrant))));
      Reg col0 = b.add(it, n0, widen(b.mul(Type::u32, tx, imm_u32(kQuadrant))));
      for (int i = 0; i < tile.pm; ++i)
        for (int j = 0; j < tile.pn; ++j)
          store_element(acc[static_cast<size_t>(i * tile.pn + j)], b.add(it, row0, imm_index(it, thread_offset(i))),
                        b.add(it, col0, imm_index(it, thread_offset(j))),
                        f.block_sums ? partials[static_cast<size_t>(j)] : Reg{});
    }
  }

  // Split-K: the block's accumulators to its partials, then the tile's last block adds the
  // splits' partials in order and applies the epilogue (and its block sums).
  void add_split_partials() {
    // Partials [batch][split][M][N]: this block's at grid z, its accumulators in bounds.
    Reg mine = b.address(p_partials, b.mul(it, grid_z, imm_index(it, M * N)), 4);
    for_each_accumulator([&](size_t e, Reg row, Reg col) {
      Reg ok = b.and_(Type::pred, b.setp(Cmp::lt, row, imm_index(it, M)), b.setp(Cmp::lt, col, imm_index(it, N)));
      b.if_(ok,
            [&] { b.st(Space::global, Type::f32, b.address(mine, b.mad(it, row, imm_index(it, N), col), 4), acc[e]); });
    });
    Reg tile_index = b.mad(it, b.mad(it, z, imm_index(it, grid_m), widen(b.sreg(SReg::ctaid_y))), imm_index(it, grid_n),
                           widen(b.sreg(SReg::ctaid_x)));
    // The last block walks the tile a thread per column (consecutive threads on consecutive
    // columns: coalesced), each element's partials loaded together and added in split order,
    // then the epilogue: a loop, not the unrolled accumulators, so that nothing but one element
    // is live (unrolled over the accumulators, 128x256 tiles took 255 registers and spilled).
    after_last_block(b, b.address(p_counters, tile_index, 4), static_cast<uint32_t>(splits), [&] {
      Reg first = b.address(p_partials, b.mul(it, z, imm_index(it, splits * M * N)), 4);
      const int64_t tile_elements = int64_t{tile.tm} * tile.tn;
      // Thread t walks column t % tn (tn divides the block's threads): one partial sum.
      Reg split_partial = f.block_sums ? b.mov(Type::f32, imm_f32(0.0f)) : Reg{};
      b.for_(widen(tid), imm_index(it, tile_elements), imm_index(it, threads), [&](Reg e) {
        Reg row = b.add(it, m0, b.div(it, e, imm_index(it, tile.tn)));
        Reg col = b.add(it, n0, b.rem(it, e, imm_index(it, tile.tn)));
        Reg ok = b.and_(Type::pred, b.setp(Cmp::lt, row, imm_index(it, M)), b.setp(Cmp::lt, col, imm_index(it, N)));
        Reg at = b.mad(it, row, imm_index(it, N), col);
        std::vector<Reg> parts;
        for (int64_t sp = 0; sp < splits; ++sp)
          parts.push_back(
              guarded_load(b, Type::f32, b.address(first, b.add(it, at, imm_index(it, sp * M * N)), 4), 1, ok)[0]);
        Reg total = b.mov(Type::f32, parts[0]);
        for (size_t sp = 1; sp < parts.size(); ++sp) b.assign(kir::Opc::Add, total, {total, parts[sp]});
        store_element(total, row, col, split_partial);
      });
      if (f.block_sums) {
        const auto tn = static_cast<uint32_t>(tile.tn);
        store_block_sums(threads / tile.tn, b.div(Type::u32, tid, imm_u32(tn)),
                         {{split_partial, b.rem(Type::u32, tid, imm_u32(tn))}}, Reg{});
      }
    });
  }

  // After the epilogue (no split), with block sums: the threads' partials to the block's sums.
  void store_tile_block_sums() {
    if (f.block_sums && tile.tf32) {
      // Lanes g = lane / 4 hold rows g and g + 8 of the same columns: the warp's sums over g
      // (a butterfly over xor 4, 8, 16 leaves them in every lane; lanes 0-3 write them), one row
      // of sums a warp (wgmma: a warp of 16 rows of every column) or a warp row of 64 (mma.sync:
      // warps 64 rows apart hold the same columns).
      for (Reg& p : partials)
        for (uint32_t off : {4u, 8u, 16u})
          b.assign(kir::Opc::Add, p, {p, b.shfl(kir::ShflMode::bfly, p, imm_u32(off))});
      std::vector<std::pair<Reg, Reg>> writes;
      for (int ni = 0; ni < n_tiles; ++ni)
        for (int j = 0; j < 2; ++j)
          writes.emplace_back(partials[static_cast<size_t>(ni * 2 + j)],
                              b.add(Type::u32, b.add(Type::u32, warp_n, b.shl(Type::u32, q, imm_u32(1))),
                                    imm_u32(static_cast<uint32_t>(8 * ni + j))));
      const bool per_warp = mma.wgmma;
      store_block_sums(per_warp ? threads / 32 : tile.tm / kWarpTileM,
                       per_warp ? b.shr(Type::u32, tid, imm_u32(5)) : b.div(Type::u32, warp_m, imm_u32(kWarpTileM)),
                       writes, b.setp(Cmp::eq, g, imm_u32(0)));
    } else if (f.block_sums) {  // FFMA tiles: thread (tx, ty)'s columns tx * 4 + thread_offset(j), a row per ty
      std::vector<std::pair<Reg, Reg>> writes;
      for (int j = 0; j < tile.pn; ++j)
        writes.emplace_back(partials[static_cast<size_t>(j)], b.add(Type::u32, b.mul(Type::u32, tx, imm_u32(kQuadrant)),
                                                                    imm_u32(static_cast<uint32_t>(thread_offset(j)))));
      store_block_sums(threads / (tile.tn / tile.pn), ty, writes, Reg{});
    }
  }
};

}  // namespace

MatmulEpilogueEmitted emit_matmul_epilogue(const MatmulEpilogueInputs& in) {
  Epilogue ep(in);
  ep.prepare();
  if (ep.splits > 1) {
    ep.add_split_partials();
  } else {
    ep.epilogue();
    ep.store_tile_block_sums();
  }
  return {ep.staging_emitted, ep.staged_chunks};
}

// StagedStores (matmul.hpp): the wgmma matmul kernel's stores through shared memory.

std::optional<StagedStores> StagedStores::plan(int tm, int tn, int threads, const std::vector<uint32_t>& bytes,
                                               bool chunks, int64_t shared_bytes, int64_t out_row) {
  const int warps = threads / 32;
  if (tn % 32 != 0 || warps == 0 || out_row <= 0) return std::nullopt;
  StagedStores s;
  s.tm_ = tm;
  s.tn_ = tn;
  s.warps_ = warps;
  s.out_row_ = out_row;
  int64_t used = 0, reach = 0;
  for (uint32_t e : bytes) {
    // A row of tn elements and 8 more: f32 rows of tn + 8 words (8 mod 32) put a warp's 8-byte
    // pair stores (lanes g = l / 4 on 8 rows, q = l % 4 on 4 pairs) on 32 banks in each half of
    // the warp; bf16 rows of tn / 2 + 4 words (4 mod 32) its 4-byte ones on 32 banks at once.
    // Rows start at 16-byte boundaries either way, so a 16-byte chunk of a row is one access.
    const auto pitch = static_cast<uint32_t>(tn + 8) * e;
    const uint32_t access = chunks ? 16 : e;
    const int per_row = tn * static_cast<int>(e) / static_cast<int>(access);  // accesses a row
    const int lanes = std::min(32, per_row);                                  // a warp's lanes on one row
    if (per_row % lanes != 0 || 32 % lanes != 0 || tm % (warps * (32 / lanes)) != 0) return std::nullopt;
    s.outputs_.push_back({e, access, pitch, static_cast<uint32_t>(used), lanes});
    used += int64_t{tm} * pitch;
    reach = std::max(reach, (int64_t{tm} * out_row + tn) * e);
  }
  if (used > shared_bytes || reach > std::numeric_limits<int32_t>::max()) return std::nullopt;
  return s;
}

void StagedStores::begin(KernelBuilder& b, Reg smem, Reg row, Reg col) {
  b.bar();  // every warpgroup's last products have read their stages
  smem_ = smem;
  base_.clear();
  for (const Output& o : outputs_)
    base_.push_back(
        b.mad(Type::u32, row, kir::imm_u32(o.pitch),
              b.mad(Type::u32, col, kir::imm_u32(o.bytes), b.add(Type::u32, smem, kir::imm_u32(o.offset)))));
}

void StagedStores::put(KernelBuilder& b, size_t r, int64_t dr, int64_t dc, const std::array<Reg, 2>& values) const {
  const Output& o = outputs_[r];
  const int64_t at = dr * o.pitch + dc * o.bytes;
  if (o.bytes == 4)
    b.st_vec(Space::shared, Type::f32, base_[r], {values[0], values[1]}, at);
  else
    b.st(Space::shared, Type::u32, base_[r], b.pack_bf16x2(values[0], values[1]), at);  // rounded as a cast rounds
}

void StagedStores::copy_out(KernelBuilder& b, Type it, Reg tid, const std::vector<Reg>& tile) const {
  b.bar();  // every pair is staged
  Reg warp = b.shr(Type::u32, tid, kir::imm_u32(5)), lane = b.and_(Type::u32, tid, kir::imm_u32(31));
  auto widen = [&](Reg r) { return it == Type::u32 ? r : b.cvt(Type::u64, r); };
  for (size_t r = 0; r < outputs_.size(); ++r) {
    const Output& o = outputs_[r];
    // A warp's lanes take o.lanes consecutive accesses of a row (32 / o.lanes rows at once where
    // a row has fewer accesses than lanes); warp w takes rows w, w + warps, ... of such groups.
    // Every store instruction of a warp then writes consecutive bytes of each of its rows.
    const auto lanes = static_cast<uint32_t>(o.lanes), rows_at_once = 32 / lanes;
    const int64_t elements = o.access / o.bytes;  // an access's
    Reg row = b.mad(Type::u32, warp, kir::imm_u32(rows_at_once), b.div(Type::u32, lane, kir::imm_u32(lanes)));
    Reg col =
        b.mul(Type::u32, b.rem(Type::u32, lane, kir::imm_u32(lanes)), kir::imm_u32(static_cast<uint32_t>(elements)));
    Reg from = b.mad(Type::u32, row, kir::imm_u32(o.pitch),
                     b.mad(Type::u32, col, kir::imm_u32(o.bytes), b.add(Type::u32, smem_, kir::imm_u32(o.offset))));
    Reg to = b.address(tile[r], b.mad(it, widen(row), imm_index(it, out_row_), widen(col)), static_cast<int>(o.bytes));
    const Type t = o.access == 16 ? Type::u32 : o.bytes == 4 ? Type::f32 : Type::bf16;  // bf16 moves as its bits
    const int vec = o.access == 16 ? 4 : 1;
    const int64_t row_step = int64_t{warps_} * rows_at_once,
                  per_lane = tn_ / elements / lanes;  // a row's accesses a lane
    for (int64_t i = 0; i * row_step < tm_; ++i) {
      // A row group's accesses are loaded before their stores, so that the loads are in flight together.
      std::vector<std::vector<Reg>> values;
      for (int64_t j = 0; j < per_lane; ++j)
        values.push_back(b.ld_vec(Space::shared, t, from, vec, i * row_step * o.pitch + j * lanes * o.access));
      for (int64_t j = 0; j < per_lane; ++j) {
        const std::vector<Reg>& v = values[static_cast<size_t>(j)];
        const int64_t at = (i * row_step * out_row_ + j * lanes * elements) * o.bytes;
        if (vec == 1)
          b.st(Space::global, t, to, v[0], at);
        else
          b.st_vec(Space::global, t, to, {v[0], v[1], v[2], v[3]}, at);
      }
    }
  }
}

}  // namespace kiln::cuda
