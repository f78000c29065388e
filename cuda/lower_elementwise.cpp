// Lowering of the Prims that compute each output element from a few input elements: pointwise,
// where, cast, the shape ops that move elements (permute, broadcast, slice, concat, split: pure
// addressing, never an intermediate copy), fill, iota, one_hot and random. One generic kernel:
// a grid-stride loop over an index domain, per operand an affine map from the domain's
// coordinates to an element offset, and a value function.
#include "cuda/lower_elementwise.hpp"

#include <cmath>
#include <functional>

#include "circuit/builder.hpp"
#include "circuit/error.hpp"
#include "circuit/prim_params.hpp"

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;

namespace {

bool is_identity(const Access& a, const Shape& domain) { return a.base == 0 && a.strides == domain.strides(); }

}  // namespace

Launch elementwise_launch(const std::string& prefix, const Shape& domain, std::vector<ArgRef> args,
                          const std::vector<Access>& loads, const Access& store, const ValueFn& value,
                          bool value_needs_coords) {
  int64_t n = domain.numel(), max_elems = n;
  for (const auto& a : loads) max_elems = std::max(max_elems, a.elements);
  max_elems = std::max(max_elems, store.elements);
  const Type it = index_type(max_elems);
  KernelBuilder b(prefix);
  std::vector<Reg> base;
  for (size_t p = 0; p < args.size(); ++p) base.push_back(b.param("p" + std::to_string(p), Type::u64));
  bool need_coords = value_needs_coords || !is_identity(store, domain);
  for (const auto& a : loads) need_coords = need_coords || !is_identity(a, domain);
  grid_stride_loop(b, it, n, [&](Reg i) {
    std::vector<Reg> coords = need_coords ? coordinates(b, i, domain.dims()) : std::vector<Reg>{};
    auto offset = [&](const Access& a) {
      return is_identity(a, domain) ? i : linear_offset(b, coords, a.strides, a.base);
    };
    std::vector<Reg> loaded;
    for (const auto& a : loads) {
      Type t = kir_type(a.dtype);
      loaded.push_back(b.ld(Space::global, t, b.address(base[static_cast<size_t>(a.arg)], offset(a), 4)));
    }
    Reg v = value(b, loaded, coords, base);
    if (v.type != kir_type(store.dtype))
      throw Error("GPU lowering (" + prefix + "): value of type " + kir::type_name(v.type) + " stored as " +
                  dtype_name(store.dtype));
    b.st(Space::global, v.type, b.address(base[static_cast<size_t>(store.arg)], offset(store), 4), v);
  });
  return finish_launch(b, prefix, elementwise_grid(n), {kElementwiseThreads, 1, 1}, std::move(args));
}

Launch finish_launch(KernelBuilder& b, const std::string& prefix, sim::Dim3 grid, sim::Dim3 block,
                     std::vector<ArgRef> args) {
  kir::Kernel k = b.finish();
  k.name = kernel_name(prefix, kernel_hash(k));
  return Launch{std::make_shared<const kir::Kernel>(std::move(k)), grid, block, std::move(args)};
}

Access access_of(int arg, const ValueInfo& info, std::vector<int64_t> strides, int64_t base) {
  return Access{arg, info.dtype, std::move(strides), base, info.shape.numel()};
}

namespace {

const ArgRef kIn0{ArgRef::Kind::Input, 0}, kIn1{ArgRef::Kind::Input, 1}, kIn2{ArgRef::Kind::Input, 2};
const ArgRef kOut0{ArgRef::Kind::Output, 0};

// The store-type register for a value computed in f32.
Reg to_store_type(KernelBuilder& b, DType dt, Reg f) { return dt == DType::f32 ? f : b.cvt(kir_type(dt), f); }

LoweredOp one(Launch l, std::string summary) {
  LoweredOp r;
  r.summary = std::move(summary) + ", " + launch_text(l);
  r.launches.push_back(std::move(l));
  return r;
}

}  // namespace

LoweredOp lower_pointwise(const Circuit& c, const Op& op) {
  const ValueInfo& out = c.info(op.outputs[0]);
  std::vector<ArgRef> args;
  std::vector<Access> loads;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    const ValueInfo& in = c.info(op.inputs[k]);
    args.push_back({ArgRef::Kind::Input, static_cast<int>(k)});
    loads.push_back(access_of(static_cast<int>(k), in, broadcast_strides(in.shape, out.shape)));
  }
  args.push_back(kOut0);
  Access store = access_of(static_cast<int>(args.size()) - 1, out, out.shape.strides());
  const ScalarExp body = op.params.body;
  auto value = [body](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    return emit_scalar_exp(b, body, in);
  };
  return one(elementwise_launch("kiln_pointwise", out.shape, args, loads, store, value), "pointwise " + body.str());
}

namespace {

// Copies input `in_arg` read through `load` into the output written through `store`.
Launch copy_launch(const std::string& prefix, const Shape& domain, ArgRef from, ArgRef to, Access load, Access store) {
  load.arg = 0;
  store.arg = 1;
  auto value = [](KernelBuilder&, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    return in[0];
  };
  return elementwise_launch(prefix, domain, {from, to}, {load}, store, value);
}

}  // namespace

LoweredOp lower_move(const Circuit& c, const Op& op) {
  const std::string& prim = op.prim->name;  // kernel names
  const ValueInfo& x = c.info(op.inputs[0]);
  const std::vector<int64_t> xs = x.shape.strides();
  if (op.is(PrimId::permute) || op.is(PrimId::broadcast) || op.is(PrimId::slice)) {
    const ValueInfo& out = c.info(op.outputs[0]);
    std::vector<int64_t> st;
    int64_t base = 0;
    if (op.is(PrimId::permute)) {
      for (int64_t a : PermuteParams::of(op).perm) st.push_back(xs[static_cast<size_t>(a)]);
    } else if (op.is(PrimId::broadcast)) {
      st = broadcast_strides(x.shape, out.shape);
    } else {
      st = xs;
      const SliceParams sp = SliceParams::of(op);
      base = sp.start * xs[static_cast<size_t>(sp.axis)];
    }
    return one(copy_launch("kiln_" + prim, out.shape, kIn0, kOut0, access_of(0, x, st, base),
                           access_of(1, out, out.shape.strides())),
               prim + " as addressing");
  }
  LoweredOp r;
  const auto axis = static_cast<size_t>(op.is(PrimId::concat) ? ConcatParams::of(op).axis : SplitParams::of(op).axis);
  int64_t along = 0;
  if (op.is(PrimId::concat)) {
    // One launch over the output: each element's coordinate along the axis picks the input it
    // comes from (a chain of branches, one per input boundary) and its place there.
    const ValueInfo& out = c.info(op.outputs[0]);
    std::vector<ArgRef> args;
    std::vector<int64_t> ends;
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      args.push_back({ArgRef::Kind::Input, static_cast<int>(k)});
      along += c.info(op.inputs[k]).shape[static_cast<int>(axis)];
      ends.push_back(along);
    }
    args.push_back(kOut0);
    std::vector<Shape> in_shapes;
    for (ValueId v : op.inputs) in_shapes.push_back(c.info(v).shape);
    const Type t = kir_type(out.dtype);
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
          b.set(v, b.ld(Space::global, t, b.address(base[k], off, 4)));
        };
        if (k + 1 == ends.size()) return load();
        b.if_(b.setp(Cmp::lt, coords[axis], imm_index(it, ends[k])), load, [&] { pick(k + 1); });
      };
      pick(0);
      return v;
    };
    r.launches.push_back(elementwise_launch("kiln_concat", out.shape, args, {},
                                            access_of(static_cast<int>(args.size()) - 1, out, out.shape.strides()),
                                            value, true));
    r.summary = "concat: one launch, each element read from the input its coordinate falls in, " +
                launch_text(r.launches.back());
  } else if (op.is(PrimId::split)) {
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      const ValueInfo& piece = c.info(op.outputs[k]);
      r.launches.push_back(copy_launch("kiln_split", piece.shape, kIn0, {ArgRef::Kind::Output, static_cast<int>(k)},
                                       access_of(0, x, xs, along * xs[axis]),
                                       access_of(1, piece, piece.shape.strides())));
      along += piece.shape[static_cast<int>(axis)];
    }
    r.summary = "split: one copy per piece";
  } else {
    fail(prim, op.scope, "has no element-moving lowering");
  }
  return r;
}

LoweredOp lower_where(const Circuit& c, const Op& op) {
  const ValueInfo& out = c.info(op.outputs[0]);
  std::vector<Access> loads;
  for (int k = 0; k < 3; ++k) {
    const ValueInfo& in = c.info(op.inputs[static_cast<size_t>(k)]);
    loads.push_back(access_of(k, in, broadcast_strides(in.shape, out.shape)));
  }
  auto value = [](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    Operand zero = in[0].type == Type::f32 ? imm_f32(0.0f) : kir::imm_s32(0);
    return b.selp(Type::f32, in[1], in[2], b.setp(Cmp::ne, in[0], zero));
  };
  return one(elementwise_launch("kiln_where", out.shape, {kIn0, kIn1, kIn2, kOut0}, loads,
                                access_of(3, out, out.shape.strides()), value),
             "where");
}

LoweredOp lower_cast(const Circuit& c, const Op& op) {
  const ValueInfo& x = c.info(op.inputs[0]);
  const ValueInfo& out = c.info(op.outputs[0]);
  const DType to = out.dtype;
  auto value = [to](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    return in[0].type == kir_type(to) ? in[0] : b.cvt(kir_type(to), in[0]);
  };
  return one(elementwise_launch("kiln_cast", out.shape, {kIn0, kOut0}, {access_of(0, x, x.shape.strides())},
                                access_of(1, out, out.shape.strides()), value),
             std::string("cast ") + dtype_name(x.dtype) + " -> " + dtype_name(to));
}

LoweredOp lower_constant(const Circuit& c, const Op& op) {
  const ValueInfo& out = c.info(op.outputs[0]);
  const DType dt = out.dtype;
  Access store = access_of(0, out, out.shape.strides());
  if (op.is(PrimId::fill)) {
    const double v = FillParams::of(op).value;
    auto value = [dt, v](KernelBuilder& b, const std::vector<Reg>&, const std::vector<Reg>&, const std::vector<Reg>&) {
      return dt == DType::f32 ? b.mov(Type::f32, imm_f32(static_cast<float>(v)))
                              : b.mov(Type::s32, kir::imm_s32(static_cast<int32_t>(v)));
    };
    return one(elementwise_launch("kiln_fill", out.shape, {kOut0}, {}, store, value), "fill");
  }
  const IndexExp index = op.params.index;
  auto value = [dt, index](KernelBuilder& b, const std::vector<Reg>&, const std::vector<Reg>& coords,
                           const std::vector<Reg>&) { return b.cvt(kir_type(dt), emit_index_exp(b, index, coords)); };
  return one(elementwise_launch("kiln_iota", out.shape, {kOut0}, {}, store, value, true), "iota " + index.str());
}

LoweredOp lower_one_hot(const Circuit& c, const Op& op) {
  const ValueInfo& idx = c.info(op.inputs[0]);
  const ValueInfo& out = c.info(op.outputs[0]);
  const int64_t depth = OneHotParams::of(op).depth;
  std::vector<int64_t> st = idx.shape.strides();
  st.push_back(0);
  const DType dt = out.dtype;
  // Checks each index once (at depth coordinate 0) and records a bad one in the status words.
  auto value = [dt, depth](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>& coords,
                           const std::vector<Reg>& base) {
    Reg last = coords.back();
    Reg last_s = last.type == Type::u32 ? b.cvt(Type::s32, last) : b.cvt(Type::s32, last);
    Reg bad = b.or_(Type::pred, b.setp(Cmp::lt, in[0], kir::imm_s32(0)),
                    b.setp(Cmp::ge, in[0], kir::imm_s32(static_cast<int32_t>(depth))));
    Reg first = b.setp(Cmp::eq, last_s, kir::imm_s32(0));
    b.if_(b.and_(Type::pred, bad, first), [&] { record_index_error(b, base[2], in[0]); });
    Reg hit = b.setp(Cmp::eq, in[0], last_s);
    return to_store_type(b, dt, b.selp(Type::f32, imm_f32(1.0f), imm_f32(0.0f), hit));
  };
  return one(elementwise_launch("kiln_one_hot", out.shape, {kIn0, kOut0, {ArgRef::Kind::Status, 0}},
                                {access_of(0, idx, st)}, access_of(1, out, out.shape.strides()), value),
             "one_hot depth " + std::to_string(depth));
}

void record_index_error(KernelBuilder& b, Reg status, Reg index) {
  b.atom_add(Space::global, Type::u32, status, imm_u32(1));
  b.st(Space::global, Type::s32, status, index, 4);
}

LoweredOp lower_random(const Circuit& c, const Op& op) {
  const ValueInfo& out = c.info(op.outputs[0]);
  const RandomParams rp = RandomParams::of(op);
  const RandomKind kind = rp.kind;
  // u < p <=> (bits >> 8) < p * 2^24 <=> (bits >> 8) < ceil(p * 2^24): an exact integer test,
  // so Bernoulli masks are bit-identical to the reference's.
  const double threshold = std::ceil(rp.probability * 16777216.0);
  const DType dt = out.dtype;
  auto value = [kind, threshold, dt](KernelBuilder& b, const std::vector<Reg>&, const std::vector<Reg>& coords,
                                     const std::vector<Reg>& base) {
    Reg i = coords[0];  // the flat element index (the domain is 1-D)
    Reg i64 = i.type == Type::u64 ? i : b.cvt(Type::u64, i);
    Reg key0 = b.ld(Space::global, Type::u32, base[0]), key1 = b.ld(Space::global, Type::u32, base[0], 4);
    Reg offset = b.ld(Space::global, Type::u32, base[1]);
    // Uniform and Bernoulli take word i % 4 of counter block i / 4; normal takes words 2i % 4
    // and 2i % 4 + 1 of block 2i / 4 = i / 2.
    const bool normal = kind == RandomKind::Normal;
    Reg block = b.shr(Type::u64, i64, imm_u32(normal ? 1 : 2));
    Reg word = b.cvt(Type::u32, b.and_(Type::u64, i64, kir::imm_u64(normal ? 1 : 3)));
    if (normal) word = b.shl(Type::u32, word, imm_u32(1));
    std::vector<Reg> r = emit_philox(b,
                                     {b.cvt(Type::u32, block), b.cvt(Type::u32, b.shr(Type::u64, block, imm_u32(32))),
                                      offset, b.mov(Type::u32, imm_u32(0))},
                                     {key0, key1});
    auto pick = [&](Reg w) {
      Reg v = r[3];
      for (int k = 2; k >= 0; --k) v = b.selp(Type::u32, r[static_cast<size_t>(k)], v, b.setp(Cmp::eq, w, imm_u32(k)));
      return v;
    };
    auto uniform = [&](Reg bits) {
      return b.mul(Type::f32, b.cvt(Type::f32, b.shr(Type::u32, bits, imm_u32(8))), imm_f32(1.0f / 16777216.0f));
    };
    Reg v;
    if (kind == RandomKind::Uniform) {
      v = uniform(pick(word));
    } else if (kind == RandomKind::Bernoulli) {
      Reg hi = b.shr(Type::u32, pick(word), imm_u32(8));
      Operand t = threshold >= 16777216.0 ? Operand(imm_u32(16777216u)) : imm_u32(static_cast<uint32_t>(threshold));
      v = b.selp(Type::f32, imm_f32(1.0f), imm_f32(0.0f), b.setp(Cmp::lt, hi, t));
    } else {
      Reg u1 = uniform(pick(word)), u2 = uniform(pick(b.add(Type::u32, word, imm_u32(1))));
      Reg one_minus = b.sub(Type::f32, imm_f32(1.0f), u1);
      Reg lg = b.unary(kir::Opc::Lg2, Type::f32, one_minus);
      // lg2.approx's absolute error can make lg2(1 - u1) slightly positive for u1 near 0:
      // clamp so the radius is never the sqrt of a negative.
      Reg r2 = b.max(Type::f32, b.mul(Type::f32, lg, imm_f32(static_cast<float>(-2.0 * M_LN2))), imm_f32(0.0f));
      Reg radius = b.unary(kir::Opc::Sqrt, Type::f32, r2);
      Reg angle = b.mul(Type::f32, u2, imm_f32(static_cast<float>(2 * M_PI)));
      v = b.mul(Type::f32, radius, emit_scalar_exp(b, se::cos(se::in(0)), {angle}));
    }
    return to_store_type(b, dt, v);
  };
  Shape flat{out.shape.numel()};
  ValueInfo flat_out{flat, out.dtype};
  static const char* kKinds[] = {"uniform", "normal", "bernoulli"};
  return one(elementwise_launch("kiln_random", flat, {kIn0, kIn1, kOut0}, {}, access_of(2, flat_out, {1}), value, true),
             std::string("random ") + kKinds[static_cast<size_t>(kind)] + " (Philox4x32-10, the reference's bits)");
}

}  // namespace kiln::cuda
