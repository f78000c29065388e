// Lowering of column_sums (circuit/prims/column_sums.cpp). Rows of a multiple of 4 whose inputs
// allow it take the quad kernel (lower_column_sums_quads, below: four columns a lane, 16-byte
// loads, a block's warps on alternate rows). Otherwise a thread per column walks the rows in
// order, evaluates every body at each element (each input read at its broadcast address) and
// keeps one f32 accumulator per body. With many rows the rows are split into chunks across
// blocks (grid: column tiles x chunks), each writing its partial sums, and the last block of a
// column tile to arrive adds each of its columns' chunks in chunk order: no float atomics, so the
// sums do not depend on scheduling. Consecutive threads read consecutive columns, so the loads
// coalesce; each thread has 4 rows' loads in flight (measured on an H100: a thread per column
// waiting on one load at a time summed an 8192 x 768 gradient at about 160 GB/s). f32
// accumulation error bound rows * 2^-24 * sum |x| per column, as reduce.
#include <algorithm>
#include <array>
#include <functional>

#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;
using kir::SReg;

namespace {

constexpr int kUnroll = 4;       // rows a trip of a column's loop
constexpr int64_t kCombine = 8;  // partials a trip of the last block's combine

// Row chunks of the split kernel: none below 128 rows (one pass, a thread per column); else
// about 64 rows each, at most enough for about 256 blocks in all.
int64_t row_chunks(int64_t rows, int64_t col_tiles) {
  if (rows < 128) return 1;
  return std::clamp<int64_t>((rows + 63) / 64, 1, std::max<int64_t>(1, 256 / std::max<int64_t>(col_tiles, 1)));
}

// The quad kernel (lower_column_sums_quads): a block of kWarps warps sums kGroupColumns columns
// (four adjacent columns a lane, 16-byte loads) over a chunk of rows, warp w taking the chunk's
// rows w, w + kWarps, ...; kQuadUnroll rows' loads a trip in flight.
constexpr int kWarps = 8, kQuadUnroll = 8;
constexpr int64_t kGroupColumns = 128;
constexpr size_t kMaxQuadSums = 8;  // the block's shared partials: 4 KiB a sum

// The quad kernel applies where the row is a multiple of 4 and every input that varies along it
// is f32 with unit column stride and rows of whole 16-byte chunks (inputs constant along the row
// are read once a row, as scalars).
bool quads_apply(const Circuit& c, const Op& op, const std::vector<std::vector<int64_t>>& strides, int64_t cols,
                 size_t sums) {
  if (cols % 4 != 0 || sums > kMaxQuadSums) return false;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    if (strides[k].back() == 0) continue;
    if (c.info(op.inputs[k]).dtype != DType::f32 || strides[k].back() != 1) return false;
    for (size_t d = 0; d + 1 < strides[k].size(); ++d)
      if (strides[k][d] % 4 != 0) return false;
  }
  return true;
}

// Column sums with four columns a thread (quads_apply): block (group, chunk) sums columns [group
// kGroupColumns, ...) over rows [chunk chunk_rows, ...); each thread adds its rows in order,
// then the block's warps' sums are added in warp order through shared memory. With one chunk
// that is the result; otherwise each block writes its partials [sum][chunk][column] and the last
// block of a group to arrive adds the chunks, warp w those of chunks w, w + kWarps, ... in order,
// then the warps' in warp order. A fixed order throughout: no float atomics, the same bits on
// every run. Loads are 16 bytes where every column-varying input is 16-byte aligned (checked at
// run time: a view may start anywhere), four 4-byte loads otherwise.
LoweredOp lower_column_sums_quads(const Circuit& c, const Op& op, const Target& target, const ColumnSumsParams& cp,
                                  const std::vector<std::vector<int64_t>>& strides) {
  const Shape& domain = cp.domain;
  const std::vector<int64_t> lead(domain.dims().begin(), domain.dims().end() - 1);
  const int64_t cols = domain[domain.rank() - 1], rows = Shape(lead).numel();
  const size_t sums = cp.bodies.size();
  const int64_t groups = (cols + kGroupColumns - 1) / kGroupColumns;
  // Chunks of at least 64 rows (8 a warp), at most about 256 blocks in all.
  const int64_t wanted = std::clamp<int64_t>((rows + 63) / 64, 1, std::max<int64_t>(1, 256 / groups));
  const int64_t chunk_rows = std::max<int64_t>(1, (rows + wanted - 1) / wanted);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk_rows - 1) / chunk_rows);
  int64_t largest = domain.numel();
  for (ValueId v : op.inputs) largest = std::max(largest, c.info(v).shape.numel());
  largest = std::max<int64_t>(largest, static_cast<int64_t>(sums) * chunks * cols);
  const Type it = index_type(target, largest);

  KernelBuilder b("kiln_column_sums_quads");
  std::vector<ArgRef> args;
  std::vector<Reg> in_ptr, out_ptr;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    in_ptr.push_back(b.param("in" + std::to_string(k), Type::u64));
    args.push_back({ArgRef::Kind::Input, static_cast<int>(k)});
  }
  for (size_t r = 0; r < sums; ++r) {
    out_ptr.push_back(b.param("out" + std::to_string(r), Type::u64));
    args.push_back({ArgRef::Kind::Output, static_cast<int>(r)});
  }
  LoweredOp lo;
  Reg part, counters;
  if (chunks > 1) {
    part = b.param("partials", Type::u64);
    counters = b.param("counters", Type::u64);
    args.push_back({ArgRef::Kind::Scratch, 0});
    args.push_back({ArgRef::Kind::Scratch, 1});
    lo.scratch_bytes = {sums * static_cast<size_t>(chunks * cols) * 4, static_cast<size_t>(groups) * 4};
    lo.zeroed_scratch = {1};
  }
  auto index = [&](Reg r32) { return it == Type::u32 ? r32 : b.cvt(Type::u64, r32); };
  Reg tid = b.sreg(SReg::tid_x);
  Reg warp = b.shr(Type::u32, tid, imm_u32(5)), lane = b.and_(Type::u32, tid, imm_u32(31));
  Reg group = index(b.sreg(SReg::ctaid_x)), chunk = index(b.sreg(SReg::ctaid_y));
  Reg col = b.mad(it, group, imm_index(it, kGroupColumns), index(b.shl(Type::u32, lane, imm_u32(2))));
  Reg active = b.setp(Cmp::lt, col, imm_index(it, cols));
  // Block partials: [warp][sum][column of the group], 16-byte aligned for the lanes' quads.
  Reg smem = b.shared_addr(b.shared_array("warp_sums", kWarps * static_cast<int64_t>(sums) * kGroupColumns * 4, 16));
  Reg lane_smem = b.mad(Type::u32, warp, imm_u32(static_cast<uint32_t>(sums * kGroupColumns * 4)),
                        b.mad(Type::u32, lane, imm_u32(16), smem));
  using Quads = std::vector<std::array<Reg, 4>>;  // per sum, the lane's four columns
  auto zeros = [&] {
    Quads acc(sums);
    for (auto& a : acc)
      for (Reg& x : a) x = b.mov(Type::f32, imm_f32(0.0f));
    return acc;
  };
  auto add_into = [&](Quads& acc, size_t r, const std::array<Reg, 4>& x) {
    for (size_t j = 0; j < 4; ++j) b.assign(kir::Opc::Add, acc[r][j], {acc[r][j], x[j]});
  };
  // One row's four columns of every input (the same register four times for an input constant
  // along the row).
  auto load_row = [&](Reg row, bool vector) {
    std::vector<Reg> coords = coordinates(b, row, lead);
    coords.push_back(col);
    Quads vals;
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      Reg at = linear_offset(b, coords, strides[k], 0);
      if (strides[k].back() == 0) {
        Reg x = load_as_f32(b, c.info(op.inputs[k]).dtype, in_ptr[k], at);
        vals.push_back({x, x, x, x});
      } else if (vector) {
        const std::vector<Reg> x = b.ld_vec(Space::global, Type::f32, b.address(in_ptr[k], at, 4), 4);
        vals.push_back({x[0], x[1], x[2], x[3]});
      } else {
        Reg a = b.address(in_ptr[k], at, 4);
        vals.push_back({b.ld(Space::global, Type::f32, a), b.ld(Space::global, Type::f32, a, 4),
                        b.ld(Space::global, Type::f32, a, 8), b.ld(Space::global, Type::f32, a, 12)});
      }
    }
    return vals;
  };
  auto add_row = [&](Quads& acc, const Quads& vals) {
    for (size_t r = 0; r < sums; ++r) {
      std::array<Reg, 4> x;
      for (size_t j = 0; j < 4; ++j) {
        std::vector<Reg> in;
        for (const auto& v : vals) in.push_back(v[j]);
        x[j] = emit_scalar_exp(b, cp.bodies[r], in);
      }
      add_into(acc, r, x);
    }
  };
  // for (i = start; i < end; i += stride) use(load(i)) in order, trips of `unroll` loads before
  // their uses.
  auto strided = [&](Operand start, Operand end, int64_t stride, int64_t unroll, const std::function<Quads(Reg)>& load,
                     const std::function<void(const Quads&)>& use) {
    b.if_(b.setp(Cmp::lt, start, end), [&] {
      Reg count = b.div(it, b.add(it, b.sub(it, end, start), imm_index(it, stride - 1)), imm_index(it, stride));
      Reg main_end = b.mad(it, b.div(it, count, imm_index(it, unroll)), imm_index(it, unroll * stride), start);
      b.for_(start, main_end, imm_index(it, unroll * stride), [&](Reg i) {
        std::vector<Quads> trip;
        for (int64_t u = 0; u < unroll; ++u) trip.push_back(load(u == 0 ? i : b.add(it, i, imm_index(it, u * stride))));
        for (const Quads& vals : trip) use(vals);
      });
      b.for_(main_end, end, imm_index(it, stride), [&](Reg i) { use(load(i)); });
    });
  };
  Quads acc = zeros();
  Reg first = b.mul(it, chunk, imm_index(it, chunk_rows));
  Reg end = b.min(it, b.add(it, first, imm_index(it, chunk_rows)), imm_index(it, rows));
  Reg start = b.add(it, first, index(warp));
  Reg aligned = b.setp(Cmp::eq, imm_u32(0), imm_u32(0));
  for (size_t k = 0; k < op.inputs.size(); ++k)
    if (strides[k].back() != 0)
      aligned =
          b.and_(Type::pred, aligned,
                 b.setp(Cmp::eq, b.and_(Type::u64, in_ptr[k], imm_index(Type::u64, 15)), imm_index(Type::u64, 0)));
  auto sum_rows = [&](bool vector) {
    strided(
        start, end, kWarps, kQuadUnroll, [&](Reg row) { return load_row(row, vector); },
        [&](const Quads& vals) { add_row(acc, vals); });
  };
  b.if_(active, [&] {
    b.if_(
        aligned, [&] { sum_rows(true); }, [&] { sum_rows(false); });
  });
  // The warps' sums added in warp order through shared memory; thread t < kGroupColumns passes
  // column t's total of each sum to use(sum, column, total).
  auto add_warps = [&](const Quads& sums_of_warp, const std::function<void(size_t, Reg, Reg)>& use) {
    b.if_(active, [&] {
      for (size_t r = 0; r < sums; ++r)
        b.st_vec(Space::shared, Type::f32, lane_smem,
                 {sums_of_warp[r][0], sums_of_warp[r][1], sums_of_warp[r][2], sums_of_warp[r][3]},
                 static_cast<int64_t>(r) * kGroupColumns * 4);
    });
    b.bar();
    Reg column = b.add(it, b.mul(it, group, imm_index(it, kGroupColumns)), index(tid));
    b.if_(
        b.and_(Type::pred, b.setp(Cmp::lt, tid, imm_u32(kGroupColumns)), b.setp(Cmp::lt, column, imm_index(it, cols))),
        [&] {
          Reg at = b.mad(Type::u32, tid, imm_u32(4), smem);
          for (size_t r = 0; r < sums; ++r) {
            const int64_t off = static_cast<int64_t>(r) * kGroupColumns * 4;
            Reg total = b.ld(Space::shared, Type::f32, at, off);
            for (int64_t w = 1; w < kWarps; ++w)
              b.assign(kir::Opc::Add, total,
                       {total,
                        b.ld(Space::shared, Type::f32, at, off + w * static_cast<int64_t>(sums) * kGroupColumns * 4)});
            use(r, column, total);
          }
        });
  };
  auto store_result = [&](size_t r, Reg column, Reg total) {
    b.st(Space::global, Type::f32, b.address(out_ptr[r], column, 4), total);
  };
  if (chunks == 1) {
    add_warps(acc, store_result);
  } else {
    auto partial_at = [&](size_t r, Reg k, Reg column) {
      return b.mad(it, b.add(it, k, imm_index(it, static_cast<int64_t>(r) * chunks)), imm_index(it, cols), column);
    };
    add_warps(acc, [&](size_t r, Reg column, Reg total) {
      b.st(Space::global, Type::f32, b.address(part, partial_at(r, chunk, column), 4), total);
    });
    after_last_block(b, b.address(counters, group, 4), static_cast<uint32_t>(chunks), [&] {
      // Warp w adds chunks w, w + kWarps, ... of its lane's columns, in order; then the warps'.
      Quads total = zeros();
      b.if_(active, [&] {
        strided(
            index(warp), imm_index(it, chunks), kWarps, 4,
            [&](Reg k) {
              Quads partials;  // per sum
              for (size_t r = 0; r < sums; ++r) {
                const std::vector<Reg> x =
                    b.ld_vec(Space::global, Type::f32, b.address(part, partial_at(r, k, col), 4), 4);
                partials.push_back({x[0], x[1], x[2], x[3]});
              }
              return partials;
            },
            [&](const Quads& partials) {
              for (size_t r = 0; r < sums; ++r) add_into(total, r, partials[r]);
            });
      });
      add_warps(total, store_result);
    });
  }
  lo.launches.push_back(finish_launch(b, "kiln_column_sums_quads",
                                      {static_cast<uint32_t>(groups), static_cast<uint32_t>(chunks), 1},
                                      {kWarps * 32, 1, 1}, std::move(args)));
  lo.summary = "column_sums: " + std::to_string(sums) + " sums over " + std::to_string(rows) + " rows in " +
               std::to_string(chunks) + " chunks of " + std::to_string(chunk_rows) + ", four columns a lane (" +
               std::to_string(kGroupColumns) + " a block, its " + std::to_string(kWarps) +
               " warps on alternate rows, added in warp order)" +
               (chunks > 1 ? ", each column group's last block adds its chunks" : "") + ", " +
               launch_text(lo.launches.back());
  return lo;
}

LoweredOp lower_column_sums(const Circuit& c, const Op& op, const Target& target) {
  const ColumnSumsParams cp = ColumnSumsParams::of(op);
  {
    std::vector<std::vector<int64_t>> strides;
    for (ValueId v : op.inputs) strides.push_back(broadcast_strides(c.info(v).shape, cp.domain));
    if (quads_apply(c, op, strides, cp.domain[cp.domain.rank() - 1], cp.bodies.size()))
      return lower_column_sums_quads(c, op, target, cp, strides);
  }
  const Shape& domain = cp.domain;
  const std::vector<int64_t> lead(domain.dims().begin(), domain.dims().end() - 1);
  const int64_t cols = domain[domain.rank() - 1], rows = Shape(lead).numel();
  const size_t sums = cp.bodies.size();
  int64_t largest = domain.numel();
  for (ValueId v : op.inputs) largest = std::max(largest, c.info(v).shape.numel());
  const int64_t col_tiles = (cols + kElementwiseThreads - 1) / kElementwiseThreads;
  // Chunks of chunk_rows rows, as many as cover the rows: none empty (with the count clamped,
  // ceil(rows / chunks) rows a chunk can need fewer chunks, e.g. 16400 rows: 253 of 65). No
  // rows: one chunk (the sums are zeros).
  const int64_t wanted = row_chunks(rows, col_tiles);
  const int64_t chunk_rows = std::max<int64_t>(1, (rows + wanted - 1) / wanted);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk_rows - 1) / chunk_rows);
  largest = std::max<int64_t>(largest, static_cast<int64_t>(sums) * chunks * cols);
  const Type it = index_type(target, largest);

  KernelBuilder b("kiln_column_sums");
  std::vector<ArgRef> args;
  std::vector<Reg> in_ptr;
  std::vector<std::vector<int64_t>> strides;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    in_ptr.push_back(b.param("in" + std::to_string(k), Type::u64));
    args.push_back({ArgRef::Kind::Input, static_cast<int>(k)});
    strides.push_back(broadcast_strides(c.info(op.inputs[k]).shape, domain));
  }
  std::vector<Reg> out_ptr;
  for (size_t r = 0; r < sums; ++r) {
    out_ptr.push_back(b.param("out" + std::to_string(r), Type::u64));
    args.push_back({ArgRef::Kind::Output, static_cast<int>(r)});
  }
  // Each body's sum over rows [first, end) of column `col`, in row order. A trip of the main loop
  // takes kUnroll rows, issuing their loads before their adds (which keep the row order: the
  // same sums), so that a thread waits on kUnroll loads at once rather than on one at a time.
  auto column_sums = [&](Reg col, Operand first, Operand end) {
    std::vector<Reg> acc;
    for (size_t r = 0; r < sums; ++r) acc.push_back(b.mov(Type::f32, imm_f32(0.0f)));
    auto load_row = [&](Reg row) {
      std::vector<Reg> coords = coordinates(b, row, lead);
      coords.push_back(col);
      std::vector<Reg> vals;
      for (size_t k = 0; k < op.inputs.size(); ++k)
        vals.push_back(load_as_f32(b, c.info(op.inputs[k]).dtype, in_ptr[k], linear_offset(b, coords, strides[k], 0)));
      return vals;
    };
    auto add_row = [&](const std::vector<Reg>& vals) {
      for (size_t r = 0; r < sums; ++r)
        b.assign(kir::Opc::Add, acc[r], {acc[r], emit_scalar_exp(b, cp.bodies[r], vals)});
    };
    Reg whole = b.mul(it, b.div(it, b.sub(it, end, first), imm_index(it, kUnroll)), imm_index(it, kUnroll));
    Reg main_end = b.add(it, first, whole);
    b.for_(first, main_end, imm_index(it, kUnroll), [&](Reg row) {
      std::vector<std::vector<Reg>> rows_vals;
      for (int u = 0; u < kUnroll; ++u) rows_vals.push_back(load_row(u == 0 ? row : b.add(it, row, imm_index(it, u))));
      for (const std::vector<Reg>& vals : rows_vals) add_row(vals);
    });
    b.for_(main_end, end, imm_index(it, 1), [&](Reg row) { add_row(load_row(row)); });
    return acc;
  };
  LoweredOp lo;
  if (chunks == 1) {
    grid_stride_loop(b, it, cols, [&](Reg col) {
      std::vector<Reg> acc = column_sums(col, imm_index(it, 0), imm_index(it, rows));
      for (size_t r = 0; r < sums; ++r) b.st(Space::global, Type::f32, b.address(out_ptr[r], col, 4), acc[r]);
    });
    lo.launches.push_back(
        finish_launch(b, "kiln_column_sums", elementwise_grid(cols), {kElementwiseThreads, 1, 1}, std::move(args)));
    lo.summary = "column_sums: " + std::to_string(sums) + " sums over " + std::to_string(rows) +
                 " rows, a thread per column, " + launch_text(lo.launches.back());
    return lo;
  }
  // Split: block (x, y) sums rows [y * chunk_rows, ...) of columns [x * 256, ...) into partials
  // [sum][chunk][column]; the last block of each column tile to arrive (a counter per tile) adds
  // each of its columns' chunks in chunk order, a thread per column with kCombine partials' loads
  // in flight (one at a time, a single block took about 120 us over 85 chunks of 768 columns).
  lo.scratch_bytes = {sums * static_cast<size_t>(chunks * cols) * 4, static_cast<size_t>(col_tiles) * 4};
  lo.zeroed_scratch = {1};
  Reg part = b.param("partials", Type::u64), counters = b.param("counters", Type::u64);
  args.push_back({ArgRef::Kind::Scratch, 0});
  args.push_back({ArgRef::Kind::Scratch, 1});
  auto index = [&](Reg r32) { return it == Type::u32 ? r32 : b.cvt(Type::u64, r32); };
  Reg tid = index(b.sreg(SReg::tid_x)), chunk = index(b.sreg(SReg::ctaid_y));
  Reg col = b.mad(it, index(b.sreg(SReg::ctaid_x)), imm_index(it, kElementwiseThreads), tid);
  Reg in_range = b.setp(Cmp::lt, col, imm_index(it, cols));
  b.if_(in_range, [&] {
    Reg first = b.mul(it, chunk, imm_index(it, chunk_rows));
    Reg end = b.min(it, b.add(it, first, imm_index(it, chunk_rows)), imm_index(it, rows));
    std::vector<Reg> acc = column_sums(col, first, end);
    for (size_t r = 0; r < sums; ++r) {
      Reg at = b.mad(it, b.add(it, chunk, imm_index(it, static_cast<int64_t>(r) * chunks)), imm_index(it, cols), col);
      b.st(Space::global, Type::f32, b.address(part, at, 4), acc[r]);
    }
  });
  Reg counter = b.address(counters, b.sreg(SReg::ctaid_x), 4);
  after_last_block(b, counter, static_cast<uint32_t>(chunks), [&] {
    b.if_(in_range, [&] {
      for (size_t r = 0; r < sums; ++r) {
        Reg total = b.mov(Type::f32, imm_f32(0.0f));
        auto partial = [&](int64_t k) {
          return b.address(part,
                           b.mad(it, imm_index(it, static_cast<int64_t>(r) * chunks + k), imm_index(it, cols), col), 4);
        };
        for (int64_t k0 = 0; k0 < chunks; k0 += kCombine) {
          std::vector<Reg> vals;
          for (int64_t k = k0; k < std::min(chunks, k0 + kCombine); ++k)
            vals.push_back(b.ld(Space::global, Type::f32, partial(k)));
          for (Reg v : vals) b.assign(kir::Opc::Add, total, {total, v});
        }
        b.st(Space::global, Type::f32, b.address(out_ptr[r], col, 4), total);
      }
    });
  });
  lo.launches.push_back(finish_launch(b, "kiln_column_sums_split",
                                      {static_cast<uint32_t>(col_tiles), static_cast<uint32_t>(chunks), 1},
                                      {kElementwiseThreads, 1, 1}, std::move(args)));
  lo.summary = "column_sums: " + std::to_string(sums) + " sums over " + std::to_string(rows) + " rows in " +
               std::to_string(chunks) + " chunks of " + std::to_string(chunk_rows) +
               ", a thread per column per chunk, each column tile's last block adds its chunks in order, " +
               launch_text(lo.launches.back());
  return lo;
}

}  // namespace

void register_column_sums_lowering(LoweringTable& t) {
  t.add(PrimId::column_sums, lower_column_sums, "thread per column, rows in order, one accumulator per body");
}

}  // namespace kiln::cuda
