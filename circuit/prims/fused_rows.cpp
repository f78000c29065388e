// Prim family `fused_rows`: a row kernel built by the row-epilogue fusion pass (see
// circuit/prims/fused_rows.hpp for its program and shape contract). The pass runs after AD, so the
// Prim has no VJP rule. Reference: rows that fit a block (all of a transformer's but a large
// vocabulary's) run in chunks of whole rows, every body at once (circuit/prims/row_chunks.hpp);
// longer rows one at a time, each reduction body visiting the row block by block and reducing
// it in order, then each output body. Nothing of a row but its reductions is kept between
// phases there.
#include <spdlog/fmt/fmt.h>

#include <limits>
#include <memory>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/body_eval.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/row_chunks.hpp>

namespace kiln {

Shape RowProgram::row_shape() const {
  Shape s = domain;
  s[s.rank() - 1] = 1;
  return s;
}

Shape RowProgram::padded_domain(size_t o) const {
  Shape s = domain;
  s[s.rank() - 1] += padding(o);
  return s;
}

Params RowProgram::to_params(DType dtype) const {
  Params p;
  p.dtype = dtype;
  p.ints = {inputs, domain.rank()};
  for (int64_t d : domain.dims()) p.ints.push_back(d);
  p.ints.push_back(static_cast<int64_t>(reduction_kinds.size()));
  for (ReduceKind k : reduction_kinds) p.ints.push_back(static_cast<int64_t>(k));
  p.ints.push_back(static_cast<int64_t>(output_per_row.size()));
  // Per output: bit 0 per row, bit 1 stored as bf16, the padding from bit 2 on.
  for (size_t o = 0; o < output_per_row.size(); ++o)
    p.ints.push_back((output_per_row[o] ? 1 : 0) | (stored_bf16(o) ? 2 : 0) | padding(o) << 2);
  p.bodies = reduction_bodies;
  p.bodies.insert(p.bodies.end(), output_bodies.begin(), output_bodies.end());
  return p;
}

RowProgram RowProgram::from_params(const Params& p) {
  RowProgram rp;
  size_t at = 0;
  auto next = [&]() -> int64_t {
    if (at >= p.ints.size()) throw Error("fused_rows: malformed params (too few ints)");
    return p.ints[at++];
  };
  rp.inputs = static_cast<int>(next());
  const int64_t rank = next();
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < rank; ++i) dims.push_back(next());
  rp.domain = Shape(dims);
  const int64_t nred = next();
  for (int64_t i = 0; i < nred; ++i) {
    const int64_t k = next();
    if (k < 0 || k > 2) throw Error("fused_rows: malformed params (reduction kind " + std::to_string(k) + ")");
    rp.reduction_kinds.push_back(static_cast<ReduceKind>(k));
  }
  const int64_t nout = next();
  for (int64_t i = 0; i < nout; ++i) {
    const int64_t flags = next();
    if (flags < 0 || ((flags & 1) != 0 && flags >> 2 != 0))
      throw Error("fused_rows: malformed params (output flags " + std::to_string(flags) + ")");
    rp.output_per_row.push_back((flags & 1) != 0);
    rp.output_bf16.push_back((flags & 2) != 0);
    rp.output_pad.push_back(flags >> 2);
  }
  if (at != p.ints.size() || p.bodies.size() != static_cast<size_t>(nred + nout) || rank < 1)
    throw Error("fused_rows: malformed params");
  rp.reduction_bodies.assign(p.bodies.begin(), p.bodies.begin() + nred);
  rp.output_bodies.assign(p.bodies.begin() + nred, p.bodies.end());
  return rp;
}

std::string RowProgram::describe() const {
  std::string s = fmt::format("rows {} x {}, reductions read as in{}..", row_shape().str(), n(), inputs);
  for (size_t j = 0; j < reduction_bodies.size(); ++j)
    s += fmt::format(" r{}={}{{{}}}", j, reduce_kind_name(reduction_kinds[j]), reduction_bodies[j].str());
  for (size_t o = 0; o < output_bodies.size(); ++o)
    s += fmt::format(" out{}{}{}{}={{{}}}", o, output_per_row[o] ? "[per row]" : "", stored_bf16(o) ? ":bf16" : "",
                     padding(o) > 0 ? fmt::format("+{} zero columns", padding(o)) : "", output_bodies[o].str());
  return s;
}

bool varies_along_row(const Shape& input, const Shape& domain) {
  const int64_t n = domain[domain.rank() - 1];
  return input.rank() >= 1 && n > 1 && input[input.rank() - 1] == n;
}

namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  RowProgram rp;
  try {
    rp = RowProgram::from_params(p);
  } catch (const Error& e) {
    ctx.fail(e.what());
  }
  if (rp.inputs != static_cast<int>(in.size()))
    ctx.fail(fmt::format("params describe {} inputs, {} were given", rp.inputs, in.size()));
  if (p.dtype != DType::f32 && p.dtype != DType::f64) ctx.fail("result dtype must be f32 or f64");
  for (size_t k = 0; k < in.size(); ++k) {
    if (in[k].dtype != p.dtype && in[k].dtype != DType::i32)
      ctx.fail(fmt::format("input {} is {}{}; inputs must be {} or i32 masks", k, dtype_name(in[k].dtype),
                           in[k].shape.str(), dtype_name(p.dtype)));
    bool ok = true;
    try {
      ok = broadcast_shapes(in[k].shape, rp.domain, "fused_rows") == rp.domain;
    } catch (const Error&) {
      ok = false;
    }
    if (!ok)
      ctx.fail(fmt::format("input {} {} does not broadcast to the domain {}", k, in[k].shape.str(), rp.domain.str()));
  }
  const int nin = rp.inputs;
  for (size_t j = 0; j < rp.reduction_bodies.size(); ++j)
    if (rp.reduction_bodies[j].num_inputs() > nin + static_cast<int>(j))
      ctx.fail(fmt::format("reduction {} body {} reads a reduction not yet computed", j, rp.reduction_bodies[j].str()));
  const int nred = static_cast<int>(rp.reduction_bodies.size());
  std::vector<ValueInfo> out;
  for (size_t o = 0; o < rp.output_bodies.size(); ++o) {
    const ScalarExp& e = rp.output_bodies[o];
    if (e.num_inputs() > nin + nred) ctx.fail(fmt::format("output {} body {} reads past the reductions", o, e.str()));
    if (rp.output_per_row[o])
      for (int k = 0; k < nin; ++k)
        if (e.depends_on(k) && varies_along_row(in[static_cast<size_t>(k)].shape, rp.domain))
          ctx.fail(fmt::format("per-row output {} reads input {} {}, which varies along the row", o, k,
                               in[static_cast<size_t>(k)].shape.str()));
    if (rp.stored_bf16(o) && p.dtype != DType::f32)
      ctx.fail(fmt::format("output {} is stored as bf16, which needs an f32 op", o));
    out.push_back(
        {rp.output_per_row[o] ? rp.row_shape() : rp.padded_domain(o), rp.stored_bf16(o) ? DType::bf16 : p.dtype});
  }
  if (out.empty()) ctx.fail("has no outputs");
  return out;
}

// What an op compiles on its first run of a Program: its program and, for rows that fit a
// block, the instruction list.
template <class T>
struct Compiled {
  RowProgram rp;
  std::unique_ptr<ref::RowChunks<T>> chunks;
};

template <class T>
std::vector<HostTensor> run(const Op& op, const std::vector<const HostTensor*>& in_raw, EvalBuffers& bufs) {
  Compiled<T>& compiled = bufs.compiled<Compiled<T>>([&] {
    Compiled<T> c{RowProgram::from_params(op.params), nullptr};
    if (c.rp.n() <= ref::kBlock) {
      std::vector<Shape> shapes;
      for (const HostTensor* x : in_raw) shapes.push_back(x->shape());
      c.chunks = std::make_unique<ref::RowChunks<T>>(c.rp, shapes, bufs.choice().row_chunk);
    }
    return c;
  });
  const RowProgram& rp = compiled.rp;
  const DType dt = op.params.dtype;  // output 0 may be stored as bf16
  // i32 masks are read as T, as the GPU kernel reads them as f32.
  std::vector<HostTensor> converted(in_raw.size());
  std::vector<const HostTensor*> in(in_raw.begin(), in_raw.end());
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k]->dtype() == DType::i32) {
      converted[k] = bufs.scratch(dt, in[k]->shape());
      for (int64_t i = 0; i < in[k]->numel(); ++i) converted[k].set(i, in[k]->get(i));
      in[k] = &converted[k];
    }
  const int64_t n = rp.n(), rows = rp.rows();
  const Shape row_shape = rp.row_shape();
  std::vector<HostTensor> reds;
  for (size_t j = 0; j < rp.reduction_bodies.size(); ++j) reds.push_back(bufs.scratch(dt, row_shape));
  // bf16 and padded outputs are computed into scratch in T (f32) and stored (rounded, each row
  // followed by its zero columns) when the rows are done.
  std::vector<HostTensor> outs;
  auto via_scratch = [&](size_t o) { return rp.stored_bf16(o) || rp.padding(o) > 0; };
  for (size_t o = 0; o < rp.output_bodies.size(); ++o)
    outs.push_back(via_scratch(o) ? bufs.scratch(dt, rp.output_per_row[o] ? row_shape : rp.domain) : bufs.output(o));
  auto finish = [&] {
    for (size_t o = 0; o < rp.output_bodies.size(); ++o)
      if (via_scratch(o)) {
        HostTensor stored = bufs.output(o);
        const int64_t width = outs[o].shape()[outs[o].shape().rank() - 1], pitch = width + rp.padding(o);
        const T* from = outs[o].data<T>();
        auto store = [&](auto* to, auto convert) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t i = 0; i < width; ++i) to[r * pitch + i] = convert(from[r * width + i]);
            for (int64_t i = width; i < pitch; ++i) to[r * pitch + i] = convert(T(0));
          }
        };
        if (rp.stored_bf16(o))
          store(stored.data<Bf16>(), [](T x) { return f32_to_bf16(static_cast<float>(x)); });
        else
          store(stored.data<T>(), [](T x) { return x; });
        outs[o] = stored;
      }
    return outs;
  };
  if (compiled.chunks) {  // rows that fit a block: all bodies at once, chunk by chunk
    std::vector<T*> red_data, out_data;
    for (HostTensor& r : reds) red_data.push_back(r.data<T>());
    for (HostTensor& o : outs) out_data.push_back(o.data<T>());
    ref::RowChunks<T>& chunked = *compiled.chunks;
    chunked.bind(in, std::move(red_data), std::move(out_data));
    const int64_t chunk_rows = chunked.chunk_rows(), chunks = (rows + chunk_rows - 1) / chunk_rows;
#pragma omp parallel if (rows * n >= 4 * ref::kBlock)
    {
      ref::Registers<T>& regs = ref::thread_registers<T>(1)[0];
      chunked.prepare(regs);
#pragma omp for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) chunked.run(c * chunk_rows, std::min(rows, (c + 1) * chunk_rows), regs);
    }
    return finish();
  }
  // Longer rows: one row at a time, each body visiting it block by block in its own phase.
  std::vector<const HostTensor*> all = in;  // inputs, then the reductions
  for (const HostTensor& r : reds) all.push_back(&r);
  // Runners read only what their body reads (a per-row body may not read row-shaped inputs).
  auto runner = [&](const ScalarExp& body, const Shape& domain) {
    std::vector<const HostTensor*> used(all.size(), nullptr);
    for (size_t k = 0; k < all.size(); ++k)
      if (body.depends_on(static_cast<int>(k))) used[k] = all[k];
    return ref::BodyRunner<T>(body, used, domain);
  };
  std::vector<ref::BodyRunner<T>> red_runners, out_runners;
  for (const ScalarExp& e : rp.reduction_bodies) red_runners.push_back(runner(e, rp.domain));
  for (size_t o = 0; o < rp.output_bodies.size(); ++o)
    out_runners.push_back(runner(rp.output_bodies[o], rp.output_per_row[o] ? row_shape : rp.domain));
#pragma omp parallel if (rows * n >= 4 * ref::kBlock)
  {
    // Registers: the reductions' sets, then the outputs'.
    std::vector<ref::Registers<T>>& regs = ref::thread_registers<T>(red_runners.size() + out_runners.size());
    ref::Registers<T>* red_regs = regs.data();
    ref::Registers<T>* out_regs = regs.data() + red_runners.size();
    for (size_t j = 0; j < red_runners.size(); ++j) red_runners[j].prepare(red_regs[j]);
    for (size_t o = 0; o < out_runners.size(); ++o) out_runners[o].prepare(out_regs[o]);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t e0 = row * n, e1 = e0 + n;
      for (size_t j = 0; j < red_runners.size(); ++j) {
        const ReduceKind kind = rp.reduction_kinds[j];
        T& acc = reds[j].data<T>()[row];
        acc = reduce_identity<T>(kind);
        for (int64_t s = e0; s < e1; s += ref::kBlock) {
          const int64_t len = std::min(ref::kBlock, e1 - s);
          ref::reduce_into<T>(kind, red_runners[j].run(s, len, red_regs[j]), len, acc);
        }
        acc = reduce_finish(kind, acc, n);
      }
      for (size_t o = 0; o < out_runners.size(); ++o) {
        const int64_t b0 = rp.output_per_row[o] ? row : e0, b1 = rp.output_per_row[o] ? row + 1 : e1;
        T* dst = outs[o].data<T>();
        for (int64_t s = b0; s < b1; s += ref::kBlock) {
          const int64_t len = std::min(ref::kBlock, b1 - s);
          out_runners[o].run(s, len, out_regs[o], dst + s);
        }
      }
    }
  }
  return finish();
}

// Output o over input k (of o's shape and dtype, so neither bf16 nor padded: stored as computed).
// Rows that fit a block: as the chunk's instruction list reads and writes (RowChunks). Longer
// rows: row by row, the reductions read the row first, then each output in turn is computed
// block by block, the last instruction of its body writing the block; so no later output may
// read input k, and that last instruction must be coefficient-wise.
bool may_overwrite(const Op& op, const std::vector<ValueInfo>& inputs, size_t o, size_t k) {
  const RowProgram rp = RowProgram::from_params(op.params);
  if (rp.output_per_row[o] || rp.stored_bf16(o) || rp.padding(o) > 0 || inputs[k].shape != rp.domain) return false;
  if (rp.n() <= ref::kBlock) {
    std::vector<Shape> shapes;
    for (const ValueInfo& info : inputs) shapes.push_back(info.shape);
    return ref::RowChunks<double>(rp, shapes).output_may_overwrite_input(o, static_cast<int>(k));
  }
  for (size_t later = o + 1; later < rp.output_bodies.size(); ++later)
    if (rp.output_bodies[later].depends_on(static_cast<int>(k))) return false;
  return rp.output_bodies[o].op() != ExpOp::GeluGrad;
}

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  return ref::dispatch_float(op.params.dtype, "fused_rows", [&](auto t) { return run<decltype(t)>(op, in, bufs); });
}

}  // namespace

void register_fused_rows(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::fused_rows;
  d.shape = shape_rule;
  d.eval = eval;
  d.may_overwrite = may_overwrite;
  d.describe = [](const Params& p) { return RowProgram::from_params(p).describe(); };
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
