// Lowering of slice, concat and split (circuit/prims/slice_concat.cpp): pure addressing. A slice
// is one copy from an offset; a concat one launch in which each element is read from the input
// its coordinate along the axis falls in; a split one copy per piece.
#include <functional>

#include "circuit/prims/prim_params.hpp"
#include "cuda/lower/elementwise.hpp"
#include "cuda/lower/families.hpp"

namespace kiln::cuda {

using kir::Cmp;
using kir::Space;

namespace {

LoweredOp lower_slice(const Circuit& c, const Op& op) {
  const std::vector<int64_t> xs = c.info(op.inputs[0]).shape.strides();
  const SliceParams sp = SliceParams::of(op);
  return strided_copy(c, op, xs, sp.start * xs[static_cast<size_t>(sp.axis)]);
}

LoweredOp lower_concat(const Circuit& c, const Op& op) {
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
  // A chain of branches, one per input boundary, picks the input and the place there.
  auto value = [&](KernelBuilder& b, const std::vector<Reg>&, const std::vector<Reg>& coords,
                   const std::vector<Reg>& base) {
    Reg v = b.reg(t);
    const Type it = coords[axis].type;
    std::function<void(size_t)> pick = [&](size_t k) {
      auto load = [&] {
        std::vector<Reg> at = coords;
        const int64_t start = k == 0 ? 0 : ends[k - 1];
        if (start != 0) at[axis] = b.sub(it, coords[axis], imm_index(it, start));
        Reg off = linear_offset(b, at, in_shapes[k].strides(), 0);
        b.set(v, b.ld(Space::global, t, b.address(base[k], off, static_cast<int>(dtype_size(out.dtype)))));
      };
      if (k + 1 == ends.size()) return load();
      b.if_(b.setp(Cmp::lt, coords[axis], imm_index(it, ends[k])), load, [&] { pick(k + 1); });
    };
    pick(0);
    return v;
  };
  LoweredOp r;
  r.launches.push_back(elementwise_launch("kiln_concat", out.shape, args, {},
                                          access_of(static_cast<int>(args.size()) - 1, out, out.shape.strides()), value,
                                          true));
  r.summary =
      "concat: one launch, each element read from the input its coordinate falls in, " + launch_text(r.launches.back());
  return r;
}

LoweredOp lower_split(const Circuit& c, const Op& op) {
  const auto axis = static_cast<size_t>(SplitParams::of(op).axis);
  const ValueInfo& x = c.info(op.inputs[0]);
  const std::vector<int64_t> xs = x.shape.strides();
  LoweredOp r;
  int64_t along = 0;
  for (size_t k = 0; k < op.outputs.size(); ++k) {
    const ValueInfo& piece = c.info(op.outputs[k]);
    r.launches.push_back(copy_launch("kiln_split", piece.shape, kIn0, {ArgRef::Kind::Output, static_cast<int>(k)},
                                     access_of(0, x, xs, along * xs[axis]),
                                     access_of(1, piece, piece.shape.strides())));
    along += piece.shape[static_cast<int>(axis)];
  }
  r.summary = "split: one copy per piece";
  return r;
}

}  // namespace

void register_slice_concat_lowering(LoweringTable& t) {
  t.add(PrimId::slice, lower_slice, "copy with offset addressing");
  t.add(PrimId::concat, lower_concat, "one launch, each element read from its input");
  t.add(PrimId::split, lower_split, "one copy per piece");
}

}  // namespace kiln::cuda
