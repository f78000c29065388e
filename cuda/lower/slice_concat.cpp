// Lowering of slice, concat and split (circuit/prims/slice_concat.cpp): pure addressing. A slice
// is one copy from an offset; a concat one launch in which each element is read from the input
// its coordinate along the axis falls in; a split one launch storing each element into its piece.
#include <functional>

#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::Space;

namespace {

// The part of a concat's output (or a split's input) that `coords` fall in along `axis`, parts
// ending at `ends` (exclusive, ascending): a balanced tree of branches over the boundaries,
// log2(parts) comparisons an element (a gradient bucket of data parallelism has a part per
// parameter, 150 at GPT-2 small). Emits part(k, coordinates within part k) in each leaf.
void branch_by_part(KernelBuilder& b, const std::vector<Reg>& coords, size_t axis, const std::vector<int64_t>& ends,
                    const std::function<void(size_t, const std::vector<Reg>&)>& part) {
  const Type it = coords[axis].type;
  std::function<void(size_t, size_t)> pick = [&](size_t first, size_t last) {  // parts [first, last)
    if (last - first == 1) {
      std::vector<Reg> at = coords;
      if (first != 0) at[axis] = b.sub(it, coords[axis], imm_index(it, ends[first - 1]));
      return part(first, at);
    }
    const size_t mid = (first + last) / 2;
    b.if_(
        b.setp(Cmp::lt, coords[axis], imm_index(it, ends[mid - 1])), [&] { pick(first, mid); },
        [&] { pick(mid, last); });
  };
  pick(0, ends.size());
}

LoweredOp lower_slice(const Circuit& c, const Op& op, const Target& target) {
  const std::vector<int64_t> xs = c.info(op.inputs[0]).shape.strides();
  const SliceParams sp = SliceParams::of(op);
  return strided_copy(c, op, target, xs, sp.start * xs[static_cast<size_t>(sp.axis)]);
}

LoweredOp lower_concat(const Circuit& c, const Op& op, const Target& target) {
  const auto axis = static_cast<size_t>(ConcatParams::of(op).axis);
  const ValueInfo& out = c.info(op.outputs[0]);
  std::vector<ArgRef> args;
  std::vector<int64_t> ends;  // per input: its end along the axis in the output
  int64_t along = 0;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    args.push_back({ArgRef::Kind::Input, static_cast<int>(k)});
    along += c.info(op.inputs[k]).shape[static_cast<int>(axis)];
    ends.push_back(along);
  }
  args.push_back(kOut0);
  std::vector<Shape> in_shapes;
  for (ValueId v : op.inputs) in_shapes.push_back(c.info(v).shape);
  const Type t = kir_type(out.dtype);
  // Each element is read from the input its coordinate falls in (branch_by_part).
  auto value = [&](KernelBuilder& b, const std::vector<Reg>&, const std::vector<Reg>& coords,
                   const std::vector<Reg>& base) {
    Reg v = b.reg(t);
    branch_by_part(b, coords, axis, ends, [&](size_t k, const std::vector<Reg>& at) {
      Reg off = linear_offset(b, at, in_shapes[k].strides(), 0);
      b.set(v, b.ld(Space::global, t, b.address(base[k], off, static_cast<int>(dtype_size(out.dtype)))));
    });
    return v;
  };
  LoweredOp r;
  r.launches.push_back(elementwise_launch(target, "kiln_concat", out.shape, args, {},
                                          access_of(static_cast<int>(args.size()) - 1, out, out.shape.strides()), value,
                                          true));
  r.summary =
      "concat: one launch, each element read from the input its coordinate falls in, " + launch_text(r.launches.back());
  return r;
}

LoweredOp lower_split(const Circuit& c, const Op& op, const Target& target) {
  const auto axis = static_cast<size_t>(SplitParams::of(op).axis);
  const ValueInfo& x = c.info(op.inputs[0]);
  std::vector<Shape> pieces;
  std::vector<int64_t> ends;  // per piece: its end along the axis in the input
  int64_t along = 0;
  std::vector<ArgRef> args{kIn0};
  for (size_t k = 0; k < op.outputs.size(); ++k) {
    pieces.push_back(c.info(op.outputs[k]).shape);
    along += pieces.back()[static_cast<int>(axis)];
    ends.push_back(along);
    args.push_back({ArgRef::Kind::Output, static_cast<int>(k)});
  }
  // One launch over the input: each element is stored into the piece its coordinate falls in
  // (branch_by_part; a gradient bucket has a piece per parameter: one launch, not one a piece).
  const Type t = kir_type(x.dtype);
  const int size = static_cast<int>(dtype_size(x.dtype));
  const int64_t n = x.shape.numel();
  const Type it = index_type(target, n);
  KernelBuilder b("kiln_split");
  std::vector<Reg> base;
  for (size_t p = 0; p < args.size(); ++p) base.push_back(b.param("p" + std::to_string(p), Type::u64));
  grid_stride_loop(b, it, n, [&](Reg i) {
    const Reg v = b.ld(Space::global, t, b.address(base[0], i, size));
    branch_by_part(b, coordinates(b, i, x.shape.dims()), axis, ends, [&](size_t k, const std::vector<Reg>& at) {
      b.st(Space::global, t, b.address(base[k + 1], linear_offset(b, at, pieces[k].strides(), 0), size), v);
    });
  });
  return single_launch(finish_launch(b, "kiln_split", elementwise_grid(n), {kElementwiseThreads, 1, 1}, args),
                       "split: one launch, each element stored into its piece");
}

}  // namespace

void register_slice_concat_lowering(LoweringTable& t) {
  t.add(PrimId::slice, lower_slice, "copy with offset addressing");
  t.add(PrimId::concat, lower_concat, "one launch, each element read from its input");
  t.add(PrimId::split, lower_split, "one launch, each element stored into its piece");
}

}  // namespace kiln::cuda
