// One case list per Prim family, in tests/prims/<family>.cpp beside the family's sources
// (circuit/prims/<family>.cpp, cuda/lower/<family>.cpp): its gradient cases (an f64
// finite-difference check, run by test_prim_gradients.cpp) and its lowering cases (its kernels
// in the SIMT simulator, through ptxas and on a GPU, against the Eigen reference, run by
// test_lowering.cpp). Coverage is derived from the registry and these lists: every Prim with a
// VJP rule needs a gradient case naming it, every Prim a lowering case using it.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "prim_test_util.hpp"

namespace kiln::testing {

struct GradCase {
  std::string name;
  std::vector<std::string> prims;  // Prims this case differentiates through
  std::vector<InputSpec> inputs;
  BuildFn build;
  double step = 0, tolerance = 1e-6;  // step 0: GradCheckOptions' default (relative, Richardson)
};

struct LoweringCase {
  std::string name;
  std::vector<InputSpec> inputs;
  BuildFn build;
  double tolerance;  // norm-relative; 0: bit-exact
};

// gtest prints a failing case by its name, not its bytes.
inline void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const LoweringCase& c, std::ostream* os) { *os << c.name; }

struct FamilyCases {
  std::vector<GradCase> gradient;
  std::vector<LoweringCase> lowering;
};

// Gradient inputs (f64): checked, integer indices in [0, hi), and float but not checked.
inline InputSpec F(Shape s, double lo = -1, double hi = 1) { return InputSpec{std::move(s), DType::f64, lo, hi, true}; }
inline InputSpec I(Shape s, int64_t hi) {
  return InputSpec{std::move(s), DType::i32, 0.0, static_cast<double>(hi), false};
}
inline InputSpec Fixed(Shape s, double lo = -1, double hi = 1) {
  return InputSpec{std::move(s), DType::f64, lo, hi, false};
}
// Lowering inputs (the GPU runs f32 and i32).
inline InputSpec f32(Shape s, double lo = -2, double hi = 2) { return {std::move(s), DType::f32, lo, hi}; }
inline InputSpec i32(Shape s, double lo, double hi) { return {std::move(s), DType::i32, lo, hi}; }

// A pointwise op of body over all inputs; of f(in(0)) over the first.
inline BuildFn body(ScalarExp e) {
  return [e](Builder& b, const std::vector<ValueId>& x) { return b.pointwise(e, x); };
}
inline BuildFn unary(ScalarExp (*f)(const ScalarExp&)) { return body(f(se::in(0))); }

inline void add_gradient(FamilyCases& c, std::string name, std::vector<std::string> prims, std::vector<InputSpec> in,
                         BuildFn f, double step = 0, double tol = 1e-6) {
  c.gradient.push_back({std::move(name), std::move(prims), std::move(in), std::move(f), step, tol});
}
// pointwise_<name>: body over one (37, 45) input uniform in [lo, hi).
inline void add_unary_pointwise_lowering(FamilyCases& c, const std::string& name, ScalarExp body, double lo = -3,
                                         double hi = 3) {
  c.lowering.push_back({"pointwise_" + name,
                        {f32({37, 45}, lo, hi)},
                        [body](Builder& b, const std::vector<ValueId>& x) { return b.pointwise(body, {x[0]}); },
                        1e-5});
}

// One function per family (tests/prims/<family>.cpp); composites.cpp holds the composites'
// gradient cases.
void pointwise_cases(FamilyCases& c);
void reduce_cases(FamilyCases& c);
void matmul_cases(FamilyCases& c);
void gather_cases(FamilyCases& c);
void shape_ops_cases(FamilyCases& c);
void slice_concat_cases(FamilyCases& c);
void where_cases(FamilyCases& c);
void cast_cases(FamilyCases& c);
void constants_cases(FamilyCases& c);
void random_cases(FamilyCases& c);
void fused_rows_cases(FamilyCases& c);
void multi_tensor_cases(FamilyCases& c);
void fused_matmul_cases(FamilyCases& c);
void column_sums_cases(FamilyCases& c);
void attention_cases(FamilyCases& c);
void all_reduce_cases(FamilyCases& c);
void composites_cases(FamilyCases& c);

// Every family's cases.
FamilyCases all_prim_cases();

}  // namespace kiln::testing
