// The generic elementwise kernel that the families computing each output element from a few
// input elements lower to (pointwise, where, cast, the element-moving shape ops, fill, iota,
// one_hot, random): a grid-stride loop over an index domain, per operand an affine map from the
// domain's coordinates to an element offset, and a value function.
#include <cmath>
#include <functional>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;

namespace {

bool is_identity(const Access& a, const Shape& domain) { return a.base == 0 && a.strides == domain.strides(); }

}  // namespace

Launch elementwise_launch(const Target& target, const std::string& prefix, const Shape& domain,
                          std::vector<ArgRef> args, const std::vector<Access>& loads, const Access& store,
                          const ValueFn& value, bool value_needs_coords) {
  int64_t n = domain.numel(), max_elems = n;
  for (const auto& a : loads) max_elems = std::max(max_elems, a.elements);
  max_elems = std::max(max_elems, store.elements);
  const Type it = index_type(target, max_elems);
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
      loaded.push_back(
          b.ld(Space::global, t,
               b.address(base[static_cast<size_t>(a.arg)], offset(a), static_cast<int>(dtype_size(a.dtype)))));
    }
    Reg v = value(b, loaded, coords, base);
    if (v.type != kir_type(store.dtype))
      throw Error("GPU lowering (" + prefix + "): value of type " + kir::type_name(v.type) + " stored as " +
                  dtype_name(store.dtype));
    b.st(Space::global, v.type,
         b.address(base[static_cast<size_t>(store.arg)], offset(store), static_cast<int>(dtype_size(store.dtype))), v);
  });
  return finish_launch(b, prefix, elementwise_grid(n), {kElementwiseThreads, 1, 1}, std::move(args));
}

Launch finish_launch(KernelBuilder& b, const std::string& prefix, kir::Dim3 grid, kir::Dim3 block,
                     std::vector<ArgRef> args) {
  kir::Kernel k = b.finish();
  // Blocks of up to 256 threads fit the register file at ptxas's limit of 255 registers a thread;
  // larger ones declare their size so that ptxas keeps within it (.maxntid N, 1, 1: the lowerings'
  // blocks are one-dimensional; a larger block of more dimensions is refused here). A lowering
  // may declare a smaller block too (declare_block_threads): it must be this one.
  if (k.max_threads > 0 && (block.y != 1 || block.z != 1 || static_cast<uint32_t>(k.max_threads) != block.x))
    throw Error(prefix + ": the kernel declares blocks of " + std::to_string(k.max_threads) +
                " threads, launched with " + std::to_string(block.x) + "x" + std::to_string(block.y) + "x" +
                std::to_string(block.z));
  if (block.count() > 256) {
    if (block.y != 1 || block.z != 1)
      throw Error(prefix + ": a block of more than 256 threads must be one-dimensional, not " +
                  std::to_string(block.x) + "x" + std::to_string(block.y) + "x" + std::to_string(block.z));
    k.max_threads = static_cast<int32_t>(block.x);
  }
  k.name = kernel_name(prefix, kernel_hash(k));
  return Launch{std::make_shared<const kir::Kernel>(std::move(k)), grid, block, std::move(args)};
}

Access access_of(int arg, const ValueInfo& info, std::vector<int64_t> strides, int64_t base) {
  return Access{arg, info.dtype, std::move(strides), base, info.shape.numel()};
}

// The store-type register for a value computed in f32.
Reg to_store_type(KernelBuilder& b, DType dt, Reg f) { return dt == DType::f32 ? f : b.cvt(kir_type(dt), f); }

LoweredOp single_launch(Launch l, std::string summary) {
  LoweredOp r;
  r.summary = std::move(summary) + ", " + launch_text(l);
  r.launches.push_back(std::move(l));
  return r;
}

// Copies the input read through `load` into the output written through `store`.
Launch copy_launch(const Target& target, const std::string& prefix, const Shape& domain, ArgRef from, ArgRef to,
                   Access load, Access store) {
  load.arg = 0;
  store.arg = 1;
  auto value = [](KernelBuilder&, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    return in[0];
  };
  return elementwise_launch(target, prefix, domain, {from, to}, {load}, store, value);
}

LoweredOp strided_copy(const Circuit& c, const Op& op, const Target& target, std::vector<int64_t> strides,
                       int64_t base) {
  const std::string& prim = op.prim->name;  // kernel names
  const ValueInfo& x = c.info(op.inputs[0]);
  const ValueInfo& out = c.info(op.outputs[0]);
  return single_launch(copy_launch(target, "kiln_" + prim, out.shape, kIn0, kOut0,
                                   access_of(0, x, std::move(strides), base), access_of(1, out, out.shape.strides())),
                       prim + " as addressing");
}

void record_index_error(KernelBuilder& b, Reg status, Reg index) {
  b.atom_add(Space::global, Type::u32, status, imm_u32(1));
  b.st(Space::global, Type::s32, status, index, 4);
}

}  // namespace kiln::cuda
