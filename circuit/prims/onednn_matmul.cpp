// OneDnnMatmul (onednn_matmul.hpp): a matmul on oneDNN's primitive, made once, run many times.
#if KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include <string>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/onednn_matmul.hpp>

namespace kiln {

namespace {

std::string problem(DType operands, const Shape& a, bool ta, const Shape& b, bool tb) {
  return std::string(dtype_name(operands)) + " a " + a.str() + (ta ? " (transposed)" : "") + " . b " + b.str() +
         (tb ? " (transposed)" : "");
}

}  // namespace

#if KILN_HAVE_DNNL

namespace {

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// The descriptor of an operand stored row-major as `stored` (its rank padded to `rank` with
// leading 1s), read as op(x): its last two dims swapped by strides where `transposed`.
dnnl::memory::desc operand_desc(const Shape& stored, bool transposed, size_t rank, dnnl::memory::data_type dt) {
  const size_t pad = rank - static_cast<size_t>(stored.rank());
  dnnl::memory::dims dims(rank, 1), strides(rank, 0);
  int64_t stride = 1;
  for (size_t i = rank; i-- > 0;) {
    const int64_t d = i < pad ? 1 : stored[static_cast<int>(i - pad)];
    dims[i] = d;
    strides[i] = stride;
    stride *= d;
  }
  if (transposed) {
    std::swap(dims[rank - 1], dims[rank - 2]);
    std::swap(strides[rank - 1], strides[rank - 2]);
  }
  return dnnl::memory::desc(dims, dt, strides);
}

dnnl::memory::data_type onednn_type(DType dt) {
  if (dt == DType::bf16) return dnnl::memory::data_type::bf16;
  if (dt == DType::f32) return dnnl::memory::data_type::f32;
  throw Error(std::string("op 'matmul': oneDNN's matmul takes f32 or bf16 operands, received ") + dtype_name(dt));
}

}  // namespace

struct OneDnnMatmul::Impl {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  mutable dnnl::memory a, b, c, scratchpad;
  std::vector<uint8_t> scratch;  // the primitive's own workspace, kept (scratchpad mode user)
  mutable dnnl::stream stream;
};

OneDnnMatmul::OneDnnMatmul(DType operands, const Shape& a, bool ta, const Shape& b, bool tb, const Shape& c) {
  const size_t rank = static_cast<size_t>(c.rank());
  const dnnl::memory::data_type dt = onednn_type(operands);
  auto impl = std::make_unique<Impl>();
  try {  // every oneDNN error becomes kiln's, naming the op and the product
    const dnnl::memory::desc ad = operand_desc(a, ta, rank, dt), bd = operand_desc(b, tb, rank, dt),
                             cd = operand_desc(c, false, rank, dnnl::memory::data_type::f32);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
    impl->pd = dnnl::matmul::primitive_desc(cpu_engine(), ad, bd, cd, attr);
#else
    impl->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), attr, cpu_engine());
#endif
    impl->primitive = dnnl::matmul(impl->pd);
    impl->a = dnnl::memory(ad, cpu_engine(), DNNL_MEMORY_NONE);
    impl->b = dnnl::memory(bd, cpu_engine(), DNNL_MEMORY_NONE);
    impl->c = dnnl::memory(cd, cpu_engine(), DNNL_MEMORY_NONE);
    impl->scratch.resize(impl->pd.scratchpad_desc().get_size());
    impl->scratchpad = dnnl::memory(impl->pd.scratchpad_desc(), cpu_engine(), impl->scratch.data());
    impl->stream = dnnl::stream(cpu_engine());
  } catch (const dnnl::error& e) {
    throw Error(
        "op 'matmul': oneDNN has no matmul for " + problem(operands, a, ta, b, tb) + " on this CPU (" + e.what() + ")" +
        (operands == DType::bf16 ? ": its bf16 kernels need AVX-512 (--cpu-bf16 rounded-f32 runs without)" : ""));
  }
  impl_ = std::move(impl);
}

void OneDnnMatmul::run(const void* a, const void* b, float* c) const {
  impl_->a.set_data_handle(const_cast<void*>(a));
  impl_->b.set_data_handle(const_cast<void*>(b));
  impl_->c.set_data_handle(c);
  impl_->primitive.execute(impl_->stream, {{DNNL_ARG_SRC, impl_->a},
                                           {DNNL_ARG_WEIGHTS, impl_->b},
                                           {DNNL_ARG_DST, impl_->c},
                                           {DNNL_ARG_SCRATCHPAD, impl_->scratchpad}});
  impl_->stream.wait();
}

std::string OneDnnMatmul::kernel() const { return impl_->pd.impl_info_str(); }

bool OneDnnMatmul::available(DType operands) {
  try {
    OneDnnMatmul probe(operands, Shape{2, 2}, false, Shape{2, 2}, false, Shape{2, 2});
    return true;
  } catch (const Error&) {
    return false;
  }
}

#else  // built without oneDNN

struct OneDnnMatmul::Impl {};

OneDnnMatmul::OneDnnMatmul(DType operands, const Shape& a, bool ta, const Shape& b, bool tb, const Shape&) {
  throw Error("op 'matmul': kiln was built without oneDNN, which the product " + problem(operands, a, ta, b, tb) +
              " was to run on (--cpu-bf16 rounded-f32 runs without)");
}
void OneDnnMatmul::run(const void*, const void*, float*) const {}
std::string OneDnnMatmul::kernel() const { return "none"; }
bool OneDnnMatmul::available(DType) { return false; }

#endif

OneDnnMatmul::OneDnnMatmul(OneDnnMatmul&&) noexcept = default;
OneDnnMatmul& OneDnnMatmul::operator=(OneDnnMatmul&&) noexcept = default;
OneDnnMatmul::~OneDnnMatmul() = default;

}  // namespace kiln
