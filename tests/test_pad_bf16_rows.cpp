// pad_bf16_rows (circuit/passes/pad_bf16_rows.hpp): bf16 casts, inputs and buffers whose rows are
// not whole 16-byte chunks, read only by matmuls, are written into padded rows so that the
// products run on the tensor-core kernels (mma.sync and wgmma, in the SIMT simulator against the
// Eigen executor), and are left as they are where something else reads them.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/pad_bf16_rows.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using testing::BuildFn;
using testing::f32;

// pad_bf16_rows on h's circuit: no concat while bf16 operands are widened into f32 tiles; with
// the mma kernel on, one concat, no slice left after the GPU pipeline (folded into the views),
// and the products on mma.sync and on wgmma against the Eigen executor within `tolerance`.
void expect_padded_once_onto_tensor_cores(const testing::Harness& h, double tolerance) {
  const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  const Target on = cuda::device_target(testing::fake_runtime());
  {
    std::vector<ValueId> outs{h.output};
    const Target widened = testing::with_matmul(on, "bf16-mma=off");
    EXPECT_EQ(testing::count_prim(pad_bf16_rows(h.circuit, outs, widened), PrimId::concat), 0u);
  }
  std::vector<ValueId> outs{h.output};
  const Circuit padded = pad_bf16_rows(h.circuit, outs, on);
  EXPECT_EQ(testing::count_prim(padded, PrimId::concat), 1u) << padded.dump("padded");
  std::vector<ValueId> gpu_outs{h.output};
  const Circuit optimized = optimize(h.circuit, gpu_outs, cuda_target(90, /*fake=*/true));
  EXPECT_EQ(testing::count_prim(optimized, PrimId::slice), 0u) << optimized.dump("optimized");
  for (const char* wgmma : {"off", "on"}) {
    SCOPED_TRACE(std::string("wgmma=") + wgmma);
    cuda::DeviceProgram dp(optimized, gpu_outs, testing::fake_runtime(),
                           testing::with_matmul(on, std::string("wgmma=") + wgmma));
    EXPECT_NE(dp.dump().find(wgmma == std::string("on") ? "wgmma" : "mma.sync bf16"), std::string::npos) << dp.dump();
    const HostTensor got = dp.run(h.bindings)[0];
    ASSERT_EQ(got.dtype(), want.dtype());
    EXPECT_LT(testing::relative_error(got, want), tolerance);
  }
}

// pad_bf16_rows: a bf16 cast of rows of 61 elements (122 bytes, no 16-byte chunks) that matmuls
// read is written into rows of 64 and read through a slice, so the products run on the mma
// kernel: x w (a with k contiguous), x^T dy (a with rows contiguous), and x^T dy with x cast as
// (2, 12, 61) and reshaped to (24, 61) first (as a batch's logits are); on mma.sync and wgmma.
// With bf16-mma=off the pass changes nothing.
TEST(Lowering, Bf16CastsThatMatmulsReadArePaddedToWholeChunks) {
  for (int variant : {0, 1, 2}) {
    SCOPED_TRACE(variant);
    const Shape x_shape = variant == 2 ? Shape{2, 12, 61} : Shape{24, 61};
    testing::Harness h({f32(x_shape), f32(variant == 0 ? Shape{61, 32} : Shape{24, 32})},
                       [variant](Builder& bld, const std::vector<ValueId>& x) {
                         ValueId a = bld.cast(x[0], DType::bf16);
                         if (variant == 2) a = bld.reshape(a, Shape{24, 61});
                         return bld.matmul(a, bld.cast(x[1], DType::bf16), variant != 0);
                       });
    expect_padded_once_onto_tensor_cores(h, 1e-5);
  }
}

// pad_bf16_rows leaves a cast as it is where padding would change what else reads it: a
// reader other than a matmul (here a cast back to f32), a reshape that changes the last dim,
// or the cast being a requested output.
TEST(Lowering, Bf16CastsReadOtherwiseAreNotPadded) {
  auto concats = [](const BuildFn& build, bool request_cast) {
    Circuit c;
    Builder bld(c);
    std::vector<ValueId> x{c.add_external({Shape{24, 61}, DType::f32}, ValueRole::Input, "x"),
                           c.add_external({Shape{61, 32}, DType::f32}, ValueRole::Input, "w")};
    std::vector<ValueId> outs{build(bld, x)};
    if (request_cast) outs.push_back(c.ops()[0].outputs[0]);  // the first op: x's cast
    return testing::count_prim(pad_bf16_rows(c, outs, cpu_target()), PrimId::concat);
  };
  EXPECT_EQ(concats(
                [](Builder& bld, const std::vector<ValueId>& x) {
                  ValueId a = bld.cast(x[0], DType::bf16);
                  return bld.add(bld.matmul(a, bld.cast(x[1], DType::bf16)),
                                 bld.reduce(ReduceKind::Sum, bld.cast(a, DType::f32), 1));
                },
                false),
            0u);
  EXPECT_EQ(concats(
                [](Builder& bld, const std::vector<ValueId>& x) {
                  ValueId a = bld.reshape(bld.cast(x[0], DType::bf16), Shape{61, 24});
                  return bld.matmul(a, bld.cast(bld.slice(x[1], 1, 0, 24), DType::bf16), true);
                },
                false),
            0u);
  const BuildFn plain = [](Builder& bld, const std::vector<ValueId>& x) {
    const ValueId a = bld.cast(x[0], DType::bf16);  // op 0, whatever order a call's arguments run in
    return bld.matmul(a, bld.cast(x[1], DType::bf16));
  };
  EXPECT_EQ(concats(plain, true), 0u);
  EXPECT_EQ(concats(plain, false), 1u);  // the same circuit, the cast not requested
}

// pad_bf16_rows: an input stored in bf16 with rows of 61 or 50 elements (no 16-byte chunks) that
// only matmuls read, 64 times an element or more, is copied once into rows of 64 or 56 just
// before its first reader, so the products run on the mma kernel (mma.sync and wgmma): a with k
// contiguous (x w, 64 columns of w); b stored [k][n] (a b over 64 rows of a, as `kiln bench
// --gemm` stores the LM head's 768 x 50257); that b with a bf16 product, which its kernel stores
// at rows of 50; x read through a reshape ((2, 32, 61) as (64, 61)); x read twice by one product
// (x x^T); and x read by two products (x w1 + x w2). Against the Eigen executor on the same bf16
// inputs: f32 sums in another order, 1e-5; the bf16 product may round an element the other way,
// a relative 2^-8 at most.
TEST(Lowering, Bf16InputsThatMatmulsReadArePaddedToWholeChunks) {
  using testing::InputSpec;
  struct PadCase {
    const char* name;
    std::vector<InputSpec> inputs;
    BuildFn build;
    bool bf16_product = false;
  };
  const std::vector<PadCase> cases{
      {"a_rows_of_61",
       {{{40, 61}, DType::bf16}, {{61, 64}, DType::bf16}},
       [](Builder& bld, const std::vector<ValueId>& x) { return bld.matmul(x[0], x[1]); }},
      {"b_rows_of_50",
       {{{64, 16}, DType::bf16}, {{16, 50}, DType::bf16}},
       [](Builder& bld, const std::vector<ValueId>& x) { return bld.matmul(x[0], x[1]); }},
      {"b_rows_of_50_bf16_product",
       {{{64, 16}, DType::bf16}, {{16, 50}, DType::bf16}},
       [](Builder& bld, const std::vector<ValueId>& x) { return bld.cast(bld.matmul(x[0], x[1]), DType::bf16); },
       true},
      {"a_through_a_reshape",
       {{{2, 32, 61}, DType::bf16}, {{61, 64}, DType::bf16}},
       [](Builder& bld, const std::vector<ValueId>& x) {
         return bld.matmul(bld.reshape(x[0], Shape{64, 61}), x[1]);
       }},
      {"x_x_transposed",
       {{{64, 61}, DType::bf16}},
       [](Builder& bld, const std::vector<ValueId>& x) { return bld.matmul(x[0], x[0], false, true); }},
      {"x_read_by_two_products",
       {{{40, 61}, DType::bf16}, {{61, 32}, DType::bf16}, {{61, 32}, DType::bf16}},
       [](Builder& bld, const std::vector<ValueId>& x) {
         return bld.add(bld.matmul(x[0], x[1]), bld.matmul(x[0], x[2]));
       }},
  };
  for (const PadCase& pc : cases) {
    SCOPED_TRACE(pc.name);
    testing::Harness h(pc.inputs, pc.build);
    expect_padded_once_onto_tensor_cores(h, pc.bf16_product ? std::ldexp(1.0, -8) : 1e-5);
  }
}

// An input with such rows is left as it is where something else reads it (a cast to f32), where it
// is a requested output, where it is a persistent buffer that an assign writes (the assign reads
// its old version), or where the products use it fewer than 64 times an element (x of 24 x 61
// against 32 or 63 columns of w; w of 61 x 63 against x's 24 rows).
TEST(Lowering, Bf16InputsReadOtherwiseAreNotPadded) {
  auto concats = [](ValueRole role, bool widened_too, bool request_input, bool assign, int64_t n = 64) {
    Circuit c;
    Builder bld(c);
    const ValueId x = c.add_external({Shape{24, 61}, DType::bf16}, role, "x");
    const ValueId w = c.add_external({Shape{61, n}, DType::bf16}, ValueRole::Input, "w");
    std::vector<ValueId> outs{bld.matmul(x, w)};
    if (widened_too) outs.push_back(bld.cast(x, DType::f32));
    if (request_input) outs.push_back(x);
    if (assign) outs.push_back(bld.assign(x, bld.cast(bld.fill({24, 61}, DType::f32, 1.0), DType::bf16)));
    return testing::count_prim(pad_bf16_rows(c, outs, cpu_target()), PrimId::concat);
  };
  EXPECT_EQ(concats(ValueRole::Input, false, false, false), 1u);
  EXPECT_EQ(concats(ValueRole::Persistent, false, false, false), 1u);  // a frozen bf16 parameter
  EXPECT_EQ(concats(ValueRole::Input, true, false, false), 0u);
  EXPECT_EQ(concats(ValueRole::Input, false, true, false), 0u);
  EXPECT_EQ(concats(ValueRole::Persistent, false, false, true), 0u);
  EXPECT_EQ(concats(ValueRole::Input, false, false, false, 32), 0u);  // x used 32 times an element
  EXPECT_EQ(concats(ValueRole::Input, false, false, false, 63), 0u);  // x 63 times; w (rows of 63) 24 times
}

}  // namespace
}  // namespace kiln
