// User Prims: operations a program built against kiln adds at run time, with the pieces kiln's own
// Prims have (a shape rule, a CPU reference, a VJP rule, optionally a GPU lowering), and custom
// VJPs: a function of Tensors whose gradient is the user's (jax.custom_vjp,
// torch.autograd.Function). Both record one op into the step's Circuit; the reverse sweep calls
// their VJP rule like any Prim's, and kiln::gradcheck checks them unchanged. docs/USING.md has
// the contract of each piece and a worked example; examples/external uses both.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/core/tensor.hpp>
#include <kiln/cuda/lower/lower.hpp>

namespace kiln {

// Where a registration was made, for errors naming it: the caller's file and line, taken as
// default arguments (std::source_location, which not every compiler kiln supports provides).
struct SourceLocation {
  const char* file = "";
  int line = 0;
  static SourceLocation current(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return {file, line};
  }
};

// What a CPU reference is given. `outputs` hold the shapes and dtypes the shape rule gave; their
// contents are undefined, and the reference writes every element. Inputs of a float dtype are one
// of the spec's `dtypes`.
struct PrimCall {
  const std::vector<const HostTensor*>& inputs;
  std::vector<HostTensor>& outputs;
  const Params& params;
};

// What a VJP rule is given, as Tensors of the step being differentiated. It returns one Tensor
// per input: the gradient of the loss with respect to that input (its shape, or one that
// broadcasts to it; its dtype), or an undefined Tensor where none flows.
struct VjpArgs {
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<Tensor> out_grads;  // d loss / d each output; undefined where none reaches it
  const Params& params;
};

// A VJP rule is traced: it runs once per recording of the op, with tensors that stand for the
// op's values, and its Tensor operations become ops of the step. So it may use any Tensor
// function (other Prims, user Prims included) on its arguments and constants it makes
// (Tensor::full), but no host read (item, to_vector), parameter, random draw or host tensor.
using UserVjpRule = std::function<std::vector<Tensor>(const VjpArgs&)>;

struct UserPrimSpec {
  std::string name;  // unique among all Prims; lower case letters, digits and '_'
  // (ctx, input infos, params) -> output infos; fail through ctx.fail, which names the Prim and the
  // layer. Runs when the op is recorded.
  ShapeRule shape;
  std::function<void(const PrimCall&)> reference;
  UserVjpRule vjp;  // required; a Prim no gradient flows through returns undefined Tensors
  // The float dtypes the reference runs. Must hold f64: the gradient check runs in f64.
  std::vector<DType> dtypes{DType::f32, DType::f64};
  std::vector<int> nondiff_inputs;  // inputs no gradient flows to (indices, masks)
  // The GPU lowering, optional: the op as a pointwise body over in0, in1, ... (its inputs, with
  // broadcasting; one output), given its params. Plans for the GPU substitute it, and the fusion
  // passes fuse it with kiln's own pointwise ops. Without one the Prim runs on the CPU only, and
  // a GPU plan that meets it is an error naming it.
  PointwiseBodyFn pointwise_body;
  // Or the GPU lowering as row reductions and bodies (reductions along the last axis, then
  // outputs: circuit/prims/fused_rows.hpp), given the input infos and params: plans for the GPU
  // substitute a fused_rows op, kiln's kernel for softmax and norms.
  std::function<RowProgram(const std::vector<ValueInfo>& inputs, const Params& params)> row_body;
  // Or the GPU lowering as kernels of its own, written with kiln's kernel IR (kir::KernelBuilder;
  // the helpers of cuda/lower/util.hpp): given a plan's op, its launches (cuda/lower/lower.hpp).
  // Such an op is not fused. Give at most one of pointwise_body, row_body and gpu_kernel.
  cuda::UserLowering gpu_kernel;
  DescribeFn describe;  // the params as text for dumps ("cap=30"), optional
};

// A registered user Prim; cheap to copy.
class UserPrim {
 public:
  explicit UserPrim(const PrimDef& def) : def_(&def) {}
  const PrimDef& def() const { return *def_; }
  const std::string& name() const { return def_->name; }
  // Records the op on `inputs` in the current step (the shape rule runs now).
  std::vector<Tensor> apply(const std::vector<Tensor>& inputs, Params params = {}) const;
  // The same for a Prim of one output.
  Tensor operator()(const std::vector<Tensor>& inputs, Params params = {}) const;

 private:
  const PrimDef* def_;
};

// Registers a Prim for the rest of the process. Throws kiln::Error for a name that is taken (naming
// both registrations: `where` is this call's file and line), a malformed name, a missing piece, two
// GPU lowerings, or a dtype list without f64.
UserPrim register_prim(UserPrimSpec spec, SourceLocation where = SourceLocation::current());

// A custom VJP's backward is given the forward's inputs, its output and the output's gradient,
// and returns one gradient per input (undefined: none), traced as a Prim's VJP rule is.
struct CustomVjpArgs {
  std::vector<Tensor> inputs;
  Tensor output;
  Tensor out_grad;
};

// A function of Tensors whose gradient is `backward`'s, not that of the ops `forward` records:
//   CustomVjp round_ste("round_ste", [](auto& x) { return map(se::round_bf16(se::in(0)), x); },
//                       [](const CustomVjpArgs& a) { return std::vector{a.out_grad}; });
//   Tensor y = round_ste({x});
// forward's ops run as recorded (fused as usual); registering makes a Prim of `name` that carries
// the backward to the reverse sweep and costs nothing at run time (every plan forwards its value).
class CustomVjp {
 public:
  using Forward = std::function<Tensor(const std::vector<Tensor>&)>;
  using Backward = std::function<std::vector<Tensor>(const CustomVjpArgs&)>;
  CustomVjp(std::string name, Forward forward, Backward backward, SourceLocation where = SourceLocation::current());
  Tensor operator()(const std::vector<Tensor>& inputs) const;
  const std::string& name() const { return prim_.name(); }

 private:
  Forward forward_;
  UserPrim prim_;
};

}  // namespace kiln
