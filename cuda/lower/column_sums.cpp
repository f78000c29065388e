// Lowering of column_sums (circuit/prims/column_sums.cpp): a thread per column walks the rows in
// order, evaluates every body at each element (each input read at its broadcast address) and
// keeps one f32 accumulator per body. With many rows the rows are split into chunks across
// blocks (grid: column tiles x chunks), each writing its partial sums, and the last block of a
// column tile to arrive adds each of its columns' chunks in chunk order: no float atomics, so the
// sums do not depend on scheduling. Consecutive threads read consecutive columns, so the loads
// coalesce; each thread has 4 rows' loads in flight (measured on an H100: a thread per column
// waiting on one load at a time summed an 8192 x 768 gradient at about 160 GB/s). f32
// accumulation error bound rows * 2^-24 * sum |x| per column, as reduce.
#include <algorithm>

#include "circuit/prims/prim_params.hpp"
#include "cuda/lower/elementwise.hpp"
#include "cuda/lower/families.hpp"

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
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

LoweredOp lower_column_sums(const Circuit& c, const Op& op) {
  const ColumnSumsParams cp = ColumnSumsParams::of(op);
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
  const Type it = index_type(largest);

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
