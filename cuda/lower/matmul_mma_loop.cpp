// The tensor-core matmul kernel's main loop (mma_main_loop, matmul.hpp): each operand's tile
// in 2-4 stages laid out as it is stored, filled by cp.async (or on wgmma, with
// MatmulPolicy::tensor_copies, by the tensor copy engine); products by mma.sync (bf16 fragments by
// ldmatrix into m16n8k16, tf32 fragments by scalar loads rounded in registers into m16n8k8; both
// into the tf32 FFMA-tile kernel's accumulator layout) or by wgmma from the stages.
#include <bit>
#include <functional>
#include <utility>

#include <kiln/cuda/lower/matmul.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_u32;

namespace {

// One main loop being built: mma_main_loop's arguments, the stages' sizes, and the copies'
// addressing that the three loops (mma.sync, wgmma on cp.async, wgmma on tensor copies) share.
class MmaLoop {
 public:
  MmaLoop(KernelBuilder& b, Type it, std::array<Reg, 2> base, std::array<const MatmulOperand*, 2> view,
          std::array<MmaStage, 2> layout, const MmaTiling& tiling, std::array<int64_t, 2> rows, int64_t K,
          kir::Operand k_begin, kir::Operand k_end, std::array<Reg, 2> row0, Reg tid, std::array<Reg, 2> smem,
          Reg warp_m, Reg warp_n, std::vector<Reg>& acc)
      : b(b),
        it(it),
        base(base),
        view(view),
        layout(layout),
        tiling(tiling),
        rows(rows),
        K(K),
        k_begin(k_begin),
        k_end(k_end),
        row0(row0),
        tid(tid),
        smem(smem),
        warp_m(warp_m),
        warp_n(warp_n),
        acc(acc),
        input(tiling.input),
        tile_k(tiling.tile_k()),
        e(element_bytes(input)),
        chunk_elements(16 / e),
        tile_rows{tiling.tm, tiling.tn},
        copiers{static_cast<uint32_t>(tiling.threads()), kMmaThreads},
        b_by_some(copiers[1] < static_cast<uint32_t>(tiling.threads())),
        pitch{stage_pitch_bytes(layout[0], tile_rows[0], input), stage_pitch_bytes(layout[1], tile_rows[1], input)},
        bytes{tiling.stage_bytes(layout[0], tile_rows[0]), tiling.stage_bytes(layout[1], tile_rows[1])},
        k_chunks(static_cast<uint32_t>(tile_k) / chunk_elements),
        stages(static_cast<uint32_t>(tiling.stages)) {
    if (b_by_some) copies_b = b.setp(Cmp::lt, tid, imm_u32(copiers[1]));
    read = offsets(0);
  }

  void mma_sync();
  void wgmma(const WgmmaTensorCopies* tensor_copies);

 private:
  Reg widen(Reg r) { return it == Type::u32 ? r : b.cvt(Type::u64, r); }

  // Where chunk `chunk` (of 16 bytes) of row `row` sits in a [row][k] stage.
  Reg swizzled(Reg row, Reg chunk) {
    Reg flip = b.and_(Type::u32, b.shr(Type::u32, row, imm_u32(1)), imm_u32(3));
    return b.mad(Type::u32, row, imm_u32(stage_pitch_bytes(MmaStage::row_k, 0, input)),
                 b.mul(Type::u32, b.xor_(Type::u32, chunk, flip), imm_u32(16)));
  }

  // Stage loads: operand o's rows x tile_k tile is rows x kc chunks of 16 bytes (ce = 8 bf16 or
  // 4 f32 elements, kc = tile_k / ce: 4, or 8 for wgmma); thread t copies chunks t, t + T, ... (T:
  // the operand's copiers)
  // [row][k]: chunk c is row c / kc, k ce (c % kc) .. + ce - 1. [k][row]: chunk c is k c / (rows
  // / ce), rows ce (c % (rows / ce)) .. + ce - 1. Elements past the matrix are zero-filled (the
  // copy reads only the bytes inside it). stage[o]: the byte offset of the stage filled;
  // chunk_at(o, r, kc): the chunk's offset in the stage ([row][k]: kc its chunk of the row;
  // [k][row]: kc its k), by the stage layouts of mma.sync or of wgmma.
  //
  // Steps of blocks whose tiles lie wholly inside both matrices (rows and k) take a fast path
  // instead: every chunk is whole, and chunk s of a thread is its chunk 0 moved by whole rows
  // ([row][k]: T / kc rows; [k][row]: T / (rows / ce) k), the same in every step: its stage
  // offset is chunk 0's (fast_dst, from before the loop) plus s times dst_stride, and its source
  // chunk 0's at k = 0 (fast_src) plus k0 and s times chunk_stride: immediates.
  Reg chunk_at(size_t o, Reg r, Reg kc) {
    if (!tiling.wgmma)  // [row][k]: swizzled; [k][row]: k row kc at kc pitch
      return layout[o] == MmaStage::row_k ? swizzled(r, kc)
                                          : b.mad(Type::u32, kc, imm_u32(pitch[o]), b.mul(Type::u32, r, imm_u32(e)));
    if (layout[o] == MmaStage::row_k)  // K-major: row r at 128 r, chunk kc at kc ^ (r % 8)
      return b.mad(Type::u32, r, imm_u32(128),
                   b.shl(Type::u32, b.xor_(Type::u32, kc, b.and_(Type::u32, r, imm_u32(7))), imm_u32(4)));
    // MN-major: rows r .. r + 7 (a chunk) of k row kc, in atom (r / 64, kc / 8) at 1024 (r / 64)
    // + sbo (kc / 8), its k row kc % 8 at 128 (kc % 8), chunk (r % 64) / 8 at that ^ (kc % 8).
    const uint32_t sbo = static_cast<uint32_t>(tile_rows[o]) / 64 * 1024;
    Reg j = b.and_(Type::u32, kc, imm_u32(7));
    Reg atom = b.mad(Type::u32, b.shr(Type::u32, r, imm_u32(6)), imm_u32(1024),
                     b.mul(Type::u32, b.shr(Type::u32, kc, imm_u32(3)), imm_u32(sbo)));
    Reg chunk = b.xor_(Type::u32, b.and_(Type::u32, b.shr(Type::u32, r, imm_u32(3)), imm_u32(7)), j);
    return b.add(Type::u32, atom, b.mad(Type::u32, j, imm_u32(128), b.shl(Type::u32, chunk, imm_u32(4))));
  }
  uint32_t chunks_per_thread(size_t o) const { return static_cast<uint32_t>(tile_rows[o]) * k_chunks / copiers[o]; }
  std::pair<Reg, Reg> chunk_coordinates(size_t o, uint32_t s) {  // (row, k chunk or k) of a thread's chunk s
    Reg chunk = s == 0 ? tid : b.add(Type::u32, tid, imm_u32(s * copiers[o]));
    const auto row_chunks = static_cast<uint32_t>(tile_rows[o]) / chunk_elements;
    const auto k_shift = static_cast<uint32_t>(std::countr_zero(k_chunks));  // k_chunks: 4 or 8
    if (layout[o] == MmaStage::row_k)
      return std::pair{b.shr(Type::u32, chunk, imm_u32(k_shift)), b.and_(Type::u32, chunk, imm_u32(k_chunks - 1))};
    return std::pair{b.mul(Type::u32, b.rem(Type::u32, chunk, imm_u32(row_chunks)), imm_u32(chunk_elements)),
                     b.div(Type::u32, chunk, imm_u32(row_chunks))};
  }
  // Bytes from a thread's chunk s to its chunk s + 1, and from k to k + 1, in the stored operand.
  int64_t chunk_stride(size_t o) const {
    const int64_t row_chunks = tile_rows[o] / chunk_elements;
    return layout[o] == MmaStage::row_k ? int64_t{copiers[o] / k_chunks} * view[o]->row_stride * e
                                        : int64_t{copiers[o]} / row_chunks * view[o]->k_stride * e;
  }
  int64_t k_stride_bytes(size_t o) const { return layout[o] == MmaStage::row_k ? int64_t{e} : view[o]->k_stride * e; }
  // Stage bytes from a thread's chunk s to its chunk s + 1: the rows or k they are apart times
  // the layout's bytes for one, the swizzles being the same for both ([row][k]: (row / 2) % 4 or
  // row % 8, rows 64, 48 or 32 apart; wgmma's [k][row]: k % 8, k 16 or 8 apart).
  uint32_t dst_stride(size_t o) const {
    const uint32_t row_chunks = static_cast<uint32_t>(tile_rows[o]) / chunk_elements;
    if (layout[o] == MmaStage::row_k) return copiers[o] / k_chunks * static_cast<uint32_t>(tile_k) * e;
    const uint32_t k_apart = copiers[o] / row_chunks;
    return tiling.wgmma ? k_apart / 8 * static_cast<uint32_t>(tile_rows[o]) / 64 * 1024 : k_apart * pitch[o];
  }
  void prepare_fast_copies() {
    for (size_t o = 0; o < 2; ++o) {
      auto [r, kc] = chunk_coordinates(o, 0);
      fast_dst[o] = b.add(Type::u32, chunk_at(o, r, kc), smem[o]);
      Reg grow = b.add(it, row0[o], widen(r));
      Reg gk = widen(layout[o] == MmaStage::row_k ? b.mul(Type::u32, kc, imm_u32(chunk_elements)) : kc);
      Reg at = layout[o] == MmaStage::row_k ? scaled_add(b, it, grow, view[o]->row_stride, gk)
                                            : scaled_add(b, it, gk, view[o]->k_stride, grow);
      fast_src[o] = b.address(base[o], at, static_cast<int>(e));
      Reg inside = b.setp(Cmp::le, b.add(it, row0[o], imm_index(it, tile_rows[o])), imm_index(it, rows[o]));
      rows_inside = o == 0 ? inside : b.and_(Type::pred, rows_inside, inside);
    }
  }
  // Emits operand o's copies `copy` for the threads that copy it (b in 192-row tiles: the first 256).
  void by_copiers(size_t o, const std::function<void()>& copy) {
    if (o == 1 && b_by_some)
      b.if_(copies_b, copy);
    else
      copy();
  }
  void issue_slow(Reg k0, std::array<Reg, 2> stage) {
    for (size_t o = 0; o < 2; ++o) {
      by_copiers(o, [&] {
        for (uint32_t s = 0; s < chunks_per_thread(o); ++s) {
          const bool row_k = layout[o] == MmaStage::row_k;
          auto [r, kc] = chunk_coordinates(o, s);
          Reg grow = b.add(it, row0[o], widen(r));
          Reg gk = b.add(it, k0, widen(row_k ? b.mul(Type::u32, kc, imm_u32(chunk_elements)) : kc));
          Reg ok =
              b.and_(Type::pred, b.setp(Cmp::lt, grow, imm_index(it, rows[o])), b.setp(Cmp::lt, gk, imm_index(it, K)));
          // The chunk's elements inside the matrix, e bytes each: min(K - gk, ce) along k, min(rows
          // - grow, ce) along rows; the copy zero-fills the rest.
          Reg left = row_k ? b.min(it, b.sub(it, imm_index(it, K), gk), imm_index(it, chunk_elements))
                           : b.min(it, b.sub(it, imm_index(it, rows[o]), grow), imm_index(it, chunk_elements));
          if (it != Type::u32) left = b.cvt(Type::u32, left);
          Reg copied = b.selp(Type::u32, b.mul(Type::u32, left, imm_u32(e)), imm_u32(0), ok);
          Reg at =
              row_k ? scaled_add(b, it, grow, view[o]->row_stride, gk) : scaled_add(b, it, gk, view[o]->k_stride, grow);
          Reg src = b.selp(Type::u64, b.address(base[o], at, static_cast<int>(e)), base[o], ok);
          Reg dst = b.add(Type::u32, chunk_at(o, r, kc), smem[o]);
          b.cp_async(b.add(Type::u32, dst, stage[o]), src, 16, copied);
        }
      });
    }
  }
  // One step's cp.async copies into `stage`: the fast path where the step lies inside both
  // matrices, else the checked one.
  void issue(Reg k0, std::array<Reg, 2> stage) {
    Reg inside =
        b.and_(Type::pred, rows_inside, b.setp(Cmp::le, b.add(it, k0, imm_index(it, tile_k)), imm_index(it, K)));
    b.if_(
        inside,
        [&] {
          Reg k64 = it == Type::u64 ? k0 : b.cvt(Type::u64, k0);
          for (size_t o = 0; o < 2; ++o)
            by_copiers(o, [&] {
              Reg src = b.mad(Type::u64, k64, kir::imm_u64(static_cast<uint64_t>(k_stride_bytes(o))), fast_src[o]);
              Reg dst = b.add(Type::u32, fast_dst[o], stage[o]);
              for (uint32_t s = 0; s < chunks_per_thread(o); ++s) {
                Reg from =
                    s == 0 ? src : b.add(Type::u64, src, kir::imm_u64(static_cast<uint64_t>(s * chunk_stride(o))));
                Reg to = s == 0 ? dst : b.add(Type::u32, dst, imm_u32(s * dst_stride(o)));
                b.cp_async(to, from, 16, imm_u32(16));
              }
            });
        },
        [&] { issue_slow(k0, stage); });
  }
  // The stage after `stage` (byte offsets, stage s of operand o at s * bytes[o]), cycling.
  void advance(std::array<Reg, 2> stage) {
    for (size_t o = 0; o < 2; ++o) {
      Reg next = b.add(Type::u32, stage[o], imm_u32(bytes[o]));
      b.set(stage[o], b.selp(Type::u32, imm_u32(0), next, b.setp(Cmp::eq, next, imm_u32(stages * bytes[o]))));
    }
  }
  std::array<Reg, 2> offsets(uint32_t s) {
    return std::array<Reg, 2>{b.mov(Type::u32, imm_u32(s * bytes[0])), b.mov(Type::u32, imm_u32(s * bytes[1]))};
  }
  // Emits `issue_step` where the step `ahead` k past k_begin lies before k_end: decided here
  // when both are immediates (no split), in the kernel otherwise.
  void if_step(int64_t ahead, const std::function<void()>& issue_step) {
    if (k_begin.is_imm && k_end.is_imm) {
      if (static_cast<int64_t>(k_begin.bits) + ahead < static_cast<int64_t>(k_end.bits)) issue_step();
      return;
    }
    b.if_(b.setp(Cmp::lt, b.add(it, k_begin, imm_index(it, ahead)), k_end), issue_step);
  }
  Reg k_at(int64_t ahead) { return ahead == 0 ? b.mov(it, k_begin) : b.add(it, k_begin, imm_index(it, ahead)); }

  // wgmma: steps whose stages are filled ahead of the one computed on.
  uint32_t ahead_steps() const { return stages - 2; }
  void wgmma_products();
  void wgmma_on_cp_async();
  void wgmma_on_tensor_copies(const WgmmaTensorCopies& copies);

  KernelBuilder& b;
  const Type it;
  const std::array<Reg, 2> base;
  const std::array<const MatmulOperand*, 2> view;
  const std::array<MmaStage, 2> layout;
  const MmaTiling& tiling;
  const std::array<int64_t, 2> rows;
  const int64_t K;
  const kir::Operand k_begin, k_end;
  const std::array<Reg, 2> row0;
  const Reg tid;
  const std::array<Reg, 2> smem;
  const Reg warp_m, warp_n;
  std::vector<Reg>& acc;

  // Derived from the arguments above; the initializers read only members declared before them
  // (keep this order).
  const MmaInput input;
  const int tile_k;
  const uint32_t e, chunk_elements;
  const std::array<int, 2> tile_rows;
  // The threads that copy each operand's chunks: all of them for a (4 a thread whatever the
  // rows: a warpgroup per 64 rows), the first 256 for b (4 or 8 a thread, as in 128-row tiles).
  const std::array<uint32_t, 2> copiers;
  const bool b_by_some;
  const std::array<uint32_t, 2> pitch, bytes;
  const uint32_t k_chunks;
  const uint32_t stages;

  std::array<Reg, 2> fast_dst, fast_src;
  Reg rows_inside;
  Reg copies_b;                     // b_by_some: the threads that copy b
  std::array<Reg, 2> read;          // the stage computed on
  std::array<Reg, 2> desc;          // wgmma: the operands' matrix descriptors at stage 0
  std::array<uint32_t, 2> slice{};  // wgmma: descriptor bytes from one k16 slice to the next
};

void MmaLoop::wgmma(const WgmmaTensorCopies* tensor_copies) {
  if (!tensor_copies) prepare_fast_copies();
  // Descriptors (PTX ISA, sm_90): start >> 4 in bits 0-13, leading byte offset >> 4 in 16-29,
  // stride byte offset >> 4 in 32-45, 128-byte swizzle (1) in 62-63. K-major: SBO 1024 from one
  // 8-row atom to the next, LBO unused (16, as CUTLASS gives it), a k16 slice 32 bytes on.
  // MN-major: LBO 1024 from one 64-row atom to the next, SBO between 8-k atoms, a slice two of
  // those on. Warpgroup w's A rows start 64 rows on: 8 K-major atoms, or one MN-major atom.
  // Stage and slice offsets are added to the start field: shared addresses stay under 2^18, so
  // it never carries into the next.
  // With tensor copies an MN-major stage is its 64-row boxes one after another (wgmma_tensor_map):
  // LBO 8192 from one box to the next, SBO 1024 between 8-k atoms of a box.
  Reg group = b.shr(Type::u32, tid, imm_u32(7));
  for (size_t o = 0; o < 2; ++o) {
    const bool k_major = layout[o] == MmaStage::row_k;
    const uint32_t sbo = k_major || tensor_copies ? 1024 : static_cast<uint32_t>(tile_rows[o]) / 64 * 1024,
                   lbo = k_major         ? 16
                         : tensor_copies ? 8192
                                         : 1024;
    slice[o] = k_major ? 32 : 2 * sbo;
    Reg start = o == 0 ? b.mad(Type::u32, group, imm_u32(k_major || tensor_copies ? 8192 : 1024), smem[o]) : smem[o];
    Reg field = b.cvt(Type::u64, b.shr(Type::u32, start, imm_u32(4)));
    desc[o] =
        b.or_(Type::u64, field, kir::imm_u64(uint64_t{1} << 62 | uint64_t{sbo >> 4} << 32 | uint64_t{lbo >> 4} << 16));
  }
  // S stages, steps D = S - 2 ahead (ahead_steps): a step's products stay in flight
  // (wgmma.wait_group 1) until the next step's are issued, so the stage refilled at step i is
  // step i - 2's, which every warpgroup is done with once all have passed step i's barrier. Step
  // i waits for its own copies (on cp.async: D - 1 younger groups may stay in flight, and fences
  // them for wgmma's async proxy), meets the barrier, refills, and issues its four k16 products
  // as one group.
  if (tensor_copies)
    wgmma_on_tensor_copies(*tensor_copies);
  else
    wgmma_on_cp_async();
}

// One step's four k16 products on stage `read`, as one wgmma group.
void MmaLoop::wgmma_products() {
  std::array<Reg, 2> at;
  for (size_t o = 0; o < 2; ++o)
    at[o] = b.add(Type::u64, desc[o], b.cvt(Type::u64, b.shr(Type::u32, read[o], imm_u32(4))));
  b.wgmma_fence();
  for (uint32_t j = 0; j < kWgmmaTileK / 16; ++j) {
    std::array<kir::Operand, 2> d{at[0], at[1]};
    if (j > 0)
      for (size_t o = 0; o < 2; ++o) d[o] = b.add(Type::u64, at[o], kir::imm_u64(j * slice[o] >> 4));
    b.wgmma(tiling.tn, d[0], layout[0] == MmaStage::k_row, d[1], layout[1] == MmaStage::k_row, acc);
  }
  b.wgmma_commit();
}

void MmaLoop::wgmma_on_tensor_copies(const WgmmaTensorCopies& copies) {
  // Tensor copies: thread 0 fills each stage with one copy an operand (an MN-major one: one a
  // 64-row box), all completing on the stage's mbarrier, which it told to expect the stage's
  // bytes; elements past the matrix (rows or K) land as zeros. Every thread waits for the
  // stage's phase (stage s's n-th fill is phase n, waited for with parity n % 2), then meets
  // the barrier after which every warpgroup is done with step i - 2's stage, which thread 0
  // then refills. No fence.proxy.async: tensor copies and wgmma both go through the async proxy.
  const uint32_t stage_bytes = bytes[0] + bytes[1];
  auto barrier_of = [&](uint32_t s) { return b.add(Type::u32, copies.barriers, imm_u32(8 * s)); };
  Reg leader = b.setp(Cmp::eq, tid, imm_u32(0));
  b.if_(leader, [&] {
    for (size_t o = 0; o < 2; ++o) b.fence_proxy_tensormap(copies.maps[o]);  // copied from the host
    for (uint32_t s = 0; s < stages; ++s) b.mbarrier_init(barrier_of(s), imm_u32(1));
    b.fence_mbarrier_init();
  });
  b.bar();
  std::array<Reg, 2> row32;
  for (size_t o = 0; o < 2; ++o) row32[o] = b.cvt(Type::s32, row0[o]);
  auto fill = [&](Reg k0, std::array<Reg, 2> stage, Reg barrier) {
    b.if_(leader, [&] {
      b.mbarrier_arrive_expect_tx(barrier, imm_u32(stage_bytes));
      Reg k32 = b.cvt(Type::s32, k0);
      for (size_t o = 0; o < 2; ++o) {
        Reg dst = b.add(Type::u32, smem[o], stage[o]);
        if (layout[o] == MmaStage::row_k) {
          b.tensor_copy(dst, copies.maps[o], barrier, {k32, row32[o]});
          continue;
        }
        for (int p = 0; p < tile_rows[o] / 64; ++p)
          b.tensor_copy(p == 0 ? dst : b.add(Type::u32, dst, imm_u32(8192 * static_cast<uint32_t>(p))), copies.maps[o],
                        barrier, {p == 0 ? row32[o] : b.add(Type::s32, row32[o], kir::imm_s32(64 * p)), k32});
      }
    });
  };
  for (uint32_t s = 0; s < ahead_steps(); ++s)
    if_step(int64_t{s} * tile_k, [&] { fill(k_at(int64_t{s} * tile_k), offsets(s), barrier_of(s)); });
  const std::array<Reg, 2> write = offsets(ahead_steps());
  Reg read_barrier = barrier_of(0), write_barrier = barrier_of(ahead_steps()), parity = b.mov(Type::u32, imm_u32(0));
  auto next_barrier = [&](Reg at) {
    Reg next = b.add(Type::u32, at, imm_u32(8));
    Reg wraps = b.setp(Cmp::eq, next, b.add(Type::u32, copies.barriers, imm_u32(8 * stages)));
    b.set(at, b.selp(Type::u32, copies.barriers, next, wraps));
    return wraps;
  };
  b.for_(k_begin, k_end, imm_index(it, tile_k), [&](Reg k0) {
    b.mbarrier_wait(read_barrier, parity);
    b.bar();
    Reg ahead = b.add(it, k0, imm_index(it, int64_t{ahead_steps()} * tile_k));
    b.if_(b.setp(Cmp::lt, ahead, k_end), [&] { fill(ahead, write, write_barrier); });
    wgmma_products();
    b.wgmma_wait(1);
    advance(read);
    advance(write);
    Reg flipped = b.xor_(Type::u32, parity, imm_u32(1));
    Reg wrapped = next_barrier(read_barrier);  // the next fill of stage 0 is the next phase
    b.set(parity, b.selp(Type::u32, flipped, parity, wrapped));
    next_barrier(write_barrier);
  });
  b.wgmma_wait(0);
}

void MmaLoop::wgmma_on_cp_async() {
  for (uint32_t s = 0; s < ahead_steps(); ++s) {
    if_step(int64_t{s} * tile_k, [&] { issue(k_at(int64_t{s} * tile_k), offsets(s)); });
    b.cp_async_commit();  // possibly empty
  }
  // MatmulPolicy::products_first issues a step's products before its copies instead of after:
  // the same stages and waits (the refilled stage is still step i - 2's), but the products do
  // not queue behind 12 copies a thread (128x256 tiles) when the global-memory instruction
  // queue is full (LG throttle: 31% of the stall cycles at 8192 x 2304 x 768 on an H100).
  const bool products_first = tiling.products_first;
  const std::array<Reg, 2> write = offsets(ahead_steps());  // the stage refilled
  b.for_(k_begin, k_end, imm_index(it, tile_k), [&](Reg k0) {
    b.cp_async_wait(static_cast<int>(ahead_steps()) - 1);
    b.fence_proxy_async();
    b.bar();
    auto refill = [&] {
      Reg ahead = b.add(it, k0, imm_index(it, int64_t{ahead_steps()} * tile_k));
      b.if_(b.setp(Cmp::lt, ahead, k_end), [&] { issue(ahead, write); });
      b.cp_async_commit();  // possibly empty: one group a step
    };
    if (!products_first) refill();
    wgmma_products();
    if (products_first) refill();
    b.wgmma_wait(1);
    advance(read);
    advance(write);
  });
  b.wgmma_wait(0);
  b.cp_async_wait(0);
}

void MmaLoop::mma_sync() {
  prepare_fast_copies();
  Reg lane = b.and_(Type::u32, tid, imm_u32(31));
  const auto n_tiles = static_cast<size_t>(tiling.warp_n_tiles());
  // acc[(mi * n_tiles + ni) * 4 + i] += a(mi) b(ni), the fragments given.
  auto mma_all = [&](kir::MmaShape shape, const std::vector<std::vector<kir::Operand>>& fa,
                     const std::vector<std::vector<kir::Operand>>& fb) {
    for (size_t mi = 0; mi < 4; ++mi)
      for (size_t ni = 0; ni < n_tiles; ++ni) {
        const size_t at = (mi * n_tiles + ni) * 4;
        const std::vector<kir::Operand> c(acc.begin() + static_cast<std::ptrdiff_t>(at),
                                          acc.begin() + static_cast<std::ptrdiff_t>(at + 4));
        const std::vector<Reg> d = b.mma(shape, fa[mi], fb[ni], c);
        for (size_t i = 0; i < 4; ++i) b.set(acc[at + i], d[i]);
      }
  };
  std::function<void(std::array<Reg, 2>)> compute;  // one step's products on the stages given
  if (input == MmaInput::bf16) {
    // ldmatrix.x4 loads four 8x8 matrices, lanes 8j .. 8j + 7 giving the shared addresses of
    // matrix j's 8 rows. A (16 rows x 16 k; a0a1, a2a3, a4a5, a6a7): matrix j covers rows 8 (j %
    // 2), k 8 (j / 2); B (two n8 tiles x 16 k; b0b1, b2b3 of each): rows 8 (j / 2), k 8 (j % 2).
    // A lane's address is row (low) of its matrix for [row][k] stages, k (low) with .trans for
    // [k][row]. lane_at[o][h]: operand o's lane address for the k half h (k 16 h .. + 15) of a step.
    Reg low = b.and_(Type::u32, lane, imm_u32(7)),
        mid = b.and_(Type::u32, b.shr(Type::u32, lane, imm_u32(3)), imm_u32(1)),
        high = b.shr(Type::u32, lane, imm_u32(4));
    auto lane_address = [&](size_t o, Reg warp_row, Reg row_part, Reg k_part, uint32_t h) {
      Reg row = b.add(Type::u32, warp_row, b.mul(Type::u32, row_part, imm_u32(8)));
      Reg chunk = b.add(Type::u32, k_part, imm_u32(2 * h));  // of 8 k
      if (layout[o] == MmaStage::row_k) return b.add(Type::u32, swizzled(b.add(Type::u32, row, low), chunk), smem[o]);
      Reg k = b.mad(Type::u32, chunk, imm_u32(8), low);
      return b.mad(Type::u32, k, imm_u32(pitch[o]), b.mad(Type::u32, row, imm_u32(2), smem[o]));
    };
    const std::array<std::array<Reg, 2>, 2> lane_at{
        std::array<Reg, 2>{lane_address(0, warp_m, mid, high, 0), lane_address(0, warp_m, mid, high, 1)},
        std::array<Reg, 2>{lane_address(1, warp_n, high, mid, 0), lane_address(1, warp_n, high, mid, 1)}};
    // Rows 16 i further on (the swizzle repeats every 8 rows).
    auto fragments = [&, lane_at](size_t o, Reg stage, uint32_t h, uint32_t i) {
      const uint32_t rows_on = layout[o] == MmaStage::row_k ? i * 16 * pitch[o] : i * 16 * 2;
      return b.ldmatrix(4, layout[o] == MmaStage::k_row,
                        b.add(Type::u32, b.add(Type::u32, lane_at[o][h], stage), imm_u32(rows_on)));
    };
    compute = [&, fragments](std::array<Reg, 2> stage) {
      for (uint32_t h = 0; h < static_cast<uint32_t>(tile_k) / 16; ++h) {
        std::vector<std::vector<kir::Operand>> fa(4), fb(n_tiles);
        for (uint32_t mi = 0; mi < 4; ++mi)
          for (Reg r : fragments(0, stage[0], h, mi)) fa[mi].push_back(r);
        for (uint32_t nj = 0; nj < n_tiles / 2; ++nj) {
          const std::vector<Reg> m = fragments(1, stage[1], h, nj);
          fb[2 * nj] = {m[0], m[1]};
          fb[2 * nj + 1] = {m[2], m[3]};
        }
        mma_all(kir::MmaShape::m16n8k16_bf16, fa, fb);
      }
    };
  } else {
    // tf32: ldmatrix moves 16-bit elements, so each fragment element is a scalar shared load,
    // rounded to tf32 (cvt.rna) in registers. The m16n8k8 tables (g = lane / 4, q = lane % 4):
    // a_i at row g + 8 (i % 2), k q + 4 (i / 2); b_i at k q + 4 i, column g. An element dr rows
    // and dk k past the lane's own (row g, k q), dr a multiple of 8 and dk of 4, is at
    //  - [row][k]: swizzled(row, k / 4) + 4 q, the swizzle's flip (row / 2) % 4 unchanged by dr:
    //    the lane's base for chunk c = dk / 4 of the step's k, plus 64 dr;
    //  - [k][row]: (q + dk) pitch + 4 (row): the lane's base plus dk pitch + 4 dr.
    Reg g = b.shr(Type::u32, lane, imm_u32(2)), q = b.and_(Type::u32, lane, imm_u32(3));
    std::array<std::array<Reg, 4>, 2> lane_base;  // [o][c]: [row][k] by chunk; [k][row]: [o][0]
    const std::array<Reg, 2> warp_row{warp_m, warp_n};
    for (size_t o = 0; o < 2; ++o) {
      Reg row = b.add(Type::u32, warp_row[o], g);
      if (layout[o] == MmaStage::row_k) {
        Reg word = b.mad(Type::u32, q, imm_u32(4), smem[o]);
        for (uint32_t c = 0; c < 4; ++c)
          lane_base[o][c] = b.add(Type::u32, swizzled(row, b.mov(Type::u32, imm_u32(c))), word);
      } else {
        lane_base[o][0] = b.mad(Type::u32, q, imm_u32(pitch[o]), b.mad(Type::u32, row, imm_u32(4), smem[o]));
      }
    }
    auto element = [&, lane_base](size_t o, Reg stage, uint32_t dr, uint32_t dk) {
      const bool row_k = layout[o] == MmaStage::row_k;
      Reg at = b.add(Type::u32, row_k ? lane_base[o][dk / 4] : lane_base[o][0], stage);
      const int64_t offset = row_k ? int64_t{64} * dr : int64_t{dk} * pitch[o] + int64_t{4} * dr;
      return b.unary(kir::Opc::RoundTf32, Type::f32, b.ld(kir::Space::shared, Type::f32, at, offset));
    };
    compute = [&, element](std::array<Reg, 2> stage) {
      for (uint32_t kk = 0; kk < static_cast<uint32_t>(tile_k); kk += 8) {
        std::vector<std::vector<kir::Operand>> fa(4), fb(n_tiles);
        for (uint32_t mi = 0; mi < 4; ++mi)
          for (uint32_t i = 0; i < 4; ++i)
            fa[mi].push_back(element(0, stage[0], 16 * mi + 8 * (i % 2), kk + 4 * (i / 2)));
        for (uint32_t ni = 0; ni < n_tiles; ++ni)
          for (uint32_t i = 0; i < 2; ++i) fb[ni].push_back(element(1, stage[1], 8 * ni, kk + 4 * i));
        mma_all(kir::MmaShape::m16n8k8_tf32, fa, fb);
      }
    };
  }
  if (stages == 2) {
    // Two stages: the next step's copies are issued before this step's wait, so they are in
    // flight during it and the arithmetic; a second barrier keeps them off the stage until every
    // warp is done with it.
    if_step(0, [&] { issue(k_at(0), read); });
    b.cp_async_commit();
    b.for_(k_begin, k_end, imm_index(it, tile_k), [&](Reg k0) {
      Reg next = b.add(it, k0, imm_index(it, tile_k));
      const std::array<Reg, 2> other{b.xor_(Type::u32, read[0], imm_u32(bytes[0])),
                                     b.xor_(Type::u32, read[1], imm_u32(bytes[1]))};
      b.if_(b.setp(Cmp::lt, next, k_end), [&] { issue(next, other); });
      b.cp_async_commit();  // possibly empty: the group count stays one a step
      b.cp_async_wait(1);   // this step's stage has landed
      b.bar();
      compute(read);
      b.bar();  // every warp is done with this stage before the next step's copies refill it
      for (size_t o = 0; o < 2; ++o) b.set(read[o], other[o]);
    });
  } else {
    // S stages, one barrier a step: steps 0 .. S - 2 are issued first; step i waits for its
    // own group (S - 2 younger ones may stay in flight), meets the barrier (after which every
    // warp is done with step i - 1's stage), refills that stage with step i + S - 1, computes.
    for (uint32_t s = 0; s + 1 < stages; ++s) {
      if_step(int64_t{s} * tile_k, [&] { issue(k_at(int64_t{s} * tile_k), offsets(s)); });
      b.cp_async_commit();  // possibly empty
    }
    const std::array<Reg, 2> write = offsets(stages - 1);  // the stage refilled
    b.for_(k_begin, k_end, imm_index(it, tile_k), [&](Reg k0) {
      b.cp_async_wait(static_cast<int>(stages) - 2);
      b.bar();
      Reg ahead = b.add(it, k0, imm_index(it, static_cast<int64_t>(stages - 1) * tile_k));
      b.if_(b.setp(Cmp::lt, ahead, k_end), [&] { issue(ahead, write); });
      b.cp_async_commit();  // possibly empty: one group a step
      compute(read);
      advance(read);
      advance(write);
    });
  }
  b.cp_async_wait(0);
}

}  // namespace

void mma_main_loop(KernelBuilder& b, Type it, std::array<Reg, 2> base, std::array<const MatmulOperand*, 2> view,
                   std::array<MmaStage, 2> layout, const MmaTiling& tiling, std::array<int64_t, 2> rows, int64_t K,
                   kir::Operand k_begin, kir::Operand k_end, std::array<Reg, 2> row0, Reg tid, std::array<Reg, 2> smem,
                   Reg warp_m, Reg warp_n, std::vector<Reg>& acc, const WgmmaTensorCopies* tensor_copies) {
  MmaLoop loop(b, it, base, view, layout, tiling, rows, K, k_begin, k_end, row0, tid, smem, warp_m, warp_n, acc);
  if (tiling.wgmma)
    loop.wgmma(tensor_copies);
  else
    loop.mma_sync();
}

}  // namespace kiln::cuda
