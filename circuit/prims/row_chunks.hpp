// The CPU reference's fast path for a fused_rows op whose rows fit a block (n <= kBlock): every
// reduction and output body is compiled into one instruction list, so a subexpression that
// several bodies share (a layer norm's normalized row, Adam's new moments) is computed once per
// chunk of whole rows instead of once per body. An instruction whose value is the same along a
// row (it reads only per-row inputs, reductions and constants) runs once per row, and is spread
// along the rows only where an instruction that varies along them reads it. Values live in a
// few blocks reused as they die (liveness decided once, when the list is compiled), so a chunk's
// working set stays in the L1 and L2 caches. Internal to circuit/prims/ (it pulls in Eigen).
//
// It evaluates the operations evaluating each body over the whole domain would, and sums each
// row in one piece. A per-row value computed once can differ in the last bit from the same value
// computed at every element of its row (Eigen's vectorized exp, tanh and log against the scalar
// ones at a block's edges); the tests compare fused and unfused results at 1e-12 (f64).
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include <kiln/circuit/prims/body_eval.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>

namespace kiln::ref {

// Reduces v[0, n) into acc (which holds the kind's identity or an earlier part of the row): NaN
// propagates through max.
template <class T>
void reduce_into(ReduceKind kind, const T* v, int64_t n, T& acc) {
  if (kind == ReduceKind::Max) {
    for (int64_t i = 0; i < n; ++i) acc = reduce_combine(kind, acc, v[i]);
  } else {
    acc += Eigen::Map<const Arr<T>>(v, n).sum();
  }
}

template <class T>
class RowChunks {
 public:
  // Compiled from the program and the shapes of the op's inputs; rows are at most kBlock long.
  // `max_chunk_rows` > 0 (a tuned KernelChoice::row_chunk) caps the rows of a chunk below the
  // most a block holds (kBlock / row length); a larger cap changes nothing.
  RowChunks(RowProgram rp, const std::vector<Shape>& input_shapes, int64_t max_chunk_rows = 0)
      : rp_(std::move(rp)), n_(rp_.n()), row_shape_(rp_.row_shape()) {
    chunk_rows_ = std::max<int64_t>(1, kBlock / std::max<int64_t>(n_, 1));
    if (max_chunk_rows > 0) chunk_rows_ = std::min(chunk_rows_, max_chunk_rows);
    std::vector<std::pair<ScalarExp, int>> seen;
    for (const ScalarExp& body : rp_.reduction_bodies) {
      reduction_roots_.push_back(compile_body(body, code_, seen));
      reduce_after_.push_back(static_cast<int>(code_.size()) - 1);
    }
    for (const ScalarExp& body : rp_.output_bodies) output_roots_.push_back(compile_body(body, code_, seen));
    describe_inputs(input_shapes);
    plan_slots();
  }

  // Where this run reads and writes: `in` are the op's inputs (of type T, the shapes compiled
  // for), reductions[j] holds reduction j per row (the row shape's elements), outs[o] output o.
  void bind(const std::vector<const HostTensor*>& in, std::vector<T*> reductions, std::vector<T*> outs) {
    for (size_t k = 0; k < in.size(); ++k) inputs_[k].data = in[k]->data<T>();
    reductions_ = std::move(reductions);
    outs_ = std::move(outs);
  }

  // Most rows a chunk holds.
  int64_t chunk_rows() const { return chunk_rows_; }

  // Whether row output o may be stored over input k (of the domain's shape): in a chunk, every
  // read of input k comes before output o's store, or is an argument of the coefficient-wise
  // instruction that computes output o in place (GELU's gradient excepted: it writes its
  // destination before it has read all of its argument). Over-approximates the reads: an input
  // read in place is counted at its instruction and at each of its readers.
  bool output_may_overwrite_input(size_t o, int k) const {
    const int end = static_cast<int>(code_.size());
    const int root = output_roots_[o];
    const int store =
        place_[static_cast<size_t>(root)].output == static_cast<int>(o) ? root : end + static_cast<int>(o);
    auto is_k = [&](int v) {
      return v >= 0 && is_input(code_[static_cast<size_t>(v)]) && code_[static_cast<size_t>(v)].input == k;
    };
    for (int i = 0; i < end; ++i) {
      const Instr& I = code_[static_cast<size_t>(i)];
      if (is_k(i) && i > store) return false;
      for (int a : {I.a, I.b, I.c})
        if (is_k(a) && (i > store || (i == store && I.op == ExpOp::GeluGrad))) return false;
    }
    for (size_t j = 0; j < reduction_roots_.size(); ++j)
      if (is_k(reduction_roots_[j]) && reduce_after_[j] >= store) return false;
    for (size_t p = 0; p < output_roots_.size(); ++p)  // the copies after the last instruction
      if (is_k(output_roots_[p]) && end + static_cast<int>(p) >= store) return false;
    return true;
  }

  // Rows [r0, r1) (at most chunk_rows()) of the bound run: reductions and outputs written.
  // `regs` is the calling thread's, ready (see prepare).
  void run(int64_t r0, int64_t r1, Registers<T>& regs) const {
    const int64_t rows = r1 - r0, e0 = r0 * n_, len = rows * n_;
    std::vector<const T*>& value = regs.value;
    auto slot = [&](int s) { return regs.blocks[static_cast<size_t>(s)].data(); };
    size_t next_reduction = 0;
    for (size_t i = 0; i < code_.size(); ++i) {
      const Instr& I = code_[i];
      const Place& p = place_[i];
      for (int u : p.spread_first) {  // per-row values this instruction is the first to read spread
        T* dst = slot(place_[static_cast<size_t>(u)].spread_slot);
        spread(value[static_cast<size_t>(u)], rows, dst);
      }
      if (p.everywhere) {
        value[i] = slot(p.slot);  // filled by prepare()
      } else if (I.op == ExpOp::Input) {
        value[i] = read_input(I.input, p, r0, rows, e0, len, p.slot < 0 ? nullptr : slot(p.slot));
      } else {
        T* dst = p.output >= 0 ? outs_[static_cast<size_t>(p.output)] + (p.uniform ? r0 : e0) : slot(p.slot);
        apply_instr<T>(I, arg(I.a, p.uniform, value, regs), arg(I.b, p.uniform, value, regs),
                       arg(I.c, p.uniform, value, regs), dst, p.uniform ? rows : len);
        value[i] = dst;
      }
      for (; next_reduction < reduce_after_.size() && reduce_after_[next_reduction] == static_cast<int>(i);
           ++next_reduction)
        reduce(next_reduction, r0, rows, value, regs);
    }
    for (size_t o = 0; o < output_roots_.size(); ++o) {
      const auto v = static_cast<size_t>(output_roots_[o]);
      if (place_[v].output == static_cast<int>(o)) continue;  // computed in place
      T* out = outs_[o] + (rp_.output_per_row[o] ? r0 : e0);
      if (rp_.output_per_row[o] || !place_[v].uniform)
        std::copy_n(value[v], rp_.output_per_row[o] ? rows : len, out);
      else
        spread(value[v], rows, out);
    }
  }

  // Readies the calling thread's registers for run(): enough blocks, the values that are the
  // same everywhere filled.
  void prepare(Registers<T>& regs) const {
    regs.reset(static_cast<size_t>(slots_) + 1);  // the last: scratch for reduce()
    regs.value.assign(code_.size(), nullptr);
    // The most a chunk reads (a small op's few elements).
    const int64_t reach = std::min(chunk_rows(), rp_.rows()) * std::max<int64_t>(n_, 1);
    for (size_t i = 0; i < code_.size(); ++i)
      if (place_[i].everywhere) {
        const Instr& I = code_[i];
        const T v = I.op == ExpOp::Const ? T(I.value) : inputs_[static_cast<size_t>(I.input)].data[0];
        regs.blocks[static_cast<size_t>(place_[i].slot)].head(reach).setConstant(v);
      }
  }

 private:
  int64_t chunk_rows_ = 1;
  struct Place {
    bool uniform = false;           // the same along a row: computed per row
    bool everywhere = false;        // a constant or a scalar input: a block filled once per run
    int slot = -1;                  // its block (-1: read in place, or written to an output)
    int spread_slot = -1;           // a per-row value spread along the rows, for varying readers
    int output = -1;                // computed straight into this output
    std::vector<int> spread_first;  // per-row values to spread before this instruction runs
  };
  struct Input {
    const T* data = nullptr;              // this run's
    bool varies = false, direct = false;  // direct: has the domain's (or, per row, the rows') size
    bool scalar = false;                  // one element
    std::vector<int64_t> bstrides;        // otherwise: broadcast to the domain (or row shape)
  };

  void describe_inputs(const std::vector<Shape>& shapes) {
    for (const Shape& shape : shapes) {
      Input b;
      b.varies = varies_along_row(shape, rp_.domain);
      b.scalar = shape.numel() == 1;
      const Shape& to = b.varies ? rp_.domain : row_shape_;
      b.direct = shape.numel() == to.numel();
      if (!b.direct) b.bstrides = broadcast_strides(shape, to);
      inputs_.push_back(std::move(b));
    }
  }

  bool is_input(const Instr& I) const { return I.op == ExpOp::Input && I.input < rp_.inputs; }

  // Uniformity, where each value lives, and when each block is free again.
  void plan_slots() {
    const size_t count = code_.size();
    place_.resize(count);
    for (size_t i = 0; i < count; ++i) {
      const Instr& I = code_[i];
      Place& p = place_[i];
      if (I.op == ExpOp::Const || (is_input(I) && inputs_[static_cast<size_t>(I.input)].scalar)) {
        p.uniform = p.everywhere = true;
      } else if (I.op == ExpOp::Input) {
        p.uniform = !is_input(I) || !inputs_[static_cast<size_t>(I.input)].varies;
      } else {
        p.uniform = true;
        for (int a : {I.a, I.b, I.c})
          if (a >= 0) p.uniform = p.uniform && place_[static_cast<size_t>(a)].uniform;
      }
    }
    // Outputs computed in place: a computed root of the output's kind, the first such output.
    for (size_t o = 0; o < output_roots_.size(); ++o) {
      Place& p = place_[static_cast<size_t>(output_roots_[o])];
      const Instr& I = code_[static_cast<size_t>(output_roots_[o])];
      if (I.op != ExpOp::Const && I.op != ExpOp::Input && p.output < 0 && p.uniform == rp_.output_per_row[o])
        p.output = static_cast<int>(o);
    }
    // Last reads: by instructions, by reductions (after their instruction), by outputs (the end).
    const int end = static_cast<int>(count);
    std::vector<int> last(count, -1), last_spread(count, -1);
    for (size_t i = 0; i < count; ++i)
      for (int a : {code_[i].a, code_[i].b, code_[i].c}) {
        if (a < 0) continue;
        last[static_cast<size_t>(a)] = static_cast<int>(i);
        const bool spreads =
            !place_[i].uniform && place_[static_cast<size_t>(a)].uniform && !place_[static_cast<size_t>(a)].everywhere;
        if (spreads) {
          if (last_spread[static_cast<size_t>(a)] < 0) place_[i].spread_first.push_back(a);
          last_spread[static_cast<size_t>(a)] = static_cast<int>(i);
        }
      }
    for (size_t j = 0; j < reduction_roots_.size(); ++j) {
      const auto r = static_cast<size_t>(reduction_roots_[j]);
      last[r] = std::max(last[r], reduce_after_[j]);
    }
    for (int r : output_roots_) last[static_cast<size_t>(r)] = end;
    std::vector<int> free_slots;
    auto take = [&] {
      if (free_slots.empty()) return slots_++;
      const int s = free_slots.back();
      free_slots.pop_back();
      return s;
    };
    // Values the same everywhere first: their blocks are filled once per run of the op and held
    // throughout.
    for (size_t i = 0; i < count; ++i)
      if (place_[i].everywhere) place_[i].slot = slots_++;
    std::vector<std::vector<int>> frees(count);
    for (size_t i = 0; i < count; ++i) {
      Place& p = place_[i];
      const Instr& I = code_[i];
      for (int u : p.spread_first) {
        place_[static_cast<size_t>(u)].spread_slot = take();
        frees[static_cast<size_t>(last_spread[static_cast<size_t>(u)])].push_back(
            place_[static_cast<size_t>(u)].spread_slot);
      }
      const bool in_place = is_input(I) && inputs_[static_cast<size_t>(I.input)].direct;
      const bool reduction = I.op == ExpOp::Input && !is_input(I);
      if (!p.everywhere && !in_place && !reduction && p.output < 0) {
        p.slot = take();
        if (last[i] != end) frees[static_cast<size_t>(std::max(last[i], static_cast<int>(i)))].push_back(p.slot);
      }
      for (int s : frees[i]) free_slots.push_back(s);
    }
  }

  const T* read_input(int k, const Place& p, int64_t r0, int64_t rows, int64_t e0, int64_t len, T* dst) const {
    if (k >= rp_.inputs) return reductions_[static_cast<size_t>(k - rp_.inputs)] + r0;
    const Input& b = inputs_[static_cast<size_t>(k)];
    const int64_t start = p.uniform ? r0 : e0;
    if (b.direct) return b.data + start;
    broadcast_range<T>(b.data, b.bstrides, p.uniform ? row_shape_ : rp_.domain, start, p.uniform ? rows : len, dst);
    return dst;
  }

  // An argument of an instruction: its value, spread along the rows where a varying
  // instruction reads a per-row value (a block of a value the same everywhere serves both).
  const T* arg(int a, bool reader_uniform, const std::vector<const T*>& value, Registers<T>& regs) const {
    if (a < 0) return nullptr;
    const Place& p = place_[static_cast<size_t>(a)];
    if (reader_uniform || !p.uniform || p.everywhere) return value[static_cast<size_t>(a)];
    return regs.blocks[static_cast<size_t>(p.spread_slot)].data();
  }

  void spread(const T* per_row, int64_t rows, T* dst) const {
    for (int64_t r = 0; r < rows; ++r) std::fill_n(dst + r * n_, n_, per_row[r]);
  }

  void reduce(size_t j, int64_t r0, int64_t rows, const std::vector<const T*>& value, Registers<T>& regs) const {
    const ReduceKind kind = rp_.reduction_kinds[j];
    const auto root = static_cast<size_t>(reduction_roots_[j]);
    T* acc = reductions_[j] + r0;
    const T* v = value[root];
    if (place_[root].uniform && !place_[root].everywhere) {
      // A per-row value summed along its row: spread first, so that the sum is the same.
      T* tmp = regs.blocks[static_cast<size_t>(slots_)].data();
      spread(v, rows, tmp);
      v = tmp;
    }
    for (int64_t r = 0; r < rows; ++r) {
      acc[r] = reduce_identity<T>(kind);
      reduce_into<T>(kind, v + (place_[root].everywhere ? 0 : r * n_), n_, acc[r]);
      acc[r] = reduce_finish(kind, acc[r], n_);
    }
  }

  RowProgram rp_;
  int64_t n_;
  Shape row_shape_;
  std::vector<T*> reductions_, outs_;  // this run's
  std::vector<Instr> code_;
  std::vector<int> reduction_roots_, reduce_after_, output_roots_;
  std::vector<Input> inputs_;
  std::vector<Place> place_;
  int slots_ = 0;  // blocks in use at once; one more is scratch for reductions of per-row values
};

}  // namespace kiln::ref
