// Matmul fusion: each matmul becomes a fused_matmul (circuit/prims/fused_matmul.hpp) that reads its
// operands in place through the moves and unary pointwise ops in front of it, and computes the
// pointwise ops after it as epilogues; a bias gradient next to its weight gradient comes out of
// the weight gradient's kernel.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>

#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

// A tensor read through a view: its element (i_0, i_1, ...) (dims `sizes`) is
// prologue(base[offset + sum i_d * strides[d]]), base indexed as flat contiguous storage.
struct View {
  ValueId base = kNoValue;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  ScalarExp prologue = se::in(0);
};

// The coordinates in a contiguous tensor of `shape` that a view's elements land on, as an
// affine map coord_e = origin[e] + sum_d coef[e][d] * i_d; nullopt when the view's flat indices
// do not decompose so (a stride that is no multiple of a dim's stride, or a coordinate that
// would carry into the next dim). Each view dim is put whole on the outermost dim whose stride
// divides its stride; with no coordinate leaving its range the mixed-radix digits are exact.
struct Affine {
  std::vector<int64_t> origin;
  std::vector<std::vector<int64_t>> coef;
};

std::optional<Affine> decompose(const View& v, const Shape& shape) {
  const int r = shape.rank();
  const std::vector<int64_t> st = shape.strides();
  if (v.offset < 0 || v.offset >= shape.numel()) return std::nullopt;
  Affine a{std::vector<int64_t>(static_cast<size_t>(r), 0),
           std::vector<std::vector<int64_t>>(static_cast<size_t>(r), std::vector<int64_t>(v.sizes.size(), 0))};
  int64_t rest = v.offset;
  for (size_t e = 0; e < static_cast<size_t>(r); ++e) {
    a.origin[e] = rest / st[e];
    rest %= st[e];
  }
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] == 1 || v.strides[d] == 0) continue;
    size_t e = 0;
    while (e < static_cast<size_t>(r) && (shape[static_cast<int>(e)] == 1 || v.strides[d] % st[e] != 0)) ++e;
    if (e == static_cast<size_t>(r)) return std::nullopt;
    a.coef[e][d] = v.strides[d] / st[e];
  }
  for (size_t e = 0; e < static_cast<size_t>(r); ++e) {
    int64_t last = a.origin[e];
    for (size_t d = 0; d < v.sizes.size(); ++d) last += a.coef[e][d] * (v.sizes[d] - 1);
    if (last >= shape[static_cast<int>(e)]) return std::nullopt;
  }
  return a;
}

// The view `v` of output `out` of a move op, as a view of the op's input; nullopt for other
// ops and for views that are not affine in the input.
std::optional<View> through_move(const Circuit& c, const Op& op, size_t out, const View& v) {
  const PrimId name = op.prim->id;
  View r = v;
  r.base = op.inputs[0];
  if (name == PrimId::reshape || name == PrimId::stop_gradient) return r;  // the same contiguous elements
  if (name != PrimId::permute && name != PrimId::slice && name != PrimId::split && name != PrimId::broadcast)
    return std::nullopt;
  const Shape& out_shape = c.info(op.outputs[out]).shape;
  const Shape& in_shape = c.info(op.inputs[0]).shape;
  const std::optional<Affine> a = decompose(v, out_shape);
  if (!a) return std::nullopt;
  // Output dim e reads input dim in_dim[e] (-1: a broadcast dim) at coordinate + shift[e].
  const int ro = out_shape.rank();
  std::vector<int> in_dim(static_cast<size_t>(ro));
  std::vector<int64_t> shift(static_cast<size_t>(ro), 0);
  for (int e = 0; e < ro; ++e) in_dim[static_cast<size_t>(e)] = e;
  if (name == PrimId::permute) {
    const std::vector<int64_t> perm = PermuteParams::of(op).perm;
    for (int e = 0; e < ro; ++e) in_dim[static_cast<size_t>(e)] = static_cast<int>(perm[static_cast<size_t>(e)]);
  } else if (name == PrimId::slice) {
    const SliceParams sp = SliceParams::of(op);
    shift[static_cast<size_t>(sp.axis)] = sp.start;
  } else if (name == PrimId::split) {
    const SplitParams sp = SplitParams::of(op);
    for (size_t q = 0; q < out; ++q) shift[static_cast<size_t>(sp.axis)] += sp.sizes[q];
  } else {  // broadcast: trailing dims align; a dim of 1 is read at 0
    const int lead = ro - in_shape.rank();
    for (int e = 0; e < ro; ++e) in_dim[static_cast<size_t>(e)] = e < lead || in_shape[e - lead] == 1 ? -1 : e - lead;
  }
  const std::vector<int64_t> ist = in_shape.strides();
  r.offset = 0;
  r.strides.assign(v.sizes.size(), 0);
  for (size_t e = 0; e < static_cast<size_t>(ro); ++e) {
    if (in_dim[e] < 0) continue;
    const int64_t s = ist[static_cast<size_t>(in_dim[e])];
    r.offset += (a->origin[e] + shift[e]) * s;
    for (size_t d = 0; d < v.sizes.size(); ++d) r.strides[d] += a->coef[e][d] * s;
  }
  return r;
}

// Follows `v` back through moves and unary pointwise ops (which become the prologue) as far as
// it stays a view, and through a cast of f32 to bf16 (the prologue rounds to bf16: the matmul
// reads the f32 value and multiplies the same bf16 values, so the mixed-precision policy's casts
// need no kernel of their own). It stops at ops `stop` names (another group's members: their
// inputs may not exist once it is contracted), at a pointwise op whose value something other
// than a matmul reads (it is written anyway; recomputing it per load would only cost), and
// before a buffer something assigns (the read would move past the assign).
View read_through(const Circuit& c, View v, const std::vector<bool>& assigned,
                  const std::vector<std::vector<int32_t>>& readers, const std::function<bool(int32_t)>& stop,
                  const Target& target) {
  for (;;) {
    const int32_t p = c.value(v.base).producer;
    if (p < 0 || stop(p)) return v;
    const Op& op = c.ops()[static_cast<size_t>(p)];
    std::optional<View> next;
    if (op.is(PrimId::pointwise)) {
      bool only_matmuls = true;
      for (int32_t r : readers[static_cast<size_t>(v.base)])
        only_matmuls = only_matmuls && c.ops()[static_cast<size_t>(r)].is(PrimId::matmul);
      if (only_matmuls && op.inputs.size() == 1 && c.info(op.inputs[0]) == c.info(v.base)) {
        next = v;
        next->base = op.inputs[0];
        next->prologue = v.prologue.substitute({op.params.body});
      }
    } else if (op.is(PrimId::cast)) {
      // Only without the bf16 mma kernel (--matmul bf16-mma=off): that kernel (the default)
      // copies operands stored in bf16 as they are, so the casts stay ops.
      if (op.params.dtype == DType::bf16 && c.info(op.inputs[0]).dtype == DType::f32 && !target.matmul.bf16_mma) {
        next = v;  // a bf16 value takes no prologue, so v's is in0
        next->base = op.inputs[0];
        next->prologue = se::round_bf16(se::in(0));
      }
    } else {
      const size_t out =
          static_cast<size_t>(std::find(op.outputs.begin(), op.outputs.end(), v.base) - op.outputs.begin());
      next = through_move(c, op, out, v);
    }
    if (!next || assigned[static_cast<size_t>(next->base)]) return v;
    v = *next;
  }
}

// Operand `which` (0: a, 1: b) of matmul `op`, read through what produced it, against the
// logical batch dims of `plain` (the matmul's own program); `base` receives the value it reads.
MatmulOperand operand_view(const Circuit& c, const Op& op, int which, const FusedMatmul& plain,
                           const std::vector<bool>& assigned, const std::vector<std::vector<int32_t>>& readers,
                           const std::function<bool(int32_t)>& stop, const Target& target, ValueId& base) {
  const ValueId x = op.inputs[static_cast<size_t>(which)];
  const Shape& s = c.info(x).shape;
  View v{x, 0, s.dims(), s.strides(), se::in(0)};
  v = read_through(c, v, assigned, readers, stop, target);
  base = v.base;
  const MatmulParams mp = MatmulParams::of(op);
  const bool transposed = which == 0 ? mp.transpose_a : mp.transpose_b;
  // a is (.., m, k), or (.., k, m) transposed; b is (.., k, n), or (.., n, k) transposed.
  const bool rows_last = which == 0 ? transposed : !transposed;
  const int r = s.rank();
  MatmulOperand m;
  m.offset = v.offset;
  m.prologue = v.prologue;
  m.row_stride = v.strides[static_cast<size_t>(rows_last ? r - 1 : r - 2)];
  m.k_stride = v.strides[static_cast<size_t>(rows_last ? r - 2 : r - 1)];
  const int nb = static_cast<int>(plain.batch.size()), lead = nb - (r - 2);
  for (int i = 0; i < nb; ++i) {
    const int d = i - lead;
    m.batch.push_back(d < 0 || s[d] == 1 ? 0 : v.strides[static_cast<size_t>(d)]);
  }
  return m;
}

// True if a reduction along the last axis reads v: v belongs to a row pattern (a layernorm's
// input, its backward's products) that the row fusion computes inside its row kernel; as an
// epilogue it would only be written out and read back.
bool feeds_row_reduction(const Circuit& c, const std::vector<std::vector<int32_t>>& readers, ValueId v) {
  for (int32_t r : readers[static_cast<size_t>(v)]) {
    const Op& op = c.ops()[static_cast<size_t>(r)];
    if (op.is(PrimId::reduce) && ReduceParams::of(op).axis == c.info(op.inputs[0]).shape.rank() - 1) return true;
  }
  return false;
}

struct Group {
  std::vector<int32_t> members;  // the matmul first, then the ops it absorbed
  FusedMatmul f;
  std::vector<ValueId> inputs;                       // a's base, b's base, extras
  std::vector<std::pair<ValueId, ScalarExp>> exprs;  // each member's value over (acc, extras)
  std::vector<ValueId> replaces;
};

// The group's members with op `op` added (to ask whether adding it would make a cycle).
std::vector<int32_t> with(std::vector<int32_t> members, int32_t op) {
  members.push_back(op);
  return members;
}

// A sum along axis 0 of a's base read as [K, M] (a linear layer's bias gradient, the column sum
// of dY, next to the weight gradient dY^T X whose a operand is that base transposed): the op
// that computes it, or -1. Its value is then the row sums of a, which the product's kernel adds
// up from the tiles it loads anyway.
int32_t row_sums_of_a(const Circuit& c, const std::vector<std::vector<int32_t>>& readers,
                      const std::vector<std::vector<int32_t>>& succ, const Group& g, Phase phase,
                      const std::vector<bool>& taken) {
  const FusedMatmul& f = g.f;
  const ValueId base = g.inputs[0];
  if (!f.batch.empty() || f.a.offset != 0 || f.a.row_stride != 1 || f.a.k_stride != f.m || f.a.prologue != se::in(0) ||
      c.info(base).shape.numel() != f.m * f.k)
    return -1;
  std::vector<ValueId> as_matrix{base};  // base and its reshapes
  for (int32_t r : readers[static_cast<size_t>(base)])
    if (c.ops()[static_cast<size_t>(r)].is(PrimId::reshape))
      as_matrix.push_back(c.ops()[static_cast<size_t>(r)].outputs[0]);
  for (ValueId v : as_matrix) {
    if (c.info(v).shape != Shape{f.k, f.m}) continue;
    for (int32_t r : readers[static_cast<size_t>(v)]) {
      const Op& op = c.ops()[static_cast<size_t>(r)];
      if (ReduceParams::is_sum_along(op, 0) && op.phase == phase && !taken[static_cast<size_t>(r)] &&
          !leaves_and_returns(succ, with(g.members, r)))
        return r;
    }
  }
  return -1;
}

}  // namespace

Circuit fuse_matmul(const Circuit& c, std::vector<ValueId>& outputs, const Target& target) {
  const auto& ops = c.ops();
  const std::vector<std::vector<int32_t>> succ = op_successors(c);
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<bool> assigned(c.num_values(), false), protected_value(c.num_values(), false);
  for (const Op& op : ops)
    if (op.prim->side_effect) assigned[static_cast<size_t>(op.inputs[0])] = true;
  for (ValueId o : outputs) protected_value[static_cast<size_t>(o)] = true;
  std::vector<bool> taken(ops.size(), false);

  std::vector<Group> groups;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (!op.is(PrimId::matmul) || taken[i]) continue;
    Group g;
    g.members = {static_cast<int32_t>(i)};
    const MatmulParams mp = MatmulParams::of(op);
    g.f = FusedMatmul::plain(c.info(op.inputs[0]).shape, c.info(op.inputs[1]).shape, mp.transpose_a, mp.transpose_b);
    ValueId a_base, b_base;
    auto taken_op = [&](int32_t o) { return taken[static_cast<size_t>(o)]; };
    g.f.a = operand_view(c, op, 0, g.f, assigned, readers, taken_op, target, a_base);
    g.f.b = operand_view(c, op, 1, g.f, assigned, readers, taken_op, target, b_base);
    g.inputs = {a_base, b_base};
    const bool reads_through = a_base != op.inputs[0] || b_base != op.inputs[1];
    const Shape logical = g.f.logical();
    g.exprs.emplace_back(op.outputs[0], se::in(0));

    // Epilogues: pointwise readers of the group's values over the logical domain, one at a
    // time (each may make another reader eligible), to a fixpoint.
    for (bool grew = true; grew;) {
      grew = false;
      for (size_t e = 0; e < g.exprs.size() && !grew; ++e) {
        for (int32_t r : readers[static_cast<size_t>(g.exprs[e].first)]) {
          const Op& p = ops[static_cast<size_t>(r)];
          if (taken[static_cast<size_t>(r)] || !p.is(PrimId::pointwise) || p.phase != op.phase ||
              std::find(g.members.begin(), g.members.end(), r) != g.members.end() ||
              c.info(p.outputs[0]).shape != logical || feeds_row_reduction(c, readers, p.outputs[0]) ||
              leaves_and_returns(succ, with(g.members, r)))
            continue;
          std::vector<ScalarExp> subs;
          for (ValueId in : p.inputs) {
            auto known = std::find_if(g.exprs.begin(), g.exprs.end(), [&](const auto& x) { return x.first == in; });
            if (known != g.exprs.end()) {
              subs.push_back(known->second);
              continue;
            }
            auto at = std::find(g.inputs.begin() + 2, g.inputs.end(), in);
            if (at == g.inputs.end()) at = g.inputs.insert(g.inputs.end(), in);
            subs.push_back(se::in(static_cast<int>(at - g.inputs.begin()) - 1));
          }
          g.exprs.emplace_back(p.outputs[0], p.params.body.substitute(subs));
          g.members.push_back(r);
          grew = true;
          break;
        }
      }
    }
    g.f.extras = static_cast<int>(g.inputs.size()) - 2;
    g.f.epilogues.clear();
    for (const auto& [v, e] : g.exprs) {
      bool outside = protected_value[static_cast<size_t>(v)];
      for (int32_t r : readers[static_cast<size_t>(v)])
        outside = outside || std::find(g.members.begin(), g.members.end(), r) == g.members.end();
      if (!outside) continue;
      g.replaces.push_back(v);
      g.f.epilogues.push_back(e);
    }
    // Output view: a single result that only a permute reads is stored permuted.
    if (g.replaces.size() == 1 && !protected_value[static_cast<size_t>(g.replaces[0])] &&
        readers[static_cast<size_t>(g.replaces[0])].size() == 1) {
      const int32_t q = readers[static_cast<size_t>(g.replaces[0])][0];
      const Op& perm = ops[static_cast<size_t>(q)];
      if (perm.is(PrimId::permute) && perm.phase == op.phase && !taken[static_cast<size_t>(q)] &&
          !leaves_and_returns(succ, with(g.members, q))) {
        const Shape& out_shape = c.info(perm.outputs[0]).shape;
        const std::vector<int64_t> st = out_shape.strides();
        std::vector<int64_t> logical_strides(static_cast<size_t>(logical.rank()));
        const std::vector<int64_t> axes = PermuteParams::of(perm).perm;
        for (size_t e = 0; e < st.size(); ++e) logical_strides[static_cast<size_t>(axes[e])] = st[e];
        const size_t nb = g.f.batch.size();
        g.f.out_shape = out_shape;
        g.f.out_batch.assign(logical_strides.begin(), logical_strides.begin() + static_cast<std::ptrdiff_t>(nb));
        g.f.out_row = logical_strides[nb];
        g.f.out_col = logical_strides[nb + 1];
        g.members.push_back(q);
        g.replaces = {perm.outputs[0]};
      }
    }
    if (const int32_t q = row_sums_of_a(c, readers, succ, g, op.phase, taken); q >= 0) {
      g.f.a_row_sums = true;
      g.f.row_sums_shape = c.info(ops[static_cast<size_t>(q)].outputs[0]).shape;
      g.members.push_back(q);
      g.replaces.push_back(ops[static_cast<size_t>(q)].outputs[0]);
    }
    // A lone matmul gains where something casts its f32 product to bf16: as a fused_matmul its
    // kernel can store the bf16 copy itself (absorb_casts), without a pass of its own.
    const std::vector<int32_t>& product_readers = readers[static_cast<size_t>(op.outputs[0])];
    const bool cast_to_bf16 = c.info(op.outputs[0]).dtype == DType::f32 &&
                              std::any_of(product_readers.begin(), product_readers.end(), [&](int32_t r) {
                                const Op& reader = ops[static_cast<size_t>(r)];
                                return reader.is(PrimId::cast) && reader.params.dtype == DType::bf16;
                              });
    if (g.members.size() == 1 && !reads_through && !cast_to_bf16) continue;  // nothing gained: the matmul stays
    for (int32_t m : g.members) taken[static_cast<size_t>(m)] = true;
    groups.push_back(std::move(g));
  }
  if (groups.empty()) return c;

  std::vector<std::vector<int32_t>> member_lists;
  for (const Group& g : groups) member_lists.push_back(g.members);
  Circuit out = contract_groups(
      c, member_lists,
      [&](size_t k) {
        const Group& g = groups[k];
        const DType dt = c.info(ops[static_cast<size_t>(g.members[0])].outputs[0]).dtype;
        return MergedOp{PrimId::fused_matmul, g.f.to_params(dt), g.inputs, g.replaces};
      },
      outputs, "fuse_matmul");
  return dce(out, outputs);
}

}  // namespace kiln
