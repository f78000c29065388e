// Lowering of fused_matmul (circuit/prims/fused_matmul.hpp), and the kernel a plain matmul
// (lower_matmul, below) takes too: c(batch..., m, n) = sum over
// k of prologue(A(batch, m, k)) * prologue(B(batch, n, k)), then each epilogue of (c, extras)
// stored through the output layout. A plain matmul is the program FusedMatmul::plain describes
// (its transposes folded into the operands' strides), so both take this one kernel.
//
// Tiled in shared memory: a block of 256 threads (16 x 16) computes a tile of c over K in steps
// of 16, each thread a block of accumulators in registers: 64x64 tiles with 4x4 per thread, or,
// where the grid has blocks enough to fill the GPU in whole waves or the op has block sums
// (choose_tiling, matmul_tiling.cpp), 128x128 tiles with 8x8 per thread (twice the FFMAs per shared-memory load). A
// thread's rows are 4x4 quadrants 64 apart (ty*4 + 64q + i), so that its operands are 16-byte vectors and a
// quarter-warp's fragment loads read 128 contiguous bytes: no bank conflict. Tiles are loaded through the operand views
// (the lanes of a warp on 32 rows of one k, so that tile stores meet no bank conflict; see TileLoader, matmul.hpp) and
// zero-filled outside the matrix, so no size needs to be a multiple of the tile; a prologue is applied as each element
// is loaded. The next tile's global loads are issued before the current tile's FFMAs (held in registers and stored to
// shared memory after them, or for an f32 operand stored along its rows copied there by cp.async), so their latency
// hides behind the arithmetic. Batch dims: those the rows continue through with b shared are folded into the rows
// (fold_batch_into_rows); grid z walks the rest, each operand and output with its own batch strides (0 where an operand
// broadcasts). FFMA in f32, or with Target::tf32 tf32 tensor cores (mma.sync) on the 128x128 tiles. An operand stored
// in bf16 is loaded as bf16 (half the bytes) and widened to f32 in the tiles; where both carry bf16 values (stored, or
// f32 read through a rounding to bf16) their products are exact in both kernels and large tiles take the tensor cores.
// Operands both stored as they are multiplied (16-byte aligned chunks, k or rows contiguous, no prologue, no row sums)
// run a third kernel instead, fed from 2-4 cp.async stages (matmul_tiling.cpp, matmul_mma_loop.cpp): bf16 mma.sync with
// ldmatrix unless the matmul policy says bf16-mma=off, and with Target::tf32 f32 operands on tf32 mma.sync
// (unless 64x64 tiles are forced). Row sums of A (a bias gradient) come out of the blocks of the
// first tile column, from the tiles in shared memory. Every choice among these is made before the
// kernel is built (plan_matmul, matmul_tiling.cpp); matmul.hpp maps the lowering's files.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <array>
#include <optional>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>
#include <kiln/cuda/lower/matmul.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;
using kir::SReg;

namespace {

constexpr int kTileK = kMatmulTileK;
constexpr int kQuadrant = kMatmulQuadrant, kQuadrantSpacing = kMatmulQuadrantSpacing;
constexpr int kWarpTileM = kMatmulWarpTileM, kWarpsN = kMatmulWarpsN;

// The kernel as lower_matmul_program builds it: the plan, the builder, and the parameters and
// registers each phase leaves for the later ones. The phases (member functions) emit in the order
// lower_matmul_program calls them, each in its original order: the kernel's text depends on it.
struct MatmulKernel : MatmulPlan {
  MatmulKernel(MatmulPlan plan, KernelBuilder& builder, const Circuit& circuit, const Op& o)
      : MatmulPlan(std::move(plan)), b(builder), c(circuit), op(o) {}

  KernelBuilder& b;
  const Circuit& c;
  const Op& op;
  // Parameters (declare_params).
  Reg pa, pb;
  std::vector<int> read_extras;  // the extras some body reads
  std::vector<Reg> p_extra, p_out;
  Reg p_sums, p_block_sums, p_partials, p_counters;
  WgmmaTensorCopies copies;
  // The block's place and the batch item's addresses (locate_block).
  Reg tid, m0, n0, grid_z, z;
  std::vector<Reg> zc;
  DType a_dtype = DType::f32, b_dtype = DType::f32;
  Reg a_base, b_base, out_off;
  std::vector<Reg> extra_base;
  // Shared tiles (allocate_tiles).
  int pitch_a = 0, pitch_b = 0;
  int64_t a_buffer_bytes = 0, b_buffer_bytes = 0;
  int ffma_buffers = 0;
  Reg as, bs;
  TileLoader la, lb;
  // Accumulators and the threads' places in the tiles (place_threads).
  std::vector<Reg> acc;
  Reg tx, ty, a_frag, b_frag;
  Reg sums_here, row_sum, row_sum_smem;
  Reg g, q, warp_m, warp_n;
  int m_tiles = 4;
  Reg a_mma, b_mma;

  Reg widen(Reg r) { return it == Type::u32 ? r : b.cvt(Type::u64, r); }
  // The element offset of batch item z's (zc's) base along `strides`, from `base`.
  Reg batch_offset(const std::vector<int64_t>& strides, int64_t base) {
    return zc.empty() ? b.mov(it, imm_index(it, base)) : linear_offset(b, zc, strides, base);
  }

  // The kernel's parameters: a, b, the extras some body reads, the outputs, then those of row
  // sums, block sums, split-K's partials and counters and the tensor maps where the op has them.
  void declare_params() {
    pa = b.param("a", Type::u64), pb = b.param("b", Type::u64);
    // Extra inputs the epilogues read; each one's strides against the logical domain.
    std::vector<ScalarExp> bodies = f.epilogues;  // every body the kernel evaluates
    if (f.block_sums) bodies.push_back(f.block_sums_body);
    for (int j = 0; j < f.extras; ++j)
      for (const ScalarExp& e : bodies)
        if (e.depends_on(1 + j)) {
          read_extras.push_back(j);
          break;
        }
    p_extra.resize(static_cast<size_t>(f.extras));
    for (int j : read_extras) p_extra[static_cast<size_t>(j)] = b.param("x" + std::to_string(j), Type::u64);
    for (size_t r = 0; r < f.epilogues.size(); ++r) p_out.push_back(b.param("c" + std::to_string(r), Type::u64));
    p_sums = f.a_row_sums ? b.param("row_sums", Type::u64) : Reg{};
    p_block_sums = f.block_sums ? b.param("block_sums", Type::u64) : Reg{};
    p_partials = splits > 1 ? b.param("partials", Type::u64) : Reg{};
    p_counters = splits > 1 ? b.param("tile_counters", Type::u64) : Reg{};
    if (tensor_copies) copies.maps = {b.param("a_map", Type::u64), b.param("b_map", Type::u64)};
  }

  // The thread, the tile's first row and column, the batch item (and split), and the batch item's
  // bases of a, b, the output and the extras read.
  void locate_block() {
    tid = b.sreg(SReg::tid_x);
    m0 = widen(b.mul(Type::u32, b.sreg(SReg::ctaid_y), imm_u32(static_cast<uint32_t>(tile.tm))));
    n0 = widen(b.mul(Type::u32, b.sreg(SReg::ctaid_x), imm_u32(static_cast<uint32_t>(tile.tn))));

    // Batch offsets of a, b, the extras and the outputs for logical batch index z (grid z is z x
    // splits + split).
    grid_z = widen(b.sreg(SReg::ctaid_z));
    z = splits > 1 ? b.div(it, grid_z, imm_index(it, splits)) : grid_z;
    zc = coordinates(b, z, f.batch);
    // Each operand is f32, or bf16 (widened to f32 as it is loaded: the products of bf16 values are
    // exact in f32 and in tf32, so both the FFMA and the tf32 kernels compute them exactly).
    a_dtype = c.info(op.inputs[0]).dtype, b_dtype = c.info(op.inputs[1]).dtype;
    a_base = b.address(pa, batch_offset(f.a.batch, f.a.offset), static_cast<int>(dtype_size(a_dtype)));
    b_base = b.address(pb, batch_offset(f.b.batch, f.b.offset), static_cast<int>(dtype_size(b_dtype)));
    out_off = batch_offset(f.out_batch, 0);
    extra_base.resize(static_cast<size_t>(f.extras));
    for (int j : read_extras) {
      const auto ju = static_cast<size_t>(j);
      std::vector<int64_t> batch_part(extra_strides[ju].begin(), extra_strides[ju].begin() + nb);
      extra_base[ju] = b.address(p_extra[ju], batch_offset(batch_part, 0), 4);
    }
  }

  // The operands' shared tiles (as, bs; the wgmma stages' barriers with tensor copies) and, for
  // the FFMA kernels, the loaders that fill them.
  void allocate_tiles() {
    pitch_a = tile.tm + tile.pitch_pad, pitch_b = tile.tn + tile.pitch_pad;
    // The FFMA-kernel tiles (f32 FFMA, tf32 without the cp.async mma kernel; staged through
    // registers, or copied by cp.async: TileLoader): one buffer an operand for tf32; the FFMA
    // tiles take two, so that a step stores the next tile into the other buffer and waits at one
    // barrier instead of two (the loop unrolled by two: each half's buffer at immediate offsets).
    a_buffer_bytes = 4 * kTileK * pitch_a, b_buffer_bytes = 4 * kTileK * pitch_b;
    ffma_buffers = tile.tf32 ? 1 : 2;
    // cp.async mma: mma.stages stages per operand (wgmma: both in one array, from its first
    // 1024-byte boundary); else ffma_buffers f32 tiles each.
    if (mma.wgmma) {
      Reg tiles = b.shared_addr(b.shared_array("tiles", mma_shared_bytes(*mma_stages, mma), 1024));
      as = b.and_(Type::u32, b.add(Type::u32, tiles, imm_u32(1023)), imm_u32(~1023u));
      bs =
          b.add(Type::u32, as, imm_u32(static_cast<uint32_t>(mma.stages) * mma.stage_bytes((*mma_stages)[0], tile.tm)));
      if (tensor_copies)
        copies.barriers = b.shared_addr(b.shared_array("stage_barriers", 8 * static_cast<int64_t>(mma.stages), 8));
    } else {
      as = b.shared_addr(b.shared_array("a_tile", cp_async_mma ? mma.stages * mma.stage_bytes((*mma_stages)[0], tile.tm)
                                                               : ffma_buffers * a_buffer_bytes));
      bs = b.shared_addr(b.shared_array("b_tile", cp_async_mma ? mma.stages * mma.stage_bytes((*mma_stages)[1], tile.tn)
                                                               : ffma_buffers * b_buffer_bytes));
    }
    if (!cp_async_mma) {
      la = make_loader(b, it, a_base, f.a, a_dtype, M, K, tile.tm, pitch_a, tile.tf32, m0, tid, as);
      lb = make_loader(b, it, b_base, f.b, b_dtype, N, K, tile.tn, pitch_b, tile.tf32, n0, tid, bs);
    }
  }

  // The accumulators (zero), and the thread's place in the tiles: FFMA tiles' (tx, ty) and
  // fragment addresses, row sums' thread and register, tensor-core tiles' warp and lane.
  void place_threads() {
    // acc[i * pn + j]: row ty*4 + i (quadrants of 4 rows 64 apart), column tx*4 + j (likewise).
    for (int e = 0; e < tile.pm * tile.pn; ++e) acc.push_back(b.mov(Type::f32, imm_f32(0.0f)));
    // FFMA tiles: thread (tx, ty) of 16 x 16; its fragments' shared addresses.
    if (!tile.tf32) {
      tx = b.and_(Type::u32, tid, imm_u32(15));
      ty = b.shr(Type::u32, tid, imm_u32(4));
      a_frag = b.mad(Type::u32, ty, imm_u32(4 * kQuadrant), as);
      b_frag = b.mad(Type::u32, tx, imm_u32(4 * kQuadrant), bs);
    }
    // Row sums of a: the blocks of the first column of tiles see every k of their rows; thread r
    // < tm adds row r of each a tile (prologue applied, zero past K) in order of k.
    if (f.a_row_sums) {
      sums_here = b.and_(Type::pred, b.setp(Cmp::eq, b.sreg(SReg::ctaid_x), imm_u32(0)),
                         b.setp(Cmp::lt, tid, imm_u32(static_cast<uint32_t>(tile.tm))));
      row_sum = b.mov(Type::f32, imm_f32(0.0f));
      row_sum_smem = b.mad(Type::u32, tid, imm_u32(4), as);
    }
    // tf32 (and bf16 mma): warp w computes rows 64 (w / 4) .. + 63 and columns wn (w % 4) .. +
    // wn - 1 of the tile (wn = tn / 4: 32, or 64 in the bf16 kernel's 128x256 tiles); lane l
    // holds fragments by the PTX ISA's tables (g = l / 4, q = l % 4): a_i at row g + 8 (i % 2), k
    // q + 4 (i / 2); b_i at k q + 4 i, column g; c_i at row g + 8 (i / 2), column 2 q + i % 2.
    // acc[(mi * wn / 8 + ni) * 4 + i] belongs to the 16x8 product (mi, ni).
    // wgmma: warp w holds rows 64 (w / 4) + 16 (w % 4) + g (and + 8) of all tn columns, D's 4 j + i
    // at column 8 j + 2 q + i % 2: the same walk with one 16-row product (m_tiles) and tn / 8
    // along n, from warp_n 0.
    if (tile.tf32) {
      Reg lane = b.and_(Type::u32, tid, imm_u32(31)), warp = b.shr(Type::u32, tid, imm_u32(5));
      g = b.shr(Type::u32, lane, imm_u32(2));
      q = b.and_(Type::u32, lane, imm_u32(3));
      if (mma.wgmma) {
        m_tiles = 1;
        warp_m = b.mul(Type::u32, warp, imm_u32(16));
        warp_n = b.mov(Type::u32, imm_u32(0));
      } else {
        warp_m = b.mul(Type::u32, b.div(Type::u32, warp, imm_u32(kWarpsN)), imm_u32(kWarpTileM));
        warp_n = b.mul(Type::u32, b.rem(Type::u32, warp, imm_u32(kWarpsN)),
                       imm_u32(static_cast<uint32_t>(tile.tn / kWarpsN)));
      }
    }
    // a_mma, b_mma: shared addresses of (k q, row warp_m + g) and (k q, column warp_n + g)
    if (tile.tf32 && !cp_async_mma) {
      a_mma =
          b.mad(Type::u32, b.mad(Type::u32, q, imm_u32(static_cast<uint32_t>(pitch_a)), b.add(Type::u32, warp_m, g)),
                imm_u32(4), as);
      b_mma =
          b.mad(Type::u32, b.mad(Type::u32, q, imm_u32(static_cast<uint32_t>(pitch_b)), b.add(Type::u32, warp_n, g)),
                imm_u32(4), bs);
    }
  }

  // The single-buffer tf32 loop's products of k step kk (of 8) from the tiles in shared memory.
  void mma_step(int kk) {
    std::vector<std::vector<kir::Operand>> a_frag(4), b_frag(4);
    for (int mi = 0; mi < 4; ++mi)
      for (int i = 0; i < 4; ++i)
        a_frag[static_cast<size_t>(mi)].push_back(
            b.ld(Space::shared, Type::f32, a_mma, 4 * ((kk + 4 * (i / 2)) * pitch_a + mi * 16 + 8 * (i % 2))));
    for (int ni = 0; ni < 4; ++ni)
      for (int i = 0; i < 2; ++i)
        b_frag[static_cast<size_t>(ni)].push_back(
            b.ld(Space::shared, Type::f32, b_mma, 4 * ((kk + 4 * i) * pitch_b + ni * 8)));
    for (int mi = 0; mi < 4; ++mi)
      for (int ni = 0; ni < 4; ++ni) {
        const size_t at = static_cast<size_t>((mi * 4 + ni) * 4);
        std::vector<kir::Operand> c_frag(acc.begin() + static_cast<std::ptrdiff_t>(at),
                                         acc.begin() + static_cast<std::ptrdiff_t>(at + 4));
        const std::vector<Reg> d = b.mma(kir::MmaShape::m16n8k8_tf32, a_frag[static_cast<size_t>(mi)],
                                         b_frag[static_cast<size_t>(ni)], c_frag);
        for (size_t i = 0; i < 4; ++i) b.set(acc[at + i], d[i]);
      }
  }

  // The main loop over k: the cp.async mma kernel's (matmul_mma_loop.cpp, over the block's split
  // of k), or the FFMA kernels' (ffma_main_loop). Leaves the tile's sums in acc.
  void main_loop() {
    if (cp_async_mma) {
      kir::Operand k_begin = imm_index(it, 0), k_end = imm_index(it, K);
      if (splits > 1) {
        Reg first = b.mul(it, b.rem(it, grid_z, imm_index(it, splits)), imm_index(it, k_split));
        k_begin = first;
        k_end = b.min(it, b.add(it, first, imm_index(it, k_split)), imm_index(it, K));
      }
      mma_main_loop(b, it, {a_base, b_base}, {&f.a, &f.b}, *mma_stages, mma, {M, N}, K, k_begin, k_end, {m0, n0}, tid,
                    {as, bs}, warp_m, warp_n, acc, tensor_copies ? &copies : nullptr);
    } else {
      ffma_main_loop();
    }
  }

  // The FFMA kernels' loop (f32 FFMA tiles, or tf32 mma.sync without cp.async): the tiles through
  // the loaders, row sums of a as each tile lands, the next tile's loads before this tile's math.
  void ffma_main_loop() {
    // Loaders that copy by cp.async (TileLoader::async) commit a group a fetch and wait for it
    // before the barrier after which the tile is read.
    const bool async_tiles = la.async || lb.async;
    auto commit = [&] {
      if (async_tiles) b.cp_async_commit();
    };
    auto landed = [&] {
      if (async_tiles) b.cp_async_wait(0);
    };
    fetch_tile(b, it, la, b.mov(it, imm_index(it, 0)));
    fetch_tile(b, it, lb, b.mov(it, imm_index(it, 0)));
    commit();
    // Row sums of the tile in buffer `buffer` (its k in order).
    auto add_row_sums = [&](int64_t buffer) {
      if (!f.a_row_sums) return;
      b.if_(sums_here, [&] {
        for (int kk = 0; kk < kTileK; ++kk)
          b.assign(kir::Opc::Add, row_sum,
                   {row_sum, b.ld(Space::shared, Type::f32, row_sum_smem, buffer * a_buffer_bytes + 4 * kk * pitch_a)});
      });
    };
    // The FFMAs of the tile in buffer `buffer`: per k, the thread's pm values of a and pn of b.
    auto ffma_tile = [&](int64_t buffer) {
      for (int kk = 0; kk < kTileK; ++kk) {
        std::vector<Reg> av, bv;
        for (int q = 0; q < tile.pm / kQuadrant; ++q)
          for (Reg r : b.ld_vec(Space::shared, Type::f32, a_frag, 4,
                                buffer * a_buffer_bytes + 4 * (kk * tile.tm + q * kQuadrantSpacing)))
            av.push_back(r);
        for (int q = 0; q < tile.pn / kQuadrant; ++q)
          for (Reg r : b.ld_vec(Space::shared, Type::f32, b_frag, 4,
                                buffer * b_buffer_bytes + 4 * (kk * tile.tn + q * kQuadrantSpacing)))
            bv.push_back(r);
        for (int i = 0; i < tile.pm; ++i)
          for (int j = 0; j < tile.pn; ++j)
            b.assign(
                kir::Opc::Fma, acc[static_cast<size_t>(i * tile.pn + j)],
                {av[static_cast<size_t>(i)], bv[static_cast<size_t>(j)], acc[static_cast<size_t>(i * tile.pn + j)]});
      }
    };
    if (tile.tf32) {  // one buffer: store, barrier, the products, barrier
      // (No copies here: they would land in the buffer the products read. make_loader gives tf32
      // tiles none.)
      if (async_tiles) throw Error("fused_matmul: cp.async tiles in the single-buffer tf32 loop");
      b.for_(imm_index(it, 0), imm_index(it, K), imm_index(it, kTileK), [&](Reg k0) {
        store_tile(b, la);
        store_tile(b, lb);
        b.bar();
        add_row_sums(0);
        // The next tile's loads are in flight during this tile's products (zero past K: no load).
        Reg next = b.add(it, k0, imm_index(it, kTileK));
        fetch_tile(b, it, la, next);
        fetch_tile(b, it, lb, next);
        for (int kk = 0; kk < kTileK; kk += 8) mma_step(kk);
        b.bar();
      });
    } else {  // two buffers: the tile at k0 in `buffer`, the next one stored into the other
      store_tile(b, la);
      store_tile(b, lb);
      landed();
      b.bar();
      auto step = [&](Reg k0, int64_t buffer) {
        Reg next = b.add(it, k0, imm_index(it, kTileK));
        // In flight during this tile's FFMAs (zero past K: no load); async loaders copy into the
        // other buffer, which every warp finished reading before the last barrier.
        fetch_tile(b, it, la, next, (1 - buffer) * a_buffer_bytes);
        fetch_tile(b, it, lb, next, (1 - buffer) * b_buffer_bytes);
        commit();
        add_row_sums(buffer);
        ffma_tile(buffer);
        store_tile(b, la, (1 - buffer) * a_buffer_bytes);
        store_tile(b, lb, (1 - buffer) * b_buffer_bytes);
        landed();
        b.bar();  // the next tile stored, and every read of this buffer done before it is refilled
      };
      b.for_(imm_index(it, 0), imm_index(it, K), imm_index(it, 2 * kTileK), [&](Reg k0) {
        step(k0, 0);
        Reg k1 = b.add(it, k0, imm_index(it, kTileK));
        b.if_(b.setp(Cmp::lt, k1, imm_index(it, K)), [&] { step(k1, 1); });
      });
    }
  }

  // The epilogue (matmul_epilogue.cpp) on the accumulators, then the row sums of a, stored by the
  // threads that added them.
  MatmulEpilogueEmitted store_results() {
    const MatmulEpilogueEmitted stored = emit_matmul_epilogue({.b = b,
                                                               .it = it,
                                                               .f = f,
                                                               .read_extras = read_extras,
                                                               .extra_strides = extra_strides,
                                                               .extra_base = extra_base,
                                                               .out_off = out_off,
                                                               .p_out = p_out,
                                                               .p_block_sums = p_block_sums,
                                                               .p_partials = p_partials,
                                                               .p_counters = p_counters,
                                                               .tile = tile,
                                                               .mma = mma,
                                                               .mma_stages = mma_stages,
                                                               .threads = threads,
                                                               .splits = splits,
                                                               .grid_m = grid_m,
                                                               .grid_n = grid_n,
                                                               .z = z,
                                                               .grid_z = grid_z,
                                                               .m0 = m0,
                                                               .n0 = n0,
                                                               .tid = tid,
                                                               .as = as,
                                                               .tx = tx,
                                                               .ty = ty,
                                                               .warp_m = warp_m,
                                                               .warp_n = warp_n,
                                                               .g = g,
                                                               .q = q,
                                                               .m_tiles = m_tiles,
                                                               .acc = acc});
    if (f.a_row_sums) {
      Reg row = b.add(it, m0, widen(tid));
      b.if_(b.and_(Type::pred, sums_here, b.setp(Cmp::lt, row, imm_index(it, M))), [&] {
        Reg at = b.mad(it, z, imm_index(it, M), row);
        b.st(Space::global, Type::f32, b.address(p_sums, at, 4), row_sum);
      });
    }
    return stored;
  }

  // The op's lowering: the kernel's arguments, scratch and tensor maps, its launch (with the FFMA
  // kernel's thread and occupancy hints) and summary. The last to touch the builder.
  LoweredOp finish(const char* prefix, const MatmulEpilogueEmitted& stored) {
    std::vector<ArgRef> args{{ArgRef::Kind::Input, 0}, {ArgRef::Kind::Input, 1}};
    for (int j : read_extras) args.push_back({ArgRef::Kind::Input, 2 + j});
    for (size_t r = 0; r < f.epilogues.size(); ++r) args.push_back({ArgRef::Kind::Output, static_cast<int>(r)});
    if (f.a_row_sums || f.block_sums) args.push_back({ArgRef::Kind::Output, static_cast<int>(f.epilogues.size())});
    LoweredOp lo;
    if (splits > 1) {
      args.push_back({ArgRef::Kind::Scratch, 0});
      args.push_back({ArgRef::Kind::Scratch, 1});
      lo.scratch_bytes = {static_cast<size_t>(batch * splits * M * N) * 4,
                          static_cast<size_t>(batch * grid_m * grid_n) * 4};
      lo.zeroed_scratch = {1};
    }
    if (tensor_copies) {
      args.push_back({ArgRef::Kind::TensorMap, 0});
      args.push_back({ArgRef::Kind::TensorMap, 1});
      lo.tensor_maps = {wgmma_tensor_map(0, f.a, (*mma_stages)[0], mma, M, K),
                        wgmma_tensor_map(1, f.b, (*mma_stages)[1], mma, N, K)};
    }
    // The FFMA kernel declares its 256 threads: ptxas then allocates fewer registers (the 128x128
    // tiles' two-buffer loop: 123 against 131 undeclared), which keeps two blocks an SM. 128x128
    // tiles also ask for those two blocks (.minnctapersm 2): told its budget of 128 registers,
    // ptxas spends it on issuing the next tile's loads earlier instead of keeping under it by
    // moving them to the step's end (GPT-2's f32 x W^T products: 113 registers with every load
    // after the last FFMA of the step, 128 with the last one after FFMA 768 of 1024 and 715 in the
    // other half of the loop; docs/BENCHMARKS.md).
    // Not 64x64 tiles: at 63 registers four blocks fit an SM, which the same hint would let ptxas
    // trade for 72. Not with a prologue or row sums either: the prim case with both (and two
    // epilogues) takes 149 registers, and held to 128 it spills (972 bytes).
    if (!cp_async_mma && !tile.tf32) {
      b.declare_block_threads(threads);
      const bool lean = f.a.prologue == se::in(0) && f.b.prologue == se::in(0) && !f.a_row_sums;
      if (tile.tm == 128 && lean) b.declare_min_blocks_per_sm(2);
    }
    lo.launches.push_back(finish_launch(
        b, prefix,
        {static_cast<uint32_t>(grid_n), static_cast<uint32_t>(grid_m), static_cast<uint32_t>(batch * splits)},
        {static_cast<uint32_t>(threads), 1, 1}, std::move(args)));
    lo.summary = summary(lo.launches.back(), stored);
    return lo;
  }

  // The kernel's summary line: op, tiles, threads, kernel and its stages, split-K, launch, and how
  // the epilogue stored.
  std::string summary(const Launch& launch, const MatmulEpilogueEmitted& stored) const {
    std::string text;
    const char* operands = bf16_values ? ", bf16 operands" : "";
    if (mma.wgmma)
      text = fmt::format(
          "{}: tile {}x{}x{}, {} threads, wgmma m64n{}k16 bf16 on {} warpgroups, operands in 128-byte swizzled "
          "stages ({}, {}), {} {} stages{}, {}",
          op.prim->name, tile.tm, tile.tn, mma.tile_k(), threads, tile.tn, tile.tm == 128 ? "two" : "three",
          (*mma_stages)[0] == MmaStage::row_k ? "a K-major" : "a MN-major",
          (*mma_stages)[1] == MmaStage::row_k ? "b K-major" : "b MN-major", mma.stages,
          tensor_copies ? "tensor-copy" : "cp.async",
          splits > 1 ? fmt::format(", K split {} ways ({} each, partials added in order by each tile's last block)",
                                   splits, k_split)
                     : std::string(),
          launch_text(launch));
    else if (cp_async_mma)
      text = fmt::format(
          "{}: tile {}x{}x{}, {} threads, mma.sync {} on warp tiles {}x{}, {}, {} cp.async stages{}, {}", op.prim->name,
          tile.tm, tile.tn, mma.tile_k(), threads, mma_input == MmaInput::bf16 ? "bf16" : "tf32", kWarpTileM,
          tile.tn / kWarpsN, mma_input == MmaInput::bf16 ? "ldmatrix" : "fragments rounded to tf32 in registers",
          mma.stages,
          splits > 1 ? fmt::format(", K split {} ways ({} each, partials added in order by each tile's last block)",
                                   splits, k_split)
                     : std::string(),
          launch_text(launch));
    else
      text = tile.tf32 ? fmt::format("{}: tile {}x{}x{}, {} threads, mma.sync tf32 on warp tiles {}x{}{}, {}",
                                     op.prim->name, tile.tm, tile.tn, kTileK, threads, kWarpTileM, tile.tn / kWarpsN,
                                     operands, launch_text(launch))
                       : fmt::format("{}: tile {}x{}x{}, {} threads x {}x{} outputs{}, {}", op.prim->name, tile.tm,
                                     tile.tn, kTileK, threads, tile.pm, tile.pn, operands, launch_text(launch));
    if (mma.wgmma && !tensor_copies && mma.products_first) text += ", a step's products issued before its copies";
    if (stored.staged_emitted)
      text += stored.staged_chunks ? ", interior tiles stored through shared memory 16 bytes a store"
                                   : ", interior tiles stored through shared memory a row a warp";
    if (f.block_sums) text += ", with the 128-row block sums of an epilogue";
    return text;
  }
};

}  // namespace

LoweredOp lower_matmul_program(const Circuit& c, const Op& op, const FusedMatmul& program, const char* prefix,
                               const Target& target) {
  MatmulPlan plan = plan_matmul(c, op, program, target);
  KernelBuilder b(prefix);
  MatmulKernel k(std::move(plan), b, c, op);
  k.declare_params();
  k.locate_block();
  k.allocate_tiles();
  k.place_threads();
  k.main_loop();
  const MatmulEpilogueEmitted stored = k.store_results();
  return k.finish(prefix, stored);
}

namespace {

LoweredOp lower_fused_matmul(const Circuit& c, const Op& op, const Target& target) {
  return lower_matmul_program(c, op, FusedMatmul::from_params(op.params), "kiln_fused_matmul", target);
}

}  // namespace

void register_fused_matmul_lowering(LoweringTable& t) {
  t.add(PrimId::fused_matmul, lower_fused_matmul,
        "the matmul kernel reading through views, prologues on load, epilogues on store");
}

namespace {

// Lowering of matmul (circuit/prims/matmul.cpp): the fused_matmul kernel running the program
// FusedMatmul::plain describes, the transposes folded into the operands' strides.
LoweredOp lower_matmul(const Circuit& c, const Op& op, const Target& target) {
  const MatmulParams mp = MatmulParams::of(op);
  LoweredOp lo = lower_matmul_program(
      c, op, FusedMatmul::plain(c.info(op.inputs[0]).shape, c.info(op.inputs[1]).shape, mp.transpose_a, mp.transpose_b),
      "kiln_matmul", target);
  lo.summary =
      fmt::format("matmul ta={} tb={}{}", mp.transpose_a, mp.transpose_b, lo.summary.substr(lo.summary.find(':')));
  return lo;
}

}  // namespace

void register_matmul_lowering(LoweringTable& t) {
  t.add(PrimId::matmul, lower_matmul, "64x64x16 shared-memory tiles, 4x4 per thread, FFMA");
}

}  // namespace kiln::cuda
