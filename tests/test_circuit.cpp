// Circuit, passes and errors: DCE/CSE, verify() of persistent-buffer ordering, structural
// hashing/equality, dump(); and bad input of every kind, which must throw kiln::Error (never
// crash) with a message naming the op, the shapes and the layer; plus the gradient checker on NaN.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include <kiln/ad/gradcheck.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/cleanup.hpp>

#include "prim_test_util.hpp"

namespace kiln {
namespace {

const DType f32 = DType::f32, f64 = DType::f64, i32 = DType::i32;

using testing::count_prim;

// Runs f, which must throw kiln::Error; returns its message ("" and a test failure otherwise).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected kiln::Error, nothing was thrown";
  return {};
}

// Evaluates msg once (it is often an error_of(...) call).
#define EXPECT_HAS(msg, part)                                                                     \
  do {                                                                                            \
    const std::string m_ = (msg), p_ = (part);                                                    \
    EXPECT_NE(m_.find(p_), std::string::npos) << "missing \"" << p_ << "\" in: \"" << m_ << "\""; \
  } while (0)

HostTensor zeros(DType dt, Shape s) { return HostTensor::zeros(dt, std::move(s)); }
HostTensor ints(Shape s, const std::vector<int32_t>& v) {
  HostTensor t = zeros(i32, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}

// --- passes ---------------------------------------------------------------------------------

TEST(CircuitDce, RemovesUnusedOpKeepsAssignWhoseResultIsUnused) {
  Circuit c;
  ValueId p = c.add_external({Shape{3}, f64}, ValueRole::Persistent, "p");
  ValueId x = c.add_external({Shape{3}, f64}, ValueRole::Input, "x");
  Builder b(c);
  b.pointwise(se::exp(se::in(0)), {x});  // unused
  ValueId y = b.scale(x, 2.0);
  b.assign(p, b.add(y, x));  // result unused, but a side effect
  ASSERT_EQ(c.ops().size(), 4u);
  std::vector<ValueId> outs{y};
  Circuit d = dce(c, outs);
  EXPECT_EQ(d.ops().size(), 3u) << d.dump();
  EXPECT_EQ(count_prim(d, PrimId::assign), 1u);
  EXPECT_EQ(d.value(outs[0]).producer, 0) << d.dump();
  EXPECT_NO_THROW(d.verify());
  HostTensor buf = zeros(f64, Shape{3}), xv = zeros(f64, Shape{3});
  for (int i = 0; i < 3; ++i) xv.set(i, i + 1.0);
  auto r = execute(d, {buf, xv}, outs);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r[0].get(i), 2.0 * (i + 1));
    EXPECT_EQ(buf.get(i), 3.0 * (i + 1)) << "the kept assign must still write the buffer";
  }
}

// replace_ops: y = exp(x) * 2, z = y + 1 with (exp, mul) replaced in place by one pointwise op
// that keeps y's id: z still reads y, the values are the same, and the exp's output is left
// without a producer. A replacement naming an op twice, a place that is not removed, a kept
// value of another type or from no removed op, or one that leaves a read value without a
// producer is an error and changes nothing.
TEST(CircuitReplaceOps, OneOpTakesTheRemovedOpsPlaceAndKeepsTheirValueIds) {
  Circuit c;
  Builder b(c);
  const ValueId x = c.add_external({Shape{3}, f64}, ValueRole::Input);
  const ValueId e = b.pointwise(se::exp(se::in(0)), {x});
  const ValueId y = b.scale(e, 2.0);
  const ValueId z = b.add(y, b.fill(Shape{3}, f64, 1.0));
  const HostTensor xs = testing::random_tensor({Shape{3}, f64, -1, 1}, 3);
  const HostTensor want = execute(c, {xs}, {z})[0];
  OpReplacement r;
  r.removed = {c.value(e).producer, c.value(y).producer};
  r.at = c.value(y).producer;
  r.prim = &PrimRegistry::instance().get(PrimId::pointwise);
  r.params.body = se::exp(se::in(0)) * se::c(2.0);
  r.inputs = {x};
  r.kept = {y};
  c.replace_ops({r});
  EXPECT_EQ(c.ops().size(), 3u);  // the fill, the new op, the add
  EXPECT_EQ(c.value(e).producer, -1);
  EXPECT_EQ(c.ops()[static_cast<size_t>(c.value(y).producer)].params.body, r.params.body);
  EXPECT_LT(testing::relative_error(execute(c, {xs}, {z})[0], want), 1e-15);

  Circuit d;
  Builder bd(d);
  const ValueId u = d.add_external({Shape{3}, f64}, ValueRole::Input);
  const ValueId v = bd.pointwise(se::exp(se::in(0)), {u});
  const OpReplacement twice{{0, 0}, 0, &PrimRegistry::instance().get(PrimId::pointwise), r.params, {u}, {v}};
  EXPECT_HAS(error_of([&] { d.replace_ops({twice}); }), "op #0 is not an op left to remove");
  OpReplacement elsewhere{{0}, 1, twice.prim, r.params, {u}, {v}};
  EXPECT_HAS(error_of([&] { d.replace_ops({elsewhere}); }), "op #1, is not a removed op");
  OpReplacement wrong_type{{0}, 0, twice.prim, r.params, {bd.reduce_all(ReduceKind::Sum, u)}, {v}};
  EXPECT_HAS(error_of([&] { d.replace_ops({wrong_type}); }), "replace_ops: kept value");
  // Keeping a value no removed op made, or leaving a reader of a removed op's output: refused,
  // the circuit unchanged.
  const ValueId w = bd.pointwise(se::in(0) * se::c(3.0), {v});  // op #2 reads v
  const size_t ops_before = d.ops().size();
  OpReplacement foreign{{0}, 0, twice.prim, r.params, {u}, {u}};
  EXPECT_HAS(error_of([&] { d.replace_ops({foreign}); }), "is not an output of a removed op");
  OpReplacement orphaning{{0}, 0, twice.prim, r.params, {u}, {}};
  EXPECT_HAS(error_of([&] { d.replace_ops({orphaning}); }), "an output of a removed op");
  EXPECT_EQ(d.ops().size(), ops_before);
  EXPECT_EQ(d.value(w).producer, 2);
  EXPECT_EQ(d.value(v).producer, 0);
}

TEST(CircuitCse, MergesIdenticalPointwiseOps) {
  Circuit c;
  ValueId x = c.add_external({Shape{2, 3}, f32}, ValueRole::Input, "x");
  ValueId y = c.add_external({Shape{2, 3}, f32}, ValueRole::Input, "y");
  Builder b(c);
  ValueId a1 = b.add(x, y), a2 = b.add(x, y);
  ValueId e1 = b.pointwise(se::exp(se::in(0)), {a1}),
          e2 = b.pointwise(se::exp(se::in(0)), {a2});  // equal once a1 == a2
  ValueId out = b.mul(e1, e2);
  ASSERT_EQ(c.ops().size(), 5u);
  std::vector<ValueId> outs{out, e2};
  Circuit d = cse(c, outs);
  EXPECT_EQ(d.ops().size(), 3u) << d.dump();
  const Op& mul = d.ops().back();
  EXPECT_EQ(mul.inputs[0], mul.inputs[1]);
  EXPECT_EQ(outs[1], mul.inputs[0]);
  HostTensor xv = testing::random_tensor({Shape{2, 3}, f32}, 1), yv = testing::random_tensor({Shape{2, 3}, f32}, 2);
  auto before = execute(c, {xv, yv}, {out}), after = execute(d, {xv, yv}, {outs[0]});
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(before[0].get(i), after[0].get(i));
}

// A position embedding over the full context: gather_rows(w, 0..R-1) is w, and the gradient's
// scatter_add_rows(0..R-1, g) is g; neither runs. Shorter ranges, other indices, and a gather
// a reader of which follows the assign that overwrites w stay.
TEST(SimplifyRowIndexing, GathersAndScattersByTheFullRangeAreIdentities) {
  Circuit c;
  ValueId w = c.add_external({Shape{4, 3}, f32}, ValueRole::Persistent, "w");
  ValueId g = c.add_external({Shape{4, 3}, f32}, ValueRole::Input, "g");
  Builder b(c);
  ValueId pos = b.iota(Shape{4}, DType::i32, ix::coord(0));
  ValueId rows = b.gather_rows(w, pos);
  ValueId part = b.gather_rows(w, b.iota(Shape{3}, DType::i32, ix::coord(0)));                        // 3 of 4 rows
  ValueId flipped = b.gather_rows(w, b.iota(Shape{4}, DType::i32, ix::sub(ix::c(3), ix::coord(0))));  // reversed
  ValueId grad = b.scatter_add_rows(pos, g, 4);
  ValueId out = b.add(b.mul(rows, grad), b.reduce(ReduceKind::Sum, b.add(part, b.slice(flipped, 0, 0, 3)), 0));
  std::vector<ValueId> outs{out};
  Circuit d = simplify_row_indexing(c, outs);
  EXPECT_EQ(testing::count_prim(d, PrimId::gather_rows), 2u) << d.dump();
  EXPECT_EQ(testing::count_prim(d, PrimId::scatter_add_rows), 0u) << d.dump();
  std::vector<HostTensor> binds = {testing::random_tensor({Shape{4, 3}, f32}, 1),
                                   testing::random_tensor({Shape{4, 3}, f32}, 2)};
  HostTensor before = execute(c, binds, {out})[0], after = execute(d, binds, outs)[0];
  for (int64_t i = 0; i < before.numel(); ++i) EXPECT_EQ(before.get(i), after.get(i)) << i;

  // The gather's reader comes after w is overwritten: it must read the old rows, so it stays.
  Circuit e;
  ValueId w2 = e.add_external({Shape{4, 3}, f32}, ValueRole::Persistent, "w");
  Builder eb(e);
  ValueId old_rows = eb.gather_rows(w2, eb.iota(Shape{4}, DType::i32, ix::coord(0)));
  eb.assign(w2, eb.scale(w2, 2.0));
  std::vector<ValueId> eouts{eb.scale(old_rows, 3.0)};
  EXPECT_EQ(testing::count_prim(simplify_row_indexing(e, eouts), PrimId::gather_rows), 1u);
}

TEST(CircuitCse, KeepsOpsWithDifferentParamsOrWiring) {
  Circuit c;
  ValueId x = c.add_external({Shape{4}, f64}, ValueRole::Input, "x");
  ValueId y = c.add_external({Shape{4}, f64}, ValueRole::Input, "y");
  Builder b(c);
  ValueId s2 = b.scale(x, 2.0), s3 = b.scale(x, 3.0);
  ValueId d1 = b.sub(x, y), d2 = b.sub(y, x);
  ValueId r1 = b.reduce(ReduceKind::Sum, b.reshape(x, Shape{2, 2}), 0),
          r2 = b.reduce(ReduceKind::Max, b.reshape(x, Shape{2, 2}), 0);
  std::vector<ValueId> outs{s2, s3, d1, d2, r1, r2};
  Circuit d = cse(c, outs);
  EXPECT_EQ(d.ops().size(), c.ops().size() - 1) << "only the two equal reshapes merge\n" << d.dump();
  for (size_t i = 0; i < outs.size(); ++i)
    for (size_t j = i + 1; j < outs.size(); ++j) EXPECT_NE(outs[i], outs[j]) << i << " vs " << j;
}

TEST(CircuitCse, NeverMergesAssigns) {
  Circuit c;
  ValueId p = c.add_external({Shape{3}, f32}, ValueRole::Persistent, "p");
  ValueId x = c.add_external({Shape{3}, f32}, ValueRole::Input, "x");
  Builder b(c);
  ValueId v1 = b.assign(p, x);
  ValueId v2 = b.assign(p, x);  // identical prim, params and inputs (an invalid circuit, but CSE must not merge)
  std::vector<ValueId> outs{v1, v2};
  Circuit d = cse(c, outs);
  EXPECT_EQ(count_prim(d, PrimId::assign), 2u) << d.dump();
  EXPECT_NE(outs[0], outs[1]);
}

// --- verify ---------------------------------------------------------------------------------

TEST(CircuitVerify, ReadOfOldVersionAfterAssignThrows) {
  Circuit c;
  ValueId p = c.add_external({Shape{3}, f32}, ValueRole::Persistent, "w");
  ValueId x = c.add_external({Shape{3}, f32}, ValueRole::Input, "x");
  Params body;
  body.body = se::in(0) * se::c(2.0);
  c.add_op("pointwise", body, {p});  // before the assign: fine
  c.add_op("assign", {}, {p, x});
  EXPECT_NO_THROW(c.verify());
  ValueId late = c.add_op("pointwise", body, {p}, "opt").at(0);  // reads the overwritten version
  std::string msg = error_of([&] { c.verify(); });
  EXPECT_HAS(msg, "pointwise");
  EXPECT_HAS(msg, "assign");
  EXPECT_HAS(msg, "in layer 'opt'");
  EXPECT_THROW(execute(c, {zeros(f32, Shape{3}), zeros(f32, Shape{3})}, {late}), Error);
}

TEST(CircuitVerify, BufferVersionAssignedTwiceThrows) {
  Circuit c;
  ValueId p = c.add_external({Shape{2}, f64}, ValueRole::Persistent, "m");
  ValueId x = c.add_external({Shape{2}, f64}, ValueRole::Input, "x");
  ValueId v1 = c.add_op("assign", {}, {p, x}).at(0);
  c.add_op("assign", {}, {v1, x});  // a chain of versions is fine
  EXPECT_NO_THROW(c.verify());
  c.add_op("assign", {}, {v1, x});  // version v1 assigned a second time
  std::string msg = error_of([&] { c.verify(); });
  EXPECT_HAS(msg, "assign");
}

TEST(CircuitVerify, AssignToNonPersistentValueThrows) {
  Circuit c;
  ValueId x = c.add_external({Shape{2}, f64}, ValueRole::Input, "x");
  c.add_op("assign", {}, {x, x});
  std::string msg = error_of([&] { c.verify(); });
  EXPECT_HAS(msg, "not a persistent buffer");
}

// --- structural identity and dump -----------------------------------------------------------

struct Variant {
  double scale = 2.0;
  int64_t cols = 3;
  bool swap = false;
  std::string name = "x", scope = "a";
};

Circuit build(const Variant& v) {
  Circuit c;
  ValueId x = c.add_external({Shape{2, v.cols}, f32}, ValueRole::Input, v.name);
  ValueId y = c.add_external({Shape{2, v.cols}, f32}, ValueRole::Persistent, "y");
  Builder b(c, v.scope);
  ValueId s = v.swap ? b.sub(y, x) : b.sub(x, y);
  b.reduce(ReduceKind::Sum, b.scale(s, v.scale), 1);
  return c;
}

TEST(CircuitStructure, IdenticalCircuitsHashAndCompareEqual) {
  Circuit a = build({}), b = build({});
  EXPECT_EQ(a.structural_hash(), b.structural_hash());
  EXPECT_TRUE(a.structurally_equal(b));
  Variant renamed;
  renamed.name = "other";
  EXPECT_TRUE(a.structurally_equal(build(renamed))) << "names are not part of the structure";
  EXPECT_EQ(a.structural_hash(), build(renamed).structural_hash());
}

TEST(CircuitStructure, ParamShapeOrWiringChangesIdentity) {
  Circuit base = build({});
  Variant param, shape, wiring;
  param.scale = 3.0;
  shape.cols = 4;
  wiring.swap = true;
  for (const Variant& v : {param, shape, wiring}) {
    Circuit o = build(v);
    EXPECT_NE(base.structural_hash(), o.structural_hash()) << o.dump();
    EXPECT_FALSE(base.structurally_equal(o)) << o.dump();
  }
  // An external's role is part of the structure too.
  Circuit roles;
  roles.add_external({Shape{2, 3}, f32}, ValueRole::Input, "x");
  roles.add_external({Shape{2, 3}, f32}, ValueRole::Input, "y");
  Builder b(roles, "a");
  b.reduce(ReduceKind::Sum, b.scale(b.sub(0, 1), 2.0), 1);
  EXPECT_FALSE(base.structurally_equal(roles));
  EXPECT_NE(base.structural_hash(), roles.structural_hash());
}

TEST(CircuitDump, NamesPrimsScopesAndTypes) {
  Circuit c;
  ValueId x = c.add_external({Shape{2, 3}, f32}, ValueRole::Input, "x");
  ValueId w = c.add_external({Shape{3, 4}, f32}, ValueRole::Persistent, "w");
  Builder b(c, "layer");
  b.reduce(ReduceKind::Max, b.matmul(x, w, false, false), 1);
  std::string d = c.dump("fwd");
  EXPECT_HAS(d, "fwd");
  EXPECT_HAS(d, "matmul(%0, %1)");
  EXPECT_HAS(d, "reduce(");
  EXPECT_HAS(d, "# layer");
  EXPECT_HAS(d, "f32[2, 3]");
  EXPECT_HAS(d, "f32[2, 4]");
  EXPECT_HAS(d, "'w'");
  EXPECT_HAS(d, "persistent");
}

// --- errors at build time: op name, both shapes, layer ----------------------------------------

struct ErrNet {
  Circuit c;
  Builder b{c, "blk.1"};
  ValueId in(Shape s, DType dt = f32, std::string name = "v") {
    return c.add_external({std::move(s), dt}, ValueRole::Input, std::move(name));
  }
};

TEST(Errors, PointwiseShapesDoNotBroadcast) {
  ErrNet n;
  ValueId a = n.in(Shape{3, 4}), b = n.in(Shape{5});
  std::string msg = error_of([&] { n.b.add(a, b); });
  EXPECT_HAS(msg, "op 'pointwise'");
  EXPECT_HAS(msg, "[3, 4]");
  EXPECT_HAS(msg, "[5]");
  EXPECT_HAS(msg, "in layer 'blk.1'");
}

TEST(Errors, MatmulInnerDimMismatchAndRank) {
  ErrNet n;
  ValueId a = n.in(Shape{2, 3}), b = n.in(Shape{4, 5}), v = n.in(Shape{3});
  std::string msg = error_of([&] { n.b.matmul(a, b); });
  EXPECT_HAS(msg, "op 'matmul' in layer 'blk.1'");
  EXPECT_HAS(msg, "[2, 3]");
  EXPECT_HAS(msg, "[4, 5]");
  msg = error_of([&] { n.b.matmul(v, b); });
  EXPECT_HAS(msg, "op 'matmul'");
  EXPECT_HAS(msg, "[3]");
  EXPECT_HAS(msg, "rank");
  msg = error_of([&] { n.b.matmul(n.in(Shape{2, 2, 3}), n.in(Shape{3, 3, 4})); });
  EXPECT_HAS(msg, "batch");
}

TEST(Errors, NoImplicitDtypePromotionAndFloatOnly) {
  ErrNet n;
  ValueId a = n.in(Shape{2}, f32), b = n.in(Shape{2}, f64), k = n.in(Shape{2}, i32);
  std::string msg = error_of([&] { n.b.add(a, b); });
  EXPECT_HAS(msg, "op 'pointwise'");
  EXPECT_HAS(msg, "no implicit promotion");
  EXPECT_HAS(msg, "f32");
  EXPECT_HAS(msg, "f64");
  msg = error_of([&] { n.b.scale(k, 2.0); });
  EXPECT_HAS(msg, "op 'pointwise'");
  EXPECT_HAS(msg, "must be a float tensor");
  EXPECT_HAS(msg, "i32[2]");
  msg = error_of([&] { n.b.matmul(n.in(Shape{2, 2}, f32), n.in(Shape{2, 2}, f64)); });
  EXPECT_HAS(msg, "no implicit promotion");
}

TEST(Errors, LayoutOpsNameOpAndShapes) {
  ErrNet n;
  ValueId x = n.in(Shape{2, 3}), y = n.in(Shape{3, 3}), x3 = n.in(Shape{2, 3, 4});
  std::string msg = error_of([&] { n.b.reshape(x, Shape{4, 2}); });
  EXPECT_HAS(msg, "op 'reshape' in layer 'blk.1'");
  EXPECT_HAS(msg, "[2, 3]");
  EXPECT_HAS(msg, "[4, 2]");
  msg = error_of([&] { n.b.permute(x3, {0, 0, 1}); });
  EXPECT_HAS(msg, "op 'permute'");
  EXPECT_HAS(msg, "[2, 3, 4]");
  EXPECT_HAS(error_of([&] { n.b.permute(x3, {1, 0}); }), "op 'permute'");
  msg = error_of([&] { n.b.slice(x, 1, 2, 7); });
  EXPECT_HAS(msg, "op 'slice'");
  EXPECT_HAS(msg, "[2, 3]");
  EXPECT_HAS(error_of([&] { n.b.slice(x, 0, 2, 1); }), "op 'slice'");
  msg = error_of([&] { n.b.concat({x, y}, 1); });
  EXPECT_HAS(msg, "op 'concat'");
  EXPECT_HAS(msg, "[2, 3]");
  EXPECT_HAS(msg, "[3, 3]");
  EXPECT_HAS(error_of([&] { n.b.concat({x, n.in(Shape{2, 3}, f64)}, 0); }), "f64");
  msg = error_of([&] { n.b.reduce(ReduceKind::Sum, x3, 3); });
  EXPECT_HAS(msg, "op 'reduce'");
  EXPECT_HAS(msg, "axis 3");
  EXPECT_HAS(msg, "[2, 3, 4]");
  EXPECT_HAS(error_of([&] { n.b.reduce(ReduceKind::Mean, x3, -4); }), "op 'reduce'");
  msg = error_of([&] { n.b.broadcast(x, Shape{2, 4, 3}); });
  EXPECT_HAS(msg, "op 'broadcast'");
  EXPECT_HAS(msg, "[2, 4, 3]");
  EXPECT_HAS(error_of([&] { n.b.where(x, x, n.in(Shape{4})); }), "op 'where'");
}

TEST(Errors, IndexAndConstantOpsCheckTheirInputs) {
  ErrNet n;
  ValueId t = n.in(Shape{5, 3}), fidx = n.in(Shape{4}, f32), idx = n.in(Shape{4}, i32);
  std::string msg = error_of([&] { n.b.gather_rows(t, fidx); });
  EXPECT_HAS(msg, "op 'gather_rows'");
  EXPECT_HAS(msg, "i32");
  EXPECT_HAS(error_of([&] { n.b.scatter_add_rows(idx, n.in(Shape{3, 2}), 5); }), "op 'scatter_add_rows'");
  EXPECT_HAS(error_of([&] { n.b.one_hot(idx, 0, f32); }), "op 'one_hot'");
  EXPECT_HAS(error_of([&] { n.b.fill(Shape{-1, 2}, f32, 0.0); }), "op 'fill'");
  EXPECT_HAS(error_of([&] { n.b.iota(Shape{3}, i32, ix::coord(1)); }), "op 'iota'");
  EXPECT_HAS(error_of([&] { n.b.random(RandomKind::Uniform, Shape{2}, f32, idx, n.in(Shape{}, i32)); }), "op 'random'");
  EXPECT_HAS(error_of([&] {
               n.b.assign(n.c.add_external({Shape{2}, f32}, ValueRole::Persistent, "p"), t);
             }),
             "op 'assign'");
  EXPECT_HAS(error_of([&] { n.c.add_op("no_such_prim", {}, {t}); }), "unknown Prim 'no_such_prim'");
}

// Shape params are dims: a negative one must be rejected by every Prim that takes a shape, as
// fill does. (iota, random and broadcast accept them; broadcast then crashes at run time.)
TEST(Errors, NegativeDimsInShapeParamsAreRejected) {
  ErrNet n;
  ValueId one = n.in(Shape{1}), key = n.in(Shape{2}, i32), off = n.in(Shape{}, i32);
  EXPECT_HAS(error_of([&] { n.b.fill(Shape{-2, 3}, f32, 1.0); }), "op 'fill'");
  EXPECT_HAS(error_of([&] { n.b.iota(Shape{-2, 3}, f32, ix::coord(1)); }), "op 'iota'");
  EXPECT_HAS(error_of([&] { n.b.random(RandomKind::Uniform, Shape{-4}, f32, key, off); }), "op 'random'");
  EXPECT_HAS(error_of([&] { n.b.broadcast(one, Shape{-3}); }), "op 'broadcast'");
}

// add_op is public: a Prim's params come from the caller, and malformed ones must be a
// kiln::Error like every other bad input (matmul reads ints.at(0) unchecked).
TEST(Errors, MalformedParamsThroughAddOpThrowKilnError) {
  ErrNet n;
  ValueId x = n.in(Shape{2, 2});
  EXPECT_THROW(n.c.add_op("matmul", Params{}, {x, x}, "blk.1"), Error);
  EXPECT_THROW(n.c.add_op("reduce", Params{}, {x}), Error);
  EXPECT_THROW(n.c.add_op("slice", Params{}, {x}), Error);
  EXPECT_THROW(n.c.add_op("pointwise", Params{}, {x}), Error);
  EXPECT_THROW(n.c.add_op("random", Params{}, {x}), Error);
}

// --- errors at run time --------------------------------------------------------------------

TEST(Errors, GatherOneHotScatterIndexOutOfRangeAtRunTime) {
  // One circuit per Prim: table [5, 3] (or depth / rows 5), idx i32 [4].
  const std::vector<std::pair<std::string, std::function<ValueId(Builder&, ValueId, ValueId)>>> prims = {
      {"gather_rows", [](Builder& b, ValueId t, ValueId i) { return b.gather_rows(t, i); }},
      {"one_hot", [](Builder& b, ValueId, ValueId i) { return b.one_hot(i, 5, f32); }},
      {"scatter_add_rows",
       [](Builder& b, ValueId, ValueId i) {
         return b.scatter_add_rows(i, b.fill(Shape{4, 2}, f32, 1.0), 5);
       }},
  };
  for (const auto& [prim, build] : prims) {
    Circuit c;
    ValueId t = c.add_external({Shape{5, 3}, f32}, ValueRole::Input, "table");
    ValueId idx = c.add_external({Shape{4}, i32}, ValueRole::Input, "idx");
    Builder b(c, "embed");
    ValueId out = build(b, t, idx);
    HostTensor table = zeros(f32, Shape{5, 3});
    EXPECT_NO_THROW(execute(c, {table, ints(Shape{4}, {0, 4, 4, 1})}, {out})) << prim;
    for (int32_t bad : {5, 7, -1}) {
      std::string msg = error_of([&] { execute(c, {table, ints(Shape{4}, {0, 4, bad, 1})}, {out}); });
      EXPECT_HAS(msg, "op '" + prim + "'");
      EXPECT_HAS(msg, "index " + std::to_string(bad));
      EXPECT_HAS(msg, "position 2");
      EXPECT_HAS(msg, "[0, 5)");
      EXPECT_HAS(msg, "in layer 'embed'");
    }
  }
}

TEST(Errors, ExecutorBindingsAreChecked) {
  Circuit c;
  ValueId x = c.add_external({Shape{2, 3}, f32}, ValueRole::Input, "x");
  ValueId w = c.add_external({Shape{3}, f32}, ValueRole::Persistent, "w");
  Builder b(c);
  ValueId y = b.mul(x, w);
  std::string msg = error_of([&] { execute(c, {zeros(f32, Shape{3, 2}), zeros(f32, Shape{3})}, {y}); });
  EXPECT_HAS(msg, "%0 'x'");
  EXPECT_HAS(msg, "f32[2, 3]");
  EXPECT_HAS(msg, "f32[3, 2]");
  msg = error_of([&] { execute(c, {zeros(f32, Shape{2, 3}), zeros(f64, Shape{3})}, {y}); });
  EXPECT_HAS(msg, "'w'");
  EXPECT_HAS(msg, "f64[3]");
  msg = error_of([&] { execute(c, {zeros(f32, Shape{2, 3})}, {y}); });
  EXPECT_HAS(msg, "2 external values");
  EXPECT_HAS(msg, "1 were bound");
  EXPECT_HAS(error_of([&] { execute(c, {zeros(f32, Shape{2, 3}), HostTensor()}, {y}); }), "'w'");
}

// f16 is declared for the GPU only (bf16 runs on the host: test_bf16.cpp).
TEST(Errors, HostExecutorRejectsStorageOnlyDtypes) {
  Circuit c;
  ValueId x = c.add_external({Shape{2}, f32}, ValueRole::Input, "x");
  Builder b(c, "lowp");
  ValueId h = b.cast(x, DType::f16);
  std::string msg = error_of([&] { execute(c, {zeros(f32, Shape{2})}, {h}); });
  EXPECT_HAS(msg, "op 'cast'");
  EXPECT_HAS(msg, "f16");
  EXPECT_HAS(msg, "in layer 'lowp'");
}

// Output ids are caller input too: an id that is not a value of the circuit must be an error.
// Run in a child process, since the failure mode is heap corruption.
TEST(Errors, ExecuteWithUnknownOutputIdThrows) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto attempt = [](ValueId bad) {
    Circuit c;
    ValueId x = c.add_external({Shape{2}, f32}, ValueRole::Input, "x");
    Builder b(c);
    b.scale(x, 2.0);
    try {
      execute(c, {zeros(f32, Shape{2})}, {bad});
    } catch (const Error&) {
      std::exit(0);
    }
    std::exit(1);
  };
  EXPECT_EXIT(attempt(99), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(attempt(kNoValue), ::testing::ExitedWithCode(0), "");
}

// --- the gradient checker never passes on NaN ------------------------------------------------

TEST(Errors, GradientCheckOnNanOutputThrows) {
  testing::Harness h({{Shape{3}, f64, -2.0, -1.0}},
                     [](Builder& b, const std::vector<ValueId>& x) { return b.pointwise(se::log(se::in(0)), {x[0]}); });
  std::string msg = error_of([&] { ad::check_gradients(h.circuit, h.output, {h.inputs[0]}, h.bindings); });
  EXPECT_HAS(msg, "nan");
  // NaN from an input that is not checked still poisons the output and must not pass.
  testing::Harness h2({{Shape{3}, f64}, {Shape{3}, f64, -2.0, -1.0, false}},
                      [](Builder& b, const std::vector<ValueId>& x) {
                        return b.pointwise(se::in(0) * se::log(se::in(1)), {x[0], x[1]});
                      });
  msg = error_of([&] { ad::check_gradients(h2.circuit, h2.output, {h2.inputs[0]}, h2.bindings); });
  EXPECT_HAS(msg, "nan");
}

}  // namespace
}  // namespace kiln
