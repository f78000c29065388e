// pad_bf16_rows (pad_bf16_rows.hpp): casts to bf16 and bf16 buffers that matmuls read, written
// into rows padded to a multiple of 8 elements.
#include <algorithm>
#include <string>

#include <kiln/circuit/ir/target.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/pad_bf16_rows.hpp>
#include <kiln/circuit/prims/builder.hpp>

namespace kiln {

namespace {

constexpr int64_t kRowElements = 8;  // bf16 elements in a 16-byte chunk

int64_t last_dim(const Circuit& c, ValueId v) {
  const Shape& s = c.info(v).shape;
  return s[s.rank() - 1];
}

// True if matmuls are all that read v: directly, or through reshapes that keep its last dim.
bool read_by_matmuls_only(const Circuit& c, ValueId v, const std::vector<std::vector<int32_t>>& readers,
                          const std::vector<bool>& requested) {
  if (requested[static_cast<size_t>(v)] || readers[static_cast<size_t>(v)].empty()) return false;
  for (int32_t i : readers[static_cast<size_t>(v)]) {
    const Op& r = c.ops()[static_cast<size_t>(i)];
    if (r.is(PrimId::matmul)) continue;
    if (!r.is(PrimId::reshape) || c.info(r.outputs[0]).shape.rank() < 2 ||
        last_dim(c, r.outputs[0]) != last_dim(c, v) || !read_by_matmuls_only(c, r.outputs[0], readers, requested))
      return false;
  }
  return true;
}

bool unaligned_bf16_rows(const Circuit& c, ValueId v) {
  const ValueInfo& info = c.info(v);
  return info.dtype == DType::bf16 && info.shape.rank() >= 2 && last_dim(c, v) % kRowElements != 0;
}

bool padded(const Circuit& c, const Op& op, const std::vector<std::vector<int32_t>>& readers,
            const std::vector<bool>& requested) {
  if (!op.is(PrimId::cast)) return false;
  const ValueId out = op.outputs[0];
  return unaligned_bf16_rows(c, out) && read_by_matmuls_only(c, out, readers, requested);
}

// The multiply-adds the matmuls reading v (directly or through reshapes) do per element of v:
// M for x W's W, N for its x, times the batch items that share v.
double matmul_uses(const Circuit& c, ValueId v, const std::vector<std::vector<int32_t>>& readers) {
  double uses = 0;
  for (int32_t i : readers[static_cast<size_t>(v)]) {
    const Op& r = c.ops()[static_cast<size_t>(i)];
    if (r.is(PrimId::reshape)) {
      uses += matmul_uses(c, r.outputs[0], readers);
      continue;
    }
    const Shape& a = c.info(r.inputs[0]).shape;
    const int64_t k = MatmulParams::of(r).transpose_a ? a[a.rank() - 2] : a[a.rank() - 1];
    uses += static_cast<double>(c.info(r.outputs[0]).shape.numel()) * static_cast<double>(k) /
            static_cast<double>(std::max<int64_t>(1, c.info(v).shape.numel()));
  }
  return uses;
}

// An input or persistent buffer in bf16 with unaligned rows that only matmuls read (not a buffer
// an assign writes: the assign reads it), where they do enough with it. Its padded copy costs a
// pass over it, 4 bytes an element, and lives from the first reader to the last; the products
// do 2 FLOPs an element a use. From 64 uses (x W's W over 64 rows of x) the copy pays for itself
// many times over (widened FFMA tiles against tensor cores: break-even near 40); below that a
// product (a decode step's one row against the LM head) reads the operand about once and stays
// on the kernel that reads it in place.
constexpr double kMinPaddedUses = 64;

bool padded_external(const Circuit& c, ValueId v, const std::vector<std::vector<int32_t>>& readers,
                     const std::vector<bool>& requested) {
  return c.value(v).producer < 0 && unaligned_bf16_rows(c, v) && read_by_matmuls_only(c, v, readers, requested) &&
         matmul_uses(c, v, readers) >= kMinPaddedUses;
}

}  // namespace

Circuit pad_bf16_rows(const Circuit& c, std::vector<ValueId>& outputs, const Target& target) {
  if (!target.matmul.bf16_mma) return c;
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<bool> requested(c.num_values(), false);
  for (ValueId o : outputs) requested[static_cast<size_t>(o)] = true;
  std::vector<bool> pad(c.ops().size()), pad_external(c.num_values(), false);
  for (size_t i = 0; i < pad.size(); ++i) pad[i] = padded(c, c.ops()[i], readers, requested);
  for (ValueId x : c.externals()) pad_external[static_cast<size_t>(x)] = padded_external(c, x, readers, requested);
  if (std::find(pad.begin(), pad.end(), true) == pad.end() &&
      std::find(pad_external.begin(), pad_external.end(), true) == pad_external.end())
    return c;

  Rebuild r(c);
  // For a value of c with padded rows: its padded form in the result ((..., n) widened to (..., n + pad)).
  std::vector<ValueId> wide(c.num_values(), kNoValue);
  // v (..., n) -> (..., 0:n) of its padded rows: a slice that fuse_matmul folds into a view.
  auto narrow = [&](Builder& b, ValueId v, ValueId rows) {
    const int last = c.info(v).shape.rank() - 1;
    r.map(v, b.slice(rows, last, 0, last_dim(c, v)));
    wide[static_cast<size_t>(v)] = rows;
  };
  // v (..., n), as a value of the result, concatenated with zeros to (..., round_up(n, 8)).
  auto pad_rows = [&](Builder& b, ValueId v, ValueId in_result) {
    std::vector<int64_t> pad_dims = c.info(v).shape.dims();
    const int64_t n = pad_dims.back();
    pad_dims.back() = (n + kRowElements - 1) / kRowElements * kRowElements - n;
    const ValueId zeros = b.cast(b.fill(Shape(pad_dims), DType::f32, 0.0), DType::bf16);
    return b.concat({in_result, zeros}, static_cast<int>(pad_dims.size()) - 1);
  };
  for (size_t i = 0; i < pad.size(); ++i) {
    const Op& op = c.ops()[i];
    r.out().set_recording_phase(op.phase);
    Builder b(r.out(), op.scope);
    // An external's padded copy goes just before its first reader (an op of the same phase).
    for (ValueId x : op.inputs)
      if (pad_external[static_cast<size_t>(x)] && wide[static_cast<size_t>(x)] == kNoValue)
        narrow(b, x, pad_rows(b, x, r.at(x)));
    const bool reshape_padded = op.is(PrimId::reshape) && wide[static_cast<size_t>(op.inputs[0])] != kNoValue;
    if (!pad[i] && !reshape_padded) {
      r.copy(op);
      continue;
    }
    const ValueId result = op.outputs[0];
    if (pad[i]) {  // the cast, then concat with zeros (..., pad)
      const ValueId cast = b.cast(r.at(op.inputs[0]), DType::bf16);
      r.out().set_absorbed(r.out().ops().size() - 1, op.absorbed);
      narrow(b, result, pad_rows(b, result, cast));
    } else {  // a reshape keeping the last dim (read_by_matmuls_only): the same reshape of the padded rows
      const ValueId rows = wide[static_cast<size_t>(op.inputs[0])];
      std::vector<int64_t> dims = c.info(result).shape.dims();
      dims.back() = last_dim(r.out(), rows);
      narrow(b, result, b.reshape(rows, Shape(dims)));
    }
  }
  // The slice of a cast that only reshapes read is left unread.
  Circuit padded_circuit = r.finish(outputs);
  return dce(padded_circuit, outputs);
}

}  // namespace kiln
