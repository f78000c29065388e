// Lowering of fused_rows (circuit/prims/fused_rows.hpp). Without reductions: one thread per element,
// all outputs at once. Otherwise one warp per row, eight rows per block of
// 256 threads. For each reduction in order, the lanes stride over the row evaluating its body
// (inputs loaded with broadcast addressing, earlier reductions from registers), then a
// butterfly leaves the row's value in every lane (a max followed by the sum of exp(x - max),
// a softmax's statistics, in one pass: is_softmax_pair); a last pass over the row writes the row
// outputs, and lane 0 writes the per-row outputs. Inputs that do not vary along the row are
// loaded once per row. Nothing but the outputs is written to memory. The row index is
// uniform across a warp, so the guard on it never splits a warp before a shuffle.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <unordered_map>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;
using kir::SReg;

namespace {

constexpr uint32_t kRowsPerBlock = 8;
constexpr int64_t kUnroll = 4;  // columns a lane loads before using them

struct RowInput {
  Reg param;
  DType dtype;
  Reg row_base;        // element offset of the row's first element (broadcast addressing)
  int64_t col_stride;  // 0 when the input does not vary along the row
};

// Reductions j and j + 1 are max{x} and sum{exp(x - r_j)} of the same x (a softmax's, the loss
// rows'): the kernel takes them in one pass over the row (an online softmax) instead of two.
bool is_softmax_pair(const RowProgram& rp, int j) {
  if (j + 1 >= static_cast<int>(rp.reduction_kinds.size()) ||
      rp.reduction_kinds[static_cast<size_t>(j)] != ReduceKind::Max ||
      rp.reduction_kinds[static_cast<size_t>(j + 1)] != ReduceKind::Sum)
    return false;
  const ScalarExp& e = rp.reduction_bodies[static_cast<size_t>(j + 1)];
  return e.op() == ExpOp::Exp && e.args()[0].op() == ExpOp::Sub &&
         e.args()[0].args()[0] == rp.reduction_bodies[static_cast<size_t>(j)] &&
         e.args()[0].args()[1] == se::in(rp.inputs + j);
}

// The part of a pass's bodies that is the same all along a row, taken out of the pass: each
// largest subtree that reads inputs and only inputs `uniform` says are (per-row inputs, the
// reductions already made) becomes input base + i, hoisted[i] being that subtree (structurally
// equal ones once), which the kernel evaluates once a row before the pass. The same operations
// on the same values: the same bits. (A layer norm's backward evaluated rsqrt(var + eps) and a
// division by var + eps at every element of its rows, twice.) Each node is classified once,
// from its children (`reads`), and rewritten once (`memo`: a subtree the bodies share stays
// shared, as emit_scalar_exp evaluates a shared node once).
enum class Reads { nothing, uniform, varying };
struct HoistState {
  std::function<bool(int)> uniform;
  int base = 0;
  std::vector<ScalarExp> hoisted;
  std::unordered_map<const ScalarExp::Node*, Reads> reads;
  std::unordered_map<const ScalarExp::Node*, ScalarExp> memo;
};

Reads reads_of(const ScalarExp& e, HoistState& st) {
  if (e.op() == ExpOp::Const) return Reads::nothing;
  if (e.op() == ExpOp::Input) return st.uniform(e.input_index()) ? Reads::uniform : Reads::varying;
  if (auto it = st.reads.find(e.node()); it != st.reads.end()) return it->second;
  Reads r = Reads::nothing;
  for (const ScalarExp& a : e.args()) r = std::max(r, reads_of(a, st));
  st.reads.emplace(e.node(), r);
  return r;
}

ScalarExp hoist_uniform(const ScalarExp& e, HoistState& st) {
  if (e.op() == ExpOp::Const || e.op() == ExpOp::Input) return e;
  if (auto it = st.memo.find(e.node()); it != st.memo.end()) return it->second;
  ScalarExp r;
  if (reads_of(e, st) == Reads::uniform) {
    auto at = std::find(st.hoisted.begin(), st.hoisted.end(), e);
    if (at == st.hoisted.end()) at = st.hoisted.insert(st.hoisted.end(), e);
    r = ScalarExp::input(st.base + static_cast<int>(at - st.hoisted.begin()));
  } else {
    std::vector<ScalarExp> a;
    for (const ScalarExp& x : e.args()) a.push_back(hoist_uniform(x, st));
    r = a.size() == 1   ? ScalarExp::unary(e.op(), a[0])
        : a.size() == 2 ? ScalarExp::binary(e.op(), a[0], a[1])
                        : ScalarExp::select(a[0], a[1], a[2]);
  }
  st.memo.emplace(e.node(), r);
  return r;
}

// No reductions and only element outputs: a multi-output elementwise kernel (grid-stride
// loop, one thread per element, every output stored at the element).
LoweredOp lower_element_group(const Circuit& c, const Op& op, const Target& target, const RowProgram& rp) {
  const int64_t n = rp.domain.numel();
  int64_t largest = n;
  for (ValueId in : op.inputs) largest = std::max(largest, c.info(in).shape.numel());
  const Type it = index_type(target, largest);
  KernelBuilder b("kiln_fused_elements");
  std::vector<ArgRef> args;
  std::vector<Reg> in_params, out_params;
  for (int k = 0; k < rp.inputs; ++k) {
    in_params.push_back(b.param("in" + std::to_string(k), Type::u64));
    args.push_back({ArgRef::Kind::Input, k});
  }
  for (size_t o = 0; o < rp.output_bodies.size(); ++o) {
    out_params.push_back(b.param("out" + std::to_string(o), Type::u64));
    args.push_back({ArgRef::Kind::Output, static_cast<int>(o)});
  }
  grid_stride_loop(b, it, n, [&](Reg i) {
    const std::vector<Reg> coords = coordinates(b, i, rp.domain.dims());
    std::vector<Reg> vals(static_cast<size_t>(rp.inputs));
    for (int k = 0; k < rp.inputs; ++k) {
      bool read = false;
      for (const ScalarExp& e : rp.output_bodies) read = read || e.depends_on(k);
      if (!read) continue;
      const ValueInfo& info = c.info(op.inputs[static_cast<size_t>(k)]);
      Reg at = info.shape.numel() == n ? i : linear_offset(b, coords, broadcast_strides(info.shape, rp.domain), 0);
      vals[static_cast<size_t>(k)] = load_as_f32(b, info.dtype, in_params[static_cast<size_t>(k)], at);
    }
    for (size_t o = 0; o < rp.output_bodies.size(); ++o)
      store_from_f32(b, rp.stored_bf16(o) ? DType::bf16 : DType::f32, out_params[o], i,
                     emit_scalar_exp(b, rp.output_bodies[o], vals));
  });
  LoweredOp r;
  r.launches.push_back(
      finish_launch(b, "kiln_fused_elements", elementwise_grid(n), {kElementwiseThreads, 1, 1}, std::move(args)));
  r.summary = "fused elements: " + std::to_string(rp.output_bodies.size()) + " outputs, thread per element, " +
              launch_text(r.launches.back());
  return r;
}

LoweredOp lower_fused_rows(const Circuit& c, const Op& op, const Target& target) {
  const RowProgram rp = RowProgram::from_params(op.params);
  bool per_row = false, padded = false;
  for (size_t o = 0; o < rp.output_bodies.size(); ++o) {
    per_row = per_row || rp.output_per_row[o];
    padded = padded || rp.padding(o) > 0;
  }
  if (rp.reduction_bodies.empty() && !per_row && !padded) return lower_element_group(c, op, target, rp);
  const int64_t rows = rp.rows(), n = rp.n();
  if (rows > 0x7fffffffLL) fail(op.prim->name, op.scope, "more than 2^31 - 1 rows");
  int64_t largest = rp.domain.numel();
  for (ValueId in : op.inputs) largest = std::max(largest, c.info(in).shape.numel());
  for (ValueId out : op.outputs) largest = std::max(largest, c.info(out).shape.numel());
  const Type it = index_type(target, largest);
  const int nin = rp.inputs, nred = static_cast<int>(rp.reduction_bodies.size());
  const std::vector<int64_t> row_dims(rp.domain.dims().begin(), rp.domain.dims().end() - 1);

  KernelBuilder b("kiln_fused_rows");
  std::vector<ArgRef> args;
  std::vector<RowInput> inputs;
  for (int k = 0; k < nin; ++k) {
    inputs.push_back(
        {b.param("in" + std::to_string(k), Type::u64), c.info(op.inputs[static_cast<size_t>(k)]).dtype, {}, 0});
    args.push_back({ArgRef::Kind::Input, k});
  }
  std::vector<Reg> outputs;
  for (size_t o = 0; o < rp.output_bodies.size(); ++o) {
    outputs.push_back(b.param("out" + std::to_string(o), Type::u64));
    args.push_back({ArgRef::Kind::Output, static_cast<int>(o)});
  }
  Reg tid = b.sreg(SReg::tid_x);
  Reg lane = b.and_(Type::u32, tid, imm_u32(31));
  Reg row = b.mad(Type::u32, b.sreg(SReg::ctaid_x), imm_u32(kRowsPerBlock), b.shr(Type::u32, tid, imm_u32(5)));
  int softmax_pairs = 0;  // reductions taken two in one pass (is_softmax_pair)
  b.if_(b.setp(Cmp::lt, row, imm_u32(static_cast<uint32_t>(rows))), [&] {
    Reg row_i = it == Type::u32 ? row : b.cvt(Type::u64, row);
    Reg lane_i = it == Type::u32 ? lane : b.cvt(Type::u64, lane);
    const std::vector<Reg> coords = coordinates(b, row_i, row_dims);
    // vals: in_k for inputs that do not vary along the row (loaded once), then reductions.
    std::vector<Reg> vals(static_cast<size_t>(nin + nred));
    auto used = [&](int k) {
      for (const ScalarExp& e : rp.reduction_bodies)
        if (e.depends_on(k)) return true;
      for (const ScalarExp& e : rp.output_bodies)
        if (e.depends_on(k)) return true;
      return false;
    };
    for (int k = 0; k < nin; ++k) {
      RowInput& in = inputs[static_cast<size_t>(k)];
      if (!used(k)) continue;
      std::vector<int64_t> strides = broadcast_strides(c.info(op.inputs[static_cast<size_t>(k)]).shape, rp.domain);
      in.col_stride = strides.back();
      strides.pop_back();
      in.row_base = linear_offset(b, coords, strides, 0);
      if (in.col_stride == 0) vals[static_cast<size_t>(k)] = load_as_f32(b, in.dtype, in.param, in.row_base);
    }
    // The operands of `bodies` at column `col`: row-varying inputs loaded there.
    auto operands_at = [&](Reg col, const std::vector<const ScalarExp*>& bodies) {
      std::vector<Reg> ops = vals;
      for (int k = 0; k < nin; ++k) {
        const RowInput& in = inputs[static_cast<size_t>(k)];
        bool read = false;
        for (const ScalarExp* e : bodies) read = read || e->depends_on(k);
        if (!read || in.col_stride == 0) continue;
        Reg idx = b.mad(it, col, imm_index(it, in.col_stride), in.row_base);
        ops[static_cast<size_t>(k)] = load_as_f32(b, in.dtype, in.param, idx);
      }
      return ops;
    };
    // `bodies` of a pass made after `reductions` reductions, their row-uniform parts
    // (hoist_uniform) evaluated here, once a row, into new entries of vals.
    auto hoisted_pass = [&](const std::vector<ScalarExp>& bodies, int reductions) {
      HoistState st;
      st.uniform = [&](int k) {
        return k < nin ? inputs[static_cast<size_t>(k)].col_stride == 0 : k < nin + reductions;
      };
      st.base = static_cast<int>(vals.size());
      std::vector<ScalarExp> out;
      for (const ScalarExp& e : bodies) out.push_back(hoist_uniform(e, st));
      for (const ScalarExp& h : st.hoisted) vals.push_back(emit_scalar_exp(b, h, vals));
      return out;
    };
    // A pass over the row: the lane's columns lane, lane + 32, ... in order, use(col, load(col))
    // each; kUnroll columns' loads are issued before their uses (one at a time a lane waited on
    // each load: about 1 TB/s on an H100), the order of the uses unchanged (the same sums).
    auto over_row = [&](const std::function<std::vector<Reg>(Reg)>& load,
                        const std::function<void(Reg, const std::vector<Reg>&)>& use) {
      const int64_t step = 32 * kUnroll, whole = n / step * step;
      if (whole > 0)
        b.for_(imm_index(it, 0), imm_index(it, whole), imm_index(it, step), [&](Reg first) {
          std::vector<Reg> cols;
          std::vector<std::vector<Reg>> loaded;
          for (int64_t u = 0; u < kUnroll; ++u) {
            cols.push_back(b.add(it, first, b.add(it, lane_i, imm_index(it, 32 * u))));
            loaded.push_back(load(cols.back()));
          }
          for (size_t u = 0; u < cols.size(); ++u) use(cols[u], loaded[u]);
        });
      b.for_(b.add(it, lane_i, imm_index(it, whole)), imm_index(it, n), imm_index(it, 32),
             [&](Reg col) { use(col, load(col)); });
    };
    for (int j = 0; j < nred; ++j) {
      const ReduceKind kind = rp.reduction_kinds[static_cast<size_t>(j)];
      const ScalarExp& body = rp.reduction_bodies[static_cast<size_t>(j)];
      if (is_softmax_pair(rp, j)) {
        // r_j = max{x}, r_j+1 = sum{exp(x - r_j)}: one pass, each lane keeping a running max m
        // and s = sum exp(x - m) over its columns so far, rescaled when the max grows; t =
        // exp(-|x - m|) is the factor either way (0 for x = -inf, which adds nothing and must not
        // make -inf - -inf before the first finite x). Then the lanes' (m, s) pairs combine. A row
        // wholly -inf gives max -inf and sum 0 (two passes: sum NaN); a softmax over it is NaN
        // either way (0 / 0), its log-sum-exp -inf here.
        Reg m = b.mov(Type::f32, imm_f32(-INFINITY)), sum = b.mov(Type::f32, imm_f32(0.0f));
        const ScalarExp factor = se::exp(-se::abs(se::in(0) - se::in(1)));
        over_row([&](Reg col) { return operands_at(col, {&body}); },
                 [&](Reg, const std::vector<Reg>& ops) {
                   Reg x = emit_scalar_exp(b, body, ops);
                   Reg t = b.selp(Type::f32, imm_f32(0.0f), emit_scalar_exp(b, factor, {x, m}),
                                  b.setp(Cmp::eq, x, imm_f32(-INFINITY)));
                   Reg up = b.setp(Cmp::gt, x, m);
                   b.set(sum, b.selp(Type::f32, b.fma(Type::f32, sum, t, imm_f32(1.0f)), b.add(Type::f32, sum, t), up));
                   b.set(m, reduce_combine(b, ReduceKind::Max, m, x));
                 });
        for (uint32_t off = 16; off >= 1; off /= 2) {
          Reg mo = b.shfl(kir::ShflMode::bfly, m, imm_u32(off)), so = b.shfl(kir::ShflMode::bfly, sum, imm_u32(off));
          Reg mn = reduce_combine(b, ReduceKind::Max, m, mo);
          Reg safe = b.selp(Type::f32, imm_f32(0.0f), mn, b.setp(Cmp::eq, mn, imm_f32(-INFINITY)));
          const ScalarExp rescaled =
              se::in(0) * se::exp(se::in(1) - se::in(4)) + se::in(2) * se::exp(se::in(3) - se::in(4));
          b.set(sum, emit_scalar_exp(b, rescaled, {sum, m, so, mo, safe}));
          b.set(m, mn);
        }
        vals[static_cast<size_t>(nin + j)] = m;
        vals[static_cast<size_t>(nin + j + 1)] = sum;
        ++softmax_pairs;
        ++j;
        continue;
      }
      const ScalarExp per_column = hoisted_pass({body}, j)[0];
      Reg acc = b.mov(Type::f32, reduce_identity_operand(kind));
      over_row([&](Reg col) { return operands_at(col, {&per_column}); },
               [&](Reg, const std::vector<Reg>& ops) {
                 b.set(acc, reduce_combine(b, kind, acc, emit_scalar_exp(b, per_column, ops)));
               });
      vals[static_cast<size_t>(nin + j)] = reduce_finalize(b, kind, warp_reduce(b, kind, acc), n);
    }
    // The row outputs' bodies with their row-uniform parts evaluated once (per-row outputs are
    // evaluated once a row anyway).
    std::vector<ScalarExp> per_column(rp.output_bodies.size());
    {
      std::vector<ScalarExp> row_outputs;
      for (size_t o = 0; o < rp.output_bodies.size(); ++o)
        if (!rp.output_per_row[o]) row_outputs.push_back(rp.output_bodies[o]);
      const std::vector<ScalarExp> hoisted = hoisted_pass(row_outputs, nred);
      for (size_t o = 0, i = 0; o < rp.output_bodies.size(); ++o)
        if (!rp.output_per_row[o]) per_column[o] = hoisted[i++];
    }
    std::vector<const ScalarExp*> row_bodies, per_row_bodies;
    for (size_t o = 0; o < rp.output_bodies.size(); ++o)
      (rp.output_per_row[o] ? per_row_bodies : row_bodies)
          .push_back(rp.output_per_row[o] ? &rp.output_bodies[o] : &per_column[o]);
    if (!row_bodies.empty()) {
      // Each row output's row at row * (n + its padding), then its zero columns.
      std::map<int64_t, Reg> row_start;
      for (size_t o = 0; o < rp.output_bodies.size(); ++o)
        if (!rp.output_per_row[o] && !row_start.count(rp.padding(o)))
          row_start[rp.padding(o)] = b.mul(it, row_i, imm_index(it, n + rp.padding(o)));
      auto stored = [&](size_t o) { return rp.stored_bf16(o) ? DType::bf16 : DType::f32; };
      over_row([&](Reg col) { return operands_at(col, row_bodies); },
               [&](Reg col, const std::vector<Reg>& ops) {
                 for (size_t o = 0; o < rp.output_bodies.size(); ++o)
                   if (!rp.output_per_row[o])
                     store_from_f32(b, stored(o), outputs[o], b.add(it, row_start.at(rp.padding(o)), col),
                                    emit_scalar_exp(b, per_column[o], ops));
               });
      for (size_t o = 0; o < rp.output_bodies.size(); ++o)
        if (rp.padding(o) > 0)
          b.for_(lane_i, imm_index(it, rp.padding(o)), imm_index(it, 32), [&](Reg col) {
            Reg at = b.add(it, row_start.at(rp.padding(o)), b.add(it, col, imm_index(it, n)));
            store_from_f32(b, stored(o), outputs[o], at, b.mov(Type::f32, imm_f32(0.0f)));
          });
    }
    if (!per_row_bodies.empty())
      b.if_(b.setp(Cmp::eq, lane, imm_u32(0)), [&] {
        for (size_t o = 0; o < rp.output_bodies.size(); ++o)
          if (rp.output_per_row[o])
            store_from_f32(b, rp.stored_bf16(o) ? DType::bf16 : DType::f32, outputs[o], row_i,
                           emit_scalar_exp(b, rp.output_bodies[o], vals));
      });
  });
  LoweredOp r;
  const auto blocks = static_cast<uint32_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  r.launches.push_back(
      finish_launch(b, "kiln_fused_rows", {std::max(blocks, 1u), 1, 1}, {32 * kRowsPerBlock, 1, 1}, std::move(args)));
  r.summary = "fused rows: " + std::to_string(nred) + " reductions" +
              (softmax_pairs > 0 ? " (a max and its sum of exponentials in one pass)" : "") + ", " +
              std::to_string(rp.output_bodies.size()) + " outputs, a warp per row of " + std::to_string(n) + ", " +
              launch_text(r.launches.back());
  return r;
}

}  // namespace

void register_fused_rows_lowering(LoweringTable& t) {
  t.add(PrimId::fused_rows, lower_fused_rows, "warp per row: reductions in registers, outputs in a last pass");
}

}  // namespace kiln::cuda
