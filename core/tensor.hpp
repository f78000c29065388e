// Tensor: the user-facing handle. Operations on Tensors record ops into the engine's pending
// Circuit (nothing runs yet); a host read (item, to_vector, to_host) or an optimizer step
// realizes the pending Circuit, and every live handle then holds its value. Parameters and
// optimizer state are persistent tensors in the engine's arenas, updated only by assign.
// This header stays light: no Eigen, HDF5 or CUDA.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <kiln/circuit/ir/host_tensor.hpp>
#include <kiln/circuit/ir/scalar_exp.hpp>
#include <kiln/circuit/ir/types.hpp>

namespace kiln {

struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- creation ---------------------------------------------------------------------------
  // Host data; it enters a Circuit as an input value (bound, not folded into the structure).
  static Tensor from_host(HostTensor data);
  static Tensor from_vector(const std::vector<double>& values, Shape shape, DType dtype = DType::f32);
  static Tensor from_ints(const std::vector<int32_t>& values, Shape shape);
  // A runtime scalar (learning rate, step count): an input of shape [], never a constant, so a
  // new value each step keeps the step's structure (and its compiled plan) the same.
  static Tensor scalar(double value, DType dtype = DType::f32);
  // A runtime scalar whose value `value()` gives each time the step it is recorded in runs, a
  // traced step's replays included (after the step's Engine::on_each_run hooks): per-step values
  // computed by host code, such as an optimizer's bias-corrected learning rate. It belongs to the
  // step being recorded; its value is not handed back.
  static Tensor per_run_scalar(std::function<double()> value, DType dtype = DType::f32,
                               const std::string& name = "per_run");
  // Recorded constants.
  static Tensor full(Shape shape, double value, DType dtype = DType::f32);
  static Tensor zeros(Shape shape, DType dtype = DType::f32);
  static Tensor ones(Shape shape, DType dtype = DType::f32);
  // Philox random tensors from the engine's seed (see manual_seed); each call draws a fresh
  // stream (the seed and stream offset are runtime inputs of the Circuit).
  static Tensor rand(Shape shape, DType dtype = DType::f32);
  static Tensor randn(Shape shape, DType dtype = DType::f32);
  // A persistent tensor in the engine's parameter arena, initialized from `init`.
  static Tensor parameter(const std::string& name, const HostTensor& init, bool requires_grad = true);
  // A persistent optimizer-state tensor (zeros), e.g. a momentum buffer.
  static Tensor state(const std::string& name, Shape shape, DType dtype);

  // --- properties -------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  DType dtype() const;
  int rank() const { return shape().rank(); }
  int64_t numel() const { return shape().numel(); }
  const std::string& name() const;
  bool is_persistent() const;
  bool requires_grad() const;
  bool is_realized() const;

  // --- autodiff ---------------------------------------------------------------------------
  // Records the gradient of this scalar with respect to every parameter it depends on. Each
  // such parameter's grad() is assigned this step's gradient (or accumulated into, when the
  // engine's accumulate_gradients is on); parameters of the step that get no gradient are zeroed.
  void backward() const;
  // The gradient buffer of a parameter (undefined for tensors that are not parameters).
  Tensor grad() const;

  // --- host access (realizes pending work) ------------------------------------------------
  double item() const;
  std::vector<double> to_vector() const;
  HostTensor to_host() const;

  // --- in place ---------------------------------------------------------------------------
  // Records a write of `value` into this persistent tensor; later reads in the step see it.
  void assign(const Tensor& value) const;

  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// d loss / d wrt[i] for any tensors of the step (parameters, inputs, intermediates), as new
// pending tensors; zeros where loss does not depend on wrt[i]. Parameters' grad() buffers are
// not touched (that is backward()'s job).
std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& wrt);

// Pointwise (numpy broadcasting, one dtype: no implicit promotion).
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
// Any pointwise body over the inputs: map(se::exp(se::in(0)) * se::in(1), {x, y}).
Tensor map(const ScalarExp& body, const std::vector<Tensor>& inputs);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation
Tensor silu(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor pow(const Tensor& x, double p);
Tensor pow(const Tensor& x, const Tensor& p);  // x^p elementwise (broadcasting); x > 0 where p varies
Tensor square(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
// x limited to [lo, hi]; the gradient is 1 inside the closed interval and 0 outside (as torch.clamp).
Tensor clamp(const Tensor& x, double lo, double hi);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// Reductions: along an axis (dropped unless keepdim) or over everything to a scalar.
Tensor sum(const Tensor& x, int axis, bool keepdim = false);
Tensor mean(const Tensor& x, int axis, bool keepdim = false);
Tensor max(const Tensor& x, int axis, bool keepdim = false);
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// a: (..., M, K), b: (..., K, N) -> (..., M, N); flags transpose the last two dims. Under the
// bf16 precision policy (Engine::set_precision) f32 operands are cast to bf16 first and the
// product is f32 (f32 accumulation); bf16 operands always give an f32 product.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

Tensor reshape(const Tensor& x, Shape shape);
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm);
Tensor transpose(const Tensor& x, int a, int b);
Tensor broadcast_to(const Tensor& x, Shape shape);
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t end);
Tensor concat(const std::vector<Tensor>& xs, int axis);
std::vector<Tensor> split(const Tensor& x, int axis, const std::vector<int64_t>& sizes);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor cast(const Tensor& x, DType dtype);
Tensor stop_gradient(const Tensor& x);
// table: (V, D), idx: i32 (...) -> (..., D).
Tensor gather_rows(const Tensor& table, const Tensor& idx);
Tensor one_hot(const Tensor& idx, int64_t depth, DType dtype = DType::f32);
// Positions 0..n-1 as i32 (n).
Tensor arange(int64_t n);

// Composites (circuit/prims/composites.hpp).
Tensor softmax(const Tensor& x);      // over the last axis
Tensor log_softmax(const Tensor& x);  // over the last axis
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);  // mean over positions
Tensor causal_mask_fill(const Tensor& scores);                      // (..., T, T), future = -inf
Tensor dropout(const Tensor& x, double p);                          // Philox mask, scaled 1/(1-p)

}  // namespace kiln
