// Tensor operations: each records one or a few ops through the current engine's Builder.
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/tensor.hpp>

namespace kiln {

namespace {
Engine& eng() { return Engine::current(); }

Tensor record_pointwise(const ScalarExp& body, const std::vector<Tensor>& inputs) {
  std::vector<ValueId> ids;
  for (const Tensor& t : inputs) ids.push_back(eng().value_of(t));
  return eng().wrap(eng().builder().pointwise(body, ids));
}

Tensor unary(const Tensor& x, const ScalarExp& body) { return record_pointwise(body, {x}); }

// Drops the kept axis of a reduction unless keepdim.
Tensor finish_reduce(ValueId r, const Tensor& x, int axis, bool keepdim) {
  if (keepdim) return eng().wrap(r);
  std::vector<int64_t> dims = x.shape().dims();
  int a = axis < 0 ? axis + x.rank() : axis;
  dims.erase(dims.begin() + a);
  return eng().wrap(eng().builder().reshape(r, Shape(dims)));
}

Tensor reduce(ReduceKind kind, const Tensor& x, int axis, bool keepdim) {
  return finish_reduce(eng().builder().reduce(kind, eng().value_of(x), axis), x, axis, keepdim);
}
}  // namespace

Tensor Tensor::from_host(HostTensor data) {
  auto impl = std::make_shared<TensorImpl>();
  impl->engine = &eng();
  impl->info = {data.shape(), data.dtype()};
  impl->data = std::move(data);
  return Tensor(impl);
}

Tensor Tensor::from_vector(const std::vector<double>& values, Shape shape, DType dtype) {
  if (static_cast<int64_t>(values.size()) != shape.numel())
    throw Error("Tensor::from_vector: " + std::to_string(values.size()) + " values for shape " + shape.str() + " (" +
                std::to_string(shape.numel()) + " elements)");
  HostTensor t = HostTensor::zeros(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return from_host(std::move(t));
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, Shape shape) {
  std::vector<double> v(values.begin(), values.end());
  return from_vector(v, std::move(shape), DType::i32);
}

Tensor Tensor::scalar(double value, DType dtype) { return from_vector({value}, Shape{}, dtype); }

Tensor Tensor::per_run_scalar(std::function<double()> value, DType dtype, const std::string& name) {
  ValueId id = eng().add_computed_input({Shape{}, dtype}, name,
                                        [value = std::move(value)](HostTensor& t) { t.set(0, value()); });
  return eng().wrap(id, /*deliver=*/false);
}

Tensor Tensor::full(Shape shape, double value, DType dtype) {
  return eng().wrap(eng().builder().fill(shape, dtype, value));
}
Tensor Tensor::zeros(Shape shape, DType dtype) { return full(std::move(shape), 0.0, dtype); }
Tensor Tensor::ones(Shape shape, DType dtype) { return full(std::move(shape), 1.0, dtype); }

Tensor Tensor::rand(Shape shape, DType dtype) {
  auto [key, offset] = eng().next_random_stream();
  return eng().wrap(eng().builder().random(RandomKind::Uniform, shape, dtype, key, offset));
}

Tensor Tensor::randn(Shape shape, DType dtype) {
  auto [key, offset] = eng().next_random_stream();
  return eng().wrap(eng().builder().random(RandomKind::Normal, shape, dtype, key, offset));
}

Tensor Tensor::parameter(const std::string& name, const HostTensor& init, bool requires_grad) {
  return eng().new_persistent(ArenaKind::Param, name, init, requires_grad);
}

Tensor Tensor::state(const std::string& name, Shape shape, DType dtype) {
  return eng().new_persistent(ArenaKind::State, name, HostTensor::zeros(dtype, std::move(shape)), false);
}

const Shape& Tensor::shape() const {
  if (!impl_) throw Error("use of an undefined Tensor");
  return impl_->info.shape;
}
DType Tensor::dtype() const {
  if (!impl_) throw Error("use of an undefined Tensor");
  return impl_->info.dtype;
}
const std::string& Tensor::name() const {
  if (!impl_) throw Error("use of an undefined Tensor");
  return impl_->name;
}
bool Tensor::is_persistent() const { return impl_ && impl_->slot >= 0; }
bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }
bool Tensor::is_realized() const { return impl_ && impl_->slot < 0 && impl_->pending == kNoValue; }

void Tensor::backward() const { eng().backward(*this); }
Tensor Tensor::grad() const { return impl_ && impl_->grad ? Tensor(impl_->grad) : Tensor(); }

HostTensor Tensor::to_host() const {
  if (!impl_) throw Error("use of an undefined Tensor");
  if (is_persistent()) {
    eng().realize();  // pending updates of this buffer land first
    return eng().read_persistent(*impl_);
  }
  if (impl_->pending != kNoValue) eng().realize();
  if (impl_->pending != kNoValue) throw Error("a Tensor from a step that failed or was set aside has no value");
  return impl_->data;
}

double Tensor::item() const {
  HostTensor h = to_host();
  if (h.numel() != 1) throw Error("item() needs a tensor of one element, received shape " + h.shape().str());
  return h.get(0);
}

std::vector<double> Tensor::to_vector() const {
  HostTensor h = to_host();
  std::vector<double> v(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) v[static_cast<size_t>(i)] = h.get(i);
  return v;
}

void Tensor::assign(const Tensor& value) const { eng().assign(*this, value); }

std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& wrt) { return eng().grad(loss, wrt); }

Tensor operator+(const Tensor& a, const Tensor& b) { return record_pointwise(se::in(0) + se::in(1), {a, b}); }
Tensor operator-(const Tensor& a, const Tensor& b) { return record_pointwise(se::in(0) - se::in(1), {a, b}); }
Tensor operator*(const Tensor& a, const Tensor& b) { return record_pointwise(se::in(0) * se::in(1), {a, b}); }
Tensor operator/(const Tensor& a, const Tensor& b) { return record_pointwise(se::in(0) / se::in(1), {a, b}); }
Tensor operator-(const Tensor& a) { return unary(a, -se::in(0)); }
Tensor operator+(const Tensor& a, double b) { return unary(a, se::in(0) + se::c(b)); }
Tensor operator-(const Tensor& a, double b) { return unary(a, se::in(0) - se::c(b)); }
Tensor operator*(const Tensor& a, double b) { return unary(a, se::in(0) * se::c(b)); }
Tensor operator/(const Tensor& a, double b) { return unary(a, se::in(0) / se::c(b)); }
Tensor operator+(double a, const Tensor& b) { return unary(b, se::c(a) + se::in(0)); }
Tensor operator-(double a, const Tensor& b) { return unary(b, se::c(a) - se::in(0)); }
Tensor operator*(double a, const Tensor& b) { return unary(b, se::c(a) * se::in(0)); }
Tensor operator/(double a, const Tensor& b) { return unary(b, se::c(a) / se::in(0)); }
Tensor map(const ScalarExp& body, const std::vector<Tensor>& inputs) { return record_pointwise(body, inputs); }
Tensor exp(const Tensor& x) { return unary(x, se::exp(se::in(0))); }
Tensor log(const Tensor& x) { return unary(x, se::log(se::in(0))); }
Tensor sqrt(const Tensor& x) { return unary(x, se::sqrt(se::in(0))); }
Tensor rsqrt(const Tensor& x) { return unary(x, se::rsqrt(se::in(0))); }
Tensor tanh(const Tensor& x) { return unary(x, se::tanh(se::in(0))); }
Tensor sigmoid(const Tensor& x) { return unary(x, se::sigmoid(se::in(0))); }
Tensor gelu(const Tensor& x) { return unary(x, se::gelu(se::in(0))); }
Tensor silu(const Tensor& x) { return unary(x, se::silu(se::in(0))); }
// select, not max: the gradient at 0 is 0, as torch.relu.
Tensor relu(const Tensor& x) { return unary(x, se::select(se::gt(se::in(0), se::c(0.0)), se::in(0), se::c(0.0))); }
Tensor abs(const Tensor& x) { return unary(x, se::abs(se::in(0))); }
Tensor pow(const Tensor& x, double p) { return unary(x, se::pow(se::in(0), se::c(p))); }
Tensor pow(const Tensor& x, const Tensor& p) { return record_pointwise(se::pow(se::in(0), se::in(1)), {x, p}); }
Tensor square(const Tensor& x) { return unary(x, se::in(0) * se::in(0)); }
Tensor sin(const Tensor& x) { return unary(x, se::sin(se::in(0))); }
Tensor cos(const Tensor& x) { return unary(x, se::cos(se::in(0))); }
Tensor clamp(const Tensor& x, double lo, double hi) {
  if (!(lo <= hi))
    throw Error("clamp: expected lo <= hi, received lo " + std::to_string(lo) + ", hi " + std::to_string(hi));
  const ScalarExp v = se::in(0);
  return unary(x, se::select(se::lt(v, se::c(lo)), se::c(lo), se::select(se::gt(v, se::c(hi)), se::c(hi), v)));
}
Tensor maximum(const Tensor& a, const Tensor& b) { return record_pointwise(se::max(se::in(0), se::in(1)), {a, b}); }
Tensor minimum(const Tensor& a, const Tensor& b) { return record_pointwise(se::min(se::in(0), se::in(1)), {a, b}); }

Tensor sum(const Tensor& x, int axis, bool keepdim) { return reduce(ReduceKind::Sum, x, axis, keepdim); }
Tensor mean(const Tensor& x, int axis, bool keepdim) { return reduce(ReduceKind::Mean, x, axis, keepdim); }
Tensor max(const Tensor& x, int axis, bool keepdim) { return reduce(ReduceKind::Max, x, axis, keepdim); }
Tensor sum(const Tensor& x) { return eng().wrap(eng().builder().reduce_all(ReduceKind::Sum, eng().value_of(x))); }
Tensor mean(const Tensor& x) { return eng().wrap(eng().builder().reduce_all(ReduceKind::Mean, eng().value_of(x))); }

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Builder bld = eng().builder();
  ValueId va = eng().value_of(a), vb = eng().value_of(b);
  if (eng().precision() == Precision::bf16 && bld.info(va).dtype == DType::f32 && bld.info(vb).dtype == DType::f32) {
    va = bld.cast(va, DType::bf16);
    vb = bld.cast(vb, DType::bf16);
  }
  return eng().wrap(bld.matmul(va, vb, ta, tb));
}

Tensor reshape(const Tensor& x, Shape shape) { return eng().wrap(eng().builder().reshape(eng().value_of(x), shape)); }
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm) {
  return eng().wrap(eng().builder().permute(eng().value_of(x), perm));
}
Tensor transpose(const Tensor& x, int a, int b) {
  return eng().wrap(eng().builder().transpose(eng().value_of(x), a, b));
}
Tensor broadcast_to(const Tensor& x, Shape shape) {
  return eng().wrap(eng().builder().broadcast(eng().value_of(x), shape));
}
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t end) {
  return eng().wrap(eng().builder().slice(eng().value_of(x), axis, start, end));
}
Tensor concat(const std::vector<Tensor>& xs, int axis) {
  std::vector<ValueId> ids;
  for (const Tensor& x : xs) ids.push_back(eng().value_of(x));
  return eng().wrap(eng().builder().concat(ids, axis));
}
std::vector<Tensor> split(const Tensor& x, int axis, const std::vector<int64_t>& sizes) {
  std::vector<Tensor> out;
  for (ValueId id : eng().builder().split(eng().value_of(x), axis, sizes)) out.push_back(eng().wrap(id));
  return out;
}
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  ValueId c = eng().value_of(cond), va = eng().value_of(a), vb = eng().value_of(b);
  return eng().wrap(eng().builder().where(c, va, vb));
}
Tensor cast(const Tensor& x, DType dtype) { return eng().wrap(eng().builder().cast(eng().value_of(x), dtype)); }
Tensor stop_gradient(const Tensor& x) { return eng().wrap(eng().builder().stop_gradient(eng().value_of(x))); }
Tensor gather_rows(const Tensor& table, const Tensor& idx) {
  ValueId t = eng().value_of(table), i = eng().value_of(idx);
  return eng().wrap(eng().builder().gather_rows(t, i));
}
Tensor one_hot(const Tensor& idx, int64_t depth, DType dtype) {
  return eng().wrap(eng().builder().one_hot(eng().value_of(idx), depth, dtype));
}
Tensor arange(int64_t n) { return eng().wrap(eng().builder().iota(Shape{n}, DType::i32, ix::coord(0))); }

Tensor softmax(const Tensor& x) {
  Builder b = eng().builder();
  return eng().wrap(composite::softmax(b, eng().value_of(x)));
}
Tensor log_softmax(const Tensor& x) {
  Builder b = eng().builder();
  return eng().wrap(composite::log_softmax(b, eng().value_of(x)));
}
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  ValueId vx = eng().value_of(x), vw = eng().value_of(weight), vb = eng().value_of(bias);
  Builder b = eng().builder();
  return eng().wrap(composite::layernorm(b, vx, vw, vb, eps));
}
Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  ValueId l = eng().value_of(logits), t = eng().value_of(targets);
  Builder b = eng().builder();
  return eng().wrap(composite::cross_entropy(b, l, t));
}
Tensor causal_mask_fill(const Tensor& scores) {
  Builder b = eng().builder();
  return eng().wrap(composite::apply_causal_mask(b, eng().value_of(scores)));
}
Tensor dropout(const Tensor& x, double p) {
  ValueId vx = eng().value_of(x);
  auto [key, offset] = eng().next_random_stream();
  Builder b = eng().builder();
  return eng().wrap(composite::dropout(b, vx, p, key, offset));
}

}  // namespace kiln
