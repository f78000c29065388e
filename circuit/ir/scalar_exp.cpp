// ScalarExp and IndexExp: immutable expression trees with cached structural hashes, and their
// reference evaluation, printing, symbolic differentiation, exact-only simplification and
// substitution.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <numbers>
#include <unordered_map>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/hash.hpp>
#include <kiln/circuit/ir/scalar_exp.hpp>

namespace kiln {

namespace {

uint64_t bits(double v) { return std::bit_cast<uint64_t>(v); }

std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void se_check(bool ok, const std::string& msg) {
  if (!ok) throw Error("ScalarExp: " + msg);
}

void ix_check(bool ok, const std::string& msg) {
  if (!ok) throw Error("IndexExp: " + msg);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ScalarExp

const char* exp_op_name(ExpOp op) {
  static constexpr const char* names[] = {
      "const",     "input", "neg", "exp", "log", "sqrt",       "rsqrt", "tanh", "sigmoid", "gelu",
      "gelu_grad", "silu",  "sin", "cos", "abs", "round_bf16", "add",   "sub",  "mul",     "div",
      "pow",       "max",   "min", "lt",  "le",  "gt",         "ge",    "eq",   "ne",      "select"};
  static_assert(std::size(names) == static_cast<size_t>(ExpOp::Select) + 1);
  const auto i = static_cast<size_t>(op);
  return i < std::size(names) ? names[i] : "?";
}

int exp_op_arity(ExpOp op) {
  if (op <= ExpOp::Input) return 0;
  if (op <= ExpOp::RoundBf16) return 1;
  if (op <= ExpOp::Ne) return 2;
  return 3;
}

struct ScalarExp::Node {
  ExpOp op = ExpOp::Const;
  double value = 0.0;  // Const
  int index = -1;      // Input
  std::vector<ScalarExp> args;
  uint64_t hash = 0;
  int num_inputs = 0;       // 1 + largest input index used, 0 if none
  uint64_t input_mask = 0;  // bit k set when input k (k < 64) occurs

  // Builds a node without validation (callers have validated op, arity and arguments).
  static ScalarExp make(ExpOp op, double value, int index, std::vector<ScalarExp> args) {
    auto n = std::make_shared<Node>();
    n->op = op;
    n->value = value;
    n->index = index;
    uint64_t h = mix64(static_cast<uint64_t>(op) + 1);
    if (op == ExpOp::Const) h = hash_combine(h, bits(value));
    if (op == ExpOp::Input) {
      h = hash_combine(h, static_cast<uint64_t>(index));
      n->num_inputs = index + 1;
      if (index < 64) n->input_mask = uint64_t{1} << index;
    }
    for (const ScalarExp& a : args) {
      h = hash_combine(h, a.node_->hash);
      n->num_inputs = std::max(n->num_inputs, a.node_->num_inputs);
      n->input_mask |= a.node_->input_mask;
    }
    n->hash = h;
    n->args = std::move(args);
    return ScalarExp(std::move(n));
  }
};

ScalarExp ScalarExp::constant(double v) { return Node::make(ExpOp::Const, v, -1, {}); }

ScalarExp ScalarExp::input(int k) {
  se_check(k >= 0, "input index must be >= 0, got " + std::to_string(k));
  return Node::make(ExpOp::Input, 0.0, k, {});
}

ScalarExp ScalarExp::unary(ExpOp op, const ScalarExp& a) {
  se_check(exp_op_arity(op) == 1, std::string("unary() needs a unary op, got ") + exp_op_name(op));
  se_check(bool(a), std::string(exp_op_name(op)) + " of a null expression");
  return Node::make(op, 0.0, -1, {a});
}

ScalarExp ScalarExp::binary(ExpOp op, const ScalarExp& a, const ScalarExp& b) {
  se_check(exp_op_arity(op) == 2, std::string("binary() needs a binary op, got ") + exp_op_name(op));
  se_check(a && b, std::string(exp_op_name(op)) + " of a null expression");
  return Node::make(op, 0.0, -1, {a, b});
}

ScalarExp ScalarExp::select(const ScalarExp& c, const ScalarExp& a, const ScalarExp& b) {
  se_check(c && a && b, "select of a null expression");
  return Node::make(ExpOp::Select, 0.0, -1, {c, a, b});
}

ExpOp ScalarExp::op() const {
  se_check(!is_null(), "op() of a null expression");
  return node_->op;
}

double ScalarExp::const_value() const {
  se_check(op() == ExpOp::Const, std::string("const_value() of a ") + exp_op_name(op()) + " node");
  return node_->value;
}

int ScalarExp::input_index() const {
  se_check(op() == ExpOp::Input, std::string("input_index() of a ") + exp_op_name(op()) + " node");
  return node_->index;
}

const std::vector<ScalarExp>& ScalarExp::args() const {
  se_check(!is_null(), "args() of a null expression");
  return node_->args;
}

uint64_t ScalarExp::hash() const { return node_ ? node_->hash : 0; }

bool ScalarExp::operator==(const ScalarExp& o) const {
  if (node_ == o.node_) return true;
  if (!node_ || !o.node_) return false;
  const Node& a = *node_;
  const Node& b = *o.node_;
  if (a.hash != b.hash || a.op != b.op || bits(a.value) != bits(b.value) || a.index != b.index ||
      a.args.size() != b.args.size())
    return false;
  for (size_t i = 0; i < a.args.size(); ++i)
    if (a.args[i] != b.args[i]) return false;
  return true;
}

std::string ScalarExp::str() const {
  if (!node_) return "null";
  const Node& n = *node_;
  switch (n.op) {
    case ExpOp::Const: return fmt_double(n.value);
    case ExpOp::Input: return "in" + std::to_string(n.index);
    case ExpOp::Add: return "(" + n.args[0].str() + " + " + n.args[1].str() + ")";
    case ExpOp::Sub: return "(" + n.args[0].str() + " - " + n.args[1].str() + ")";
    case ExpOp::Mul: return "(" + n.args[0].str() + " * " + n.args[1].str() + ")";
    case ExpOp::Div: return "(" + n.args[0].str() + " / " + n.args[1].str() + ")";
    default: break;
  }
  std::string s = std::string(exp_op_name(n.op)) + "(";
  for (size_t i = 0; i < n.args.size(); ++i) s += (i ? ", " : "") + n.args[i].str();
  return s + ")";
}

int ScalarExp::num_inputs() const { return node_ ? node_->num_inputs : 0; }

bool ScalarExp::depends_on(int k) const {
  if (!node_ || k < 0 || k >= node_->num_inputs) return false;
  if (k < 64) return (node_->input_mask >> k) & 1;
  if (node_->op == ExpOp::Input) return node_->index == k;
  for (const ScalarExp& a : node_->args)
    if (a.depends_on(k)) return true;
  return false;
}

namespace {

using Node = ScalarExp::Node;
// Per-call memo tables keyed by node, so that shared subtrees are processed once.
using Memo = std::unordered_map<const Node*, ScalarExp>;

template <class T>
T eval_rec(const ScalarExp& e, std::span<const T> in) {
  const Node& n = *e.node();
  auto arg = [&](size_t i) { return eval_rec<T>(n.args[i], in); };
  switch (n.op) {
    case ExpOp::Const: return static_cast<T>(n.value);
    case ExpOp::Input:
      se_check(static_cast<size_t>(n.index) < in.size(),
               "eval: uses in" + std::to_string(n.index) + " but got " + std::to_string(in.size()) + " inputs");
      return in[static_cast<size_t>(n.index)];
    case ExpOp::Select: return arg(0) != T(0) ? arg(1) : arg(2);
    default: break;
  }
  const T x = arg(0);
  switch (n.op) {
    case ExpOp::Neg: return -x;
    case ExpOp::Exp: return std::exp(x);
    case ExpOp::Log: return std::log(x);
    case ExpOp::Sqrt: return std::sqrt(x);
    case ExpOp::Rsqrt: return T(1) / std::sqrt(x);
    case ExpOp::Tanh: return std::tanh(x);
    case ExpOp::Sigmoid: return T(1) / (T(1) + std::exp(-x));
    case ExpOp::Gelu: {
      const T k0 = static_cast<T>(std::sqrt(2.0 / std::numbers::pi));
      const T k1 = static_cast<T>(0.044715);
      return T(0.5) * x * (T(1) + std::tanh(k0 * (x + k1 * x * x * x)));
    }
    case ExpOp::GeluGrad: {
      const T k0 = static_cast<T>(std::sqrt(2.0 / std::numbers::pi));
      const T k1 = static_cast<T>(0.044715);
      const T t = std::tanh(k0 * (x + k1 * x * x * x));
      return T(0.5) * (T(1) + t) + T(0.5) * k0 * x * (T(1) - t * t) * (T(1) + T(3) * k1 * x * x);
    }
    case ExpOp::Silu: return x * (T(1) / (T(1) + std::exp(-x)));
    case ExpOp::Sin: return std::sin(x);
    case ExpOp::Cos: return std::cos(x);
    case ExpOp::Abs: return std::fabs(x);
    case ExpOp::RoundBf16: return static_cast<T>(round_to_bf16(static_cast<float>(x)));
    default: break;
  }
  const T y = arg(1);
  switch (n.op) {
    case ExpOp::Add: return x + y;
    case ExpOp::Sub: return x - y;
    case ExpOp::Mul: return x * y;
    case ExpOp::Div: return x / y;
    case ExpOp::Pow: return std::pow(x, y);
    case ExpOp::Max: return std::isnan(x) ? x : std::isnan(y) ? y : x >= y ? x : y;
    case ExpOp::Min: return std::isnan(x) ? x : std::isnan(y) ? y : x <= y ? x : y;
    case ExpOp::Lt: return x < y ? T(1) : T(0);
    case ExpOp::Le: return x <= y ? T(1) : T(0);
    case ExpOp::Gt: return x > y ? T(1) : T(0);
    case ExpOp::Ge: return x >= y ? T(1) : T(0);
    case ExpOp::Eq: return x == y ? T(1) : T(0);
    case ExpOp::Ne: return x != y ? T(1) : T(0);
    default: break;
  }
  throw Error(std::string("ScalarExp: eval of unknown op ") + exp_op_name(n.op));
}

// Derivative combinators in which a null ScalarExp stands for an exact zero; none of them ever
// multiplies by a zero, so no `0 * x` node is built.
ScalarExp add_z(const ScalarExp& a, const ScalarExp& b) {
  if (!a) return b;
  if (!b) return a;
  return a + b;
}

ScalarExp sub_z(const ScalarExp& a, const ScalarExp& b) {
  if (!b) return a;
  if (!a) return -b;
  return a - b;
}

// f * d, null when d is.
ScalarExp mul_z(const ScalarExp& f, const ScalarExp& d) { return d ? f * d : ScalarExp(); }

// d / f, null when d is.
ScalarExp div_z(const ScalarExp& d, const ScalarExp& f) { return d ? d / f : ScalarExp(); }

ScalarExp or_zero(const ScalarExp& d) { return d ? d : se::c(0.0); }

// select(c, da, db) with a null side as constant 0; null when both are.
ScalarExp select_z(const ScalarExp& c, const ScalarExp& da, const ScalarExp& db) {
  if (!da && !db) return {};
  return se::select(c, or_zero(da), or_zero(db));
}

// d/dx of the tanh approximation of gelu, spelled out in ops (for gelu's second derivative):
// 0.5 (1 + t) + 0.5 k0 x (1 - t^2) (1 + 3 k1 x^2), t = tanh(k0 (x + k1 x^3)).
ScalarExp gelu_grad_expanded(const ScalarExp& x) {
  const double k0 = std::sqrt(2.0 / std::numbers::pi);
  const double k1 = 0.044715;
  const ScalarExp one = se::c(1.0);
  const ScalarExp t = se::tanh(se::c(k0) * (x + se::c(k1) * (x * x * x)));
  return se::c(0.5) * (one + t) + se::c(0.5 * k0) * x * (one - t * t) * (one + se::c(3.0 * k1) * (x * x));
}

ScalarExp diff_rec(const ScalarExp& e, int k, Memo& memo) {
  if (!e.depends_on(k)) return {};
  const Node& n = *e.node();
  if (auto it = memo.find(&n); it != memo.end()) return it->second;
  auto d = [&](size_t i) { return diff_rec(n.args[i], k, memo); };
  const ScalarExp one = se::c(1.0);
  ScalarExp r;
  switch (n.op) {
    case ExpOp::Const: break;
    case ExpOp::Input: r = one; break;            // depends_on(k) holds, so this is in_k
    case ExpOp::Neg: r = sub_z({}, d(0)); break;  // -da
    case ExpOp::Exp: r = mul_z(e, d(0)); break;
    case ExpOp::Log: r = div_z(d(0), n.args[0]); break;
    case ExpOp::Sqrt: r = div_z(d(0), se::c(2.0) * e); break;
    case ExpOp::Rsqrt: r = mul_z(se::c(-0.5) * e / n.args[0], d(0)); break;
    case ExpOp::Tanh: r = mul_z(one - e * e, d(0)); break;
    case ExpOp::Sigmoid: r = mul_z(e * (one - e), d(0)); break;
    case ExpOp::Gelu: r = mul_z(se::gelu_grad(n.args[0]), d(0)); break;
    case ExpOp::GeluGrad: {  // a memo of its own: the expanded tree is temporary (its nodes key no entry of `memo`)
      Memo expanded_memo;
      r = diff_rec(gelu_grad_expanded(n.args[0]), k, expanded_memo);
      break;
    }
    case ExpOp::Silu: {
      const ScalarExp s = se::sigmoid(n.args[0]);
      r = mul_z(s + n.args[0] * s * (one - s), d(0));
      break;
    }
    case ExpOp::Sin: r = mul_z(se::cos(n.args[0]), d(0)); break;
    case ExpOp::Cos: r = mul_z(-se::sin(n.args[0]), d(0)); break;
    case ExpOp::Abs: {
      const ScalarExp& x = n.args[0];
      const ScalarExp zero = se::c(0.0);
      r = mul_z(se::select(se::gt(x, zero), one, se::select(se::lt(x, zero), se::c(-1.0), zero)), d(0));
      break;
    }
    case ExpOp::RoundBf16: r = d(0); break;  // straight through
    case ExpOp::Add: r = add_z(d(0), d(1)); break;
    case ExpOp::Sub: r = sub_z(d(0), d(1)); break;
    case ExpOp::Mul: r = add_z(mul_z(n.args[1], d(0)), mul_z(n.args[0], d(1))); break;
    case ExpOp::Div: r = sub_z(div_z(d(0), n.args[1]), mul_z(e / n.args[1], d(1))); break;
    case ExpOp::Pow: {
      const ScalarExp& a = n.args[0];
      const ScalarExp& b = n.args[1];
      r = add_z(mul_z(b * se::pow(a, b - one), d(0)), mul_z(e * se::log(a), d(1)));
      break;
    }
    case ExpOp::Max: r = select_z(se::ge(n.args[0], n.args[1]), d(0), d(1)); break;
    case ExpOp::Min: r = select_z(se::le(n.args[0], n.args[1]), d(0), d(1)); break;
    case ExpOp::Lt:
    case ExpOp::Le:
    case ExpOp::Gt:
    case ExpOp::Ge:
    case ExpOp::Eq:
    case ExpOp::Ne: break;
    case ExpOp::Select: r = select_z(n.args[0], d(1), d(2)); break;
  }
  memo.emplace(&n, r);
  return r;
}

bool is_const(const ScalarExp& e, double v) { return e.op() == ExpOp::Const && bits(e.const_value()) == bits(v); }

// The exact local rewrites of simplify(), applied to a node whose arguments are simplified.
ScalarExp simplify_node(const ScalarExp& e) {
  const Node& n = *e.node();
  bool all_const = true;
  for (const ScalarExp& a : n.args) all_const = all_const && a.op() == ExpOp::Const;
  if (all_const) return se::c(e.eval(std::span<const double>()));
  switch (n.op) {
    case ExpOp::Mul:
      if (is_const(n.args[1], 1.0)) return n.args[0];
      if (is_const(n.args[0], 1.0)) return n.args[1];
      break;
    case ExpOp::Div:
      if (is_const(n.args[1], 1.0)) return n.args[0];
      break;
    case ExpOp::Sub:
      if (is_const(n.args[1], 0.0)) return n.args[0];  // +0 only: -0 - (-0) would be +0
      break;
    case ExpOp::Neg:
      if (n.args[0].op() == ExpOp::Neg) return n.args[0].args()[0];
      break;
    default: break;
  }
  return e;
}

// Rebuilds e bottom-up with each child mapped by f (memoized), reusing e when nothing changed,
// then applies `post` to the rebuilt node.
template <class F, class Post>
ScalarExp rebuild(const ScalarExp& e, Memo& memo, F&& f, Post&& post) {
  const Node& n = *e.node();
  if (auto it = memo.find(&n); it != memo.end()) return it->second;
  std::vector<ScalarExp> args;
  args.reserve(n.args.size());
  bool changed = false;
  for (const ScalarExp& a : n.args) {
    args.push_back(f(a));
    changed = changed || args.back().node() != a.node();
  }
  ScalarExp r = post(changed ? Node::make(n.op, n.value, n.index, std::move(args)) : e);
  memo.emplace(&n, r);
  return r;
}

ScalarExp simplify_rec(const ScalarExp& e, Memo& memo) {
  if (e.node()->args.empty()) return e;
  return rebuild(
      e, memo, [&](const ScalarExp& a) { return simplify_rec(a, memo); }, simplify_node);
}

ScalarExp substitute_rec(const ScalarExp& e, const std::vector<ScalarExp>& subs, Memo& memo) {
  const Node& n = *e.node();
  if (n.op == ExpOp::Input) {
    const ScalarExp& s = subs[static_cast<size_t>(n.index)];
    se_check(bool(s), "substitute: replacement for in" + std::to_string(n.index) + " is null");
    return s;
  }
  if (n.args.empty()) return e;
  return rebuild(
      e, memo, [&](const ScalarExp& a) { return substitute_rec(a, subs, memo); }, [](ScalarExp r) { return r; });
}

}  // namespace

ScalarExp ScalarExp::derivative(int k) const {
  Memo memo;
  return diff_rec(*this, k, memo).simplify();
}

ScalarExp ScalarExp::simplify() const {
  if (!node_) return {};
  Memo memo;
  return simplify_rec(*this, memo);
}

ScalarExp ScalarExp::substitute(const std::vector<ScalarExp>& subs) const {
  if (!node_) return {};
  se_check(subs.size() >= static_cast<size_t>(num_inputs()), "substitute: " + std::to_string(subs.size()) +
                                                                 " replacements for an expression over " +
                                                                 std::to_string(num_inputs()) + " inputs");
  Memo memo;
  return substitute_rec(*this, subs, memo);
}

double ScalarExp::eval(std::span<const double> inputs) const {
  se_check(!is_null(), "eval of a null expression");
  return eval_rec<double>(*this, inputs);
}

float ScalarExp::eval(std::span<const float> inputs) const {
  se_check(!is_null(), "eval of a null expression");
  return eval_rec<float>(*this, inputs);
}

ScalarExp operator+(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Add, a, b); }
ScalarExp operator-(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Sub, a, b); }
ScalarExp operator*(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Mul, a, b); }
ScalarExp operator/(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Div, a, b); }
ScalarExp operator-(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Neg, a); }

namespace se {
ScalarExp exp(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Exp, a); }
ScalarExp log(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Log, a); }
ScalarExp sqrt(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Sqrt, a); }
ScalarExp rsqrt(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Rsqrt, a); }
ScalarExp tanh(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Tanh, a); }
ScalarExp sigmoid(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Sigmoid, a); }
ScalarExp gelu(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Gelu, a); }
ScalarExp gelu_grad(const ScalarExp& a) { return ScalarExp::unary(ExpOp::GeluGrad, a); }
ScalarExp silu(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Silu, a); }
ScalarExp sin(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Sin, a); }
ScalarExp cos(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Cos, a); }
ScalarExp abs(const ScalarExp& a) { return ScalarExp::unary(ExpOp::Abs, a); }
ScalarExp round_bf16(const ScalarExp& a) { return ScalarExp::unary(ExpOp::RoundBf16, a); }
ScalarExp pow(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Pow, a, b); }
ScalarExp max(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Max, a, b); }
ScalarExp min(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Min, a, b); }
ScalarExp lt(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Lt, a, b); }
ScalarExp le(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Le, a, b); }
ScalarExp gt(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Gt, a, b); }
ScalarExp ge(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Ge, a, b); }
ScalarExp eq(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Eq, a, b); }
ScalarExp ne(const ScalarExp& a, const ScalarExp& b) { return ScalarExp::binary(ExpOp::Ne, a, b); }
ScalarExp select(const ScalarExp& c, const ScalarExp& a, const ScalarExp& b) { return ScalarExp::select(c, a, b); }
}  // namespace se

// ---------------------------------------------------------------------------------------------
// IndexExp

namespace {

const char* index_op_name(IndexOp op) {
  static constexpr const char* names[] = {"const", "coord", "add", "sub", "mul", "floordiv", "mod", "min",
                                          "max",   "lt",    "le",  "gt",  "ge",  "eq",       "ne",  "select"};
  static_assert(std::size(names) == static_cast<size_t>(IndexOp::Select) + 1);
  const auto i = static_cast<size_t>(op);
  return i < std::size(names) ? names[i] : "?";
}

// a op b for op in {add, sub, mul}, throwing on int64 overflow.
int64_t checked_arith(IndexOp op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = op == IndexOp::Add   ? __builtin_add_overflow(a, b, &r)
                        : op == IndexOp::Sub ? __builtin_sub_overflow(a, b, &r)
                                             : __builtin_mul_overflow(a, b, &r);
  ix_check(!overflow, std::string("eval: int64 overflow in ") + index_op_name(op));
  return r;
}

// Python's a // b and a % b.
int64_t floor_div(int64_t a, int64_t b) {
  ix_check(b != 0, "eval: division by zero in floordiv");
  ix_check(!(a == std::numeric_limits<int64_t>::min() && b == -1), "eval: int64 overflow in floordiv");
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  ix_check(b != 0, "eval: modulo by zero in mod");
  if (b == -1) return 0;  // INT64_MIN % -1 overflows in C++
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

}  // namespace

struct IndexExp::Node {
  IndexOp op = IndexOp::Const;
  int64_t value = 0;  // Const
  int axis = -1;      // Coord
  std::vector<IndexExp> args;
  uint64_t hash = 0;
  int max_axis = -1;

  static IndexExp make(IndexOp op, int64_t value, int axis, std::vector<IndexExp> args) {
    auto n = std::make_shared<Node>();
    n->op = op;
    n->value = value;
    n->axis = axis;
    n->max_axis = axis;
    uint64_t h = mix64(static_cast<uint64_t>(op) + 0x100);
    if (op == IndexOp::Const) h = hash_combine(h, static_cast<uint64_t>(value));
    if (op == IndexOp::Coord) h = hash_combine(h, static_cast<uint64_t>(axis));
    for (const IndexExp& a : args) {
      h = hash_combine(h, a.node_->hash);
      n->max_axis = std::max(n->max_axis, a.node_->max_axis);
    }
    n->hash = h;
    n->args = std::move(args);
    return IndexExp(std::move(n));
  }
};

IndexExp IndexExp::constant(int64_t v) { return Node::make(IndexOp::Const, v, -1, {}); }

IndexExp IndexExp::coord(int axis) {
  ix_check(axis >= 0, "coord axis must be >= 0, got " + std::to_string(axis));
  return Node::make(IndexOp::Coord, 0, axis, {});
}

IndexExp IndexExp::binary(IndexOp op, const IndexExp& a, const IndexExp& b) {
  ix_check(op != IndexOp::Const && op != IndexOp::Coord && op != IndexOp::Select,
           std::string("binary() needs a binary op, got ") + index_op_name(op));
  ix_check(a && b, std::string(index_op_name(op)) + " of a null expression");
  return Node::make(op, 0, -1, {a, b});
}

IndexExp IndexExp::select(const IndexExp& c, const IndexExp& a, const IndexExp& b) {
  ix_check(c && a && b, "select of a null expression");
  return Node::make(IndexOp::Select, 0, -1, {c, a, b});
}

IndexOp IndexExp::op() const {
  ix_check(!is_null(), "op() of a null expression");
  return node_->op;
}

int64_t IndexExp::const_value() const {
  ix_check(op() == IndexOp::Const, std::string("const_value() of a ") + index_op_name(op()) + " node");
  return node_->value;
}

int IndexExp::axis() const {
  ix_check(op() == IndexOp::Coord, std::string("axis() of a ") + index_op_name(op()) + " node");
  return node_->axis;
}

const std::vector<IndexExp>& IndexExp::args() const {
  ix_check(!is_null(), "args() of a null expression");
  return node_->args;
}

int IndexExp::max_axis() const { return node_ ? node_->max_axis : -1; }

uint64_t IndexExp::hash() const { return node_ ? node_->hash : 0; }

bool IndexExp::operator==(const IndexExp& o) const {
  if (node_ == o.node_) return true;
  if (!node_ || !o.node_) return false;
  const Node& a = *node_;
  const Node& b = *o.node_;
  if (a.hash != b.hash || a.op != b.op || a.value != b.value || a.axis != b.axis || a.args.size() != b.args.size())
    return false;
  for (size_t i = 0; i < a.args.size(); ++i)
    if (a.args[i] != b.args[i]) return false;
  return true;
}

std::string IndexExp::str() const {
  if (!node_) return "null";
  const Node& n = *node_;
  switch (n.op) {
    case IndexOp::Const: return std::to_string(n.value);
    case IndexOp::Coord: return "i" + std::to_string(n.axis);
    case IndexOp::Add: return "(" + n.args[0].str() + " + " + n.args[1].str() + ")";
    case IndexOp::Sub: return "(" + n.args[0].str() + " - " + n.args[1].str() + ")";
    case IndexOp::Mul: return "(" + n.args[0].str() + " * " + n.args[1].str() + ")";
    default: break;
  }
  std::string s = std::string(index_op_name(n.op)) + "(";
  for (size_t i = 0; i < n.args.size(); ++i) s += (i ? ", " : "") + n.args[i].str();
  return s + ")";
}

int64_t IndexExp::eval(std::span<const int64_t> coords) const {
  ix_check(!is_null(), "eval of a null expression");
  const Node& n = *node_;
  switch (n.op) {
    case IndexOp::Const: return n.value;
    case IndexOp::Coord:
      ix_check(static_cast<size_t>(n.axis) < coords.size(),
               "eval: coordinate i" + std::to_string(n.axis) + " of " + std::to_string(coords.size()) + " coordinates");
      return coords[static_cast<size_t>(n.axis)];
    case IndexOp::Select: return n.args[0].eval(coords) != 0 ? n.args[1].eval(coords) : n.args[2].eval(coords);
    default: break;
  }
  const int64_t a = n.args[0].eval(coords);
  const int64_t b = n.args[1].eval(coords);
  switch (n.op) {
    case IndexOp::Add:
    case IndexOp::Sub:
    case IndexOp::Mul: return checked_arith(n.op, a, b);
    case IndexOp::FloorDiv: return floor_div(a, b);
    case IndexOp::Mod: return floor_mod(a, b);
    case IndexOp::Min: return std::min(a, b);
    case IndexOp::Max: return std::max(a, b);
    case IndexOp::Lt: return a < b;
    case IndexOp::Le: return a <= b;
    case IndexOp::Gt: return a > b;
    case IndexOp::Ge: return a >= b;
    case IndexOp::Eq: return a == b;
    case IndexOp::Ne: return a != b;
    default: break;
  }
  throw Error(std::string("IndexExp: eval of unknown op ") + index_op_name(n.op));
}

namespace ix {
IndexExp add(const IndexExp& a, const IndexExp& b) { return IndexExp::binary(IndexOp::Add, a, b); }
IndexExp sub(const IndexExp& a, const IndexExp& b) { return IndexExp::binary(IndexOp::Sub, a, b); }
IndexExp mul(const IndexExp& a, const IndexExp& b) { return IndexExp::binary(IndexOp::Mul, a, b); }
IndexExp floordiv(const IndexExp& a, const IndexExp& b) { return IndexExp::binary(IndexOp::FloorDiv, a, b); }
IndexExp mod(const IndexExp& a, const IndexExp& b) { return IndexExp::binary(IndexOp::Mod, a, b); }
IndexExp ge(const IndexExp& a, const IndexExp& b) { return IndexExp::binary(IndexOp::Ge, a, b); }
IndexExp lt(const IndexExp& a, const IndexExp& b) { return IndexExp::binary(IndexOp::Lt, a, b); }
IndexExp eq(const IndexExp& a, const IndexExp& b) { return IndexExp::binary(IndexOp::Eq, a, b); }
}  // namespace ix

}  // namespace kiln
