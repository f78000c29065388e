// Lowering of multi_tensor (circuit/prims/multi_tensor.hpp): one launch over many groups.
//   Each group owns a range of the grid's blocks (enough to cover it, capped; a block-stride
//   loop does the rest). A block finds its group by a branch tree over the ranges' first
//   blocks (log2(groups) compares, uniform across the block), whose leaf loads that group's
//   buffer addresses and sizes into registers; one copy of the body serves every group.
//   Sums: each block writes the partial sum of its share to scratch, then a second launch,
//   one block per group, adds the group's partials (no float atomics: the result does not
//   depend on scheduling). With a total (a gradient norm) there is no second launch: each block
//   counts itself in, and the last one to arrive adds every group's partials (a warp per group,
//   in order) and evaluates the total over the group sums. f32 accumulation: error bound
//   n * 2^-24 * sum |x|, as reduce_all.
// Kernel parameters are limited to 4 KB (PTX ISA 7.8), so the groups are split into chunks of
// at most kMaxAddresses buffer addresses, one launch (two for sums) per chunk.
#include <algorithm>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/multi_tensor.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_u32;
using kir::Space;
using kir::SReg;

namespace {

constexpr uint32_t kThreads = 256;
constexpr size_t kMaxAddresses = 480;  // 3840 of the 4096 parameter bytes

struct GroupRange {
  int g = 0;
  int64_t n = 0;               // elements of the group's domain
  uint32_t blocks = 0;         // blocks of the grid it owns
  uint32_t first_block = 0;    // within its chunk's launch
  uint32_t first_partial = 0;  // sums: its partials' offset in scratch
};

// leaf(k) runs in the blocks with starts[k] <= key < starts[k + 1] (starts ascending).
void branch_tree(KernelBuilder& b, Reg key, const std::vector<uint32_t>& starts, size_t lo, size_t hi,
                 const std::function<void(size_t)>& leaf) {
  if (hi - lo == 1) return leaf(lo);
  const size_t mid = (lo + hi) / 2;
  b.if_(
      b.setp(Cmp::lt, key, imm_u32(starts[mid])), [&] { branch_tree(b, key, starts, lo, mid, leaf); },
      [&] { branch_tree(b, key, starts, mid, hi, leaf); });
}

// How group input j is indexed at element i: at i (it has the domain's shape in every
// group), at 0 (one element in every group), or at i * step with a per-group step register.
enum class Addressing { Element, Scalar, PerGroup };

class MultiTensorLowering {
 public:
  MultiTensorLowering(const Circuit& c, const Op& op, const Target& target)
      : c_(c), op_(op), mp_(MultiTensorProgram::from_params(op.params)) {
    std::vector<ValueInfo> infos;
    for (ValueId in : op.inputs) infos.push_back(c.info(in));
    int64_t largest = 1;
    for (int g = 0; g < mp_.groups; ++g) {
      GroupRange r;
      r.g = g;
      r.n = multi_tensor_domain(mp_, infos, g).numel();
      const int64_t per_block = mp_.sum ? 4 * kThreads : kThreads;
      r.blocks =
          static_cast<uint32_t>(std::clamp<int64_t>((r.n + per_block - 1) / per_block, 1, mp_.sum ? 1024 : 4096));
      r.first_partial = blocks_;  // one partial per block, in group order
      blocks_ += r.blocks;
      groups_.push_back(r);
      largest = std::max(largest, r.n);
    }
    it_ = index_type(target, largest);
    for (int j = 0; j < mp_.group_inputs; ++j) {
      bool element = true, scalar = true;
      for (const GroupRange& r : groups_) {
        const int64_t m = c.info(op.inputs[mp_.input(r.g, j)]).shape.numel();
        element = element && m == r.n;
        scalar = scalar && m == 1;
      }
      addressing_.push_back(element ? Addressing::Element : scalar ? Addressing::Scalar : Addressing::PerGroup);
    }
  }

  LoweredOp lower() {
    size_t read_inputs = 0, read_shared = 0;
    for (int j = 0; j < mp_.group_inputs; ++j) read_inputs += mp_.reads(j) ? 1 : 0;
    for (int k = 0; k < mp_.shared_inputs; ++k) read_shared += mp_.reads(mp_.group_inputs + k) ? 1 : 0;
    const size_t per_group = mp_.sum ? std::max<size_t>(read_inputs, 1) : read_inputs + mp_.bodies.size();
    LoweredOp r;
    std::vector<std::vector<GroupRange>> chunks;
    for (GroupRange g : groups_) {
      if (chunks.empty() || (chunks.back().size() + 1) * per_group + read_shared + 1 > kMaxAddresses)
        chunks.emplace_back();
      g.first_block = chunks.back().empty() ? 0 : chunks.back().back().first_block + chunks.back().back().blocks;
      chunks.back().push_back(g);
    }
    if (mp_.sum) r.scratch_bytes = {static_cast<size_t>(blocks_) * 4};
    if (mp_.has_total) {
      r.scratch_bytes.push_back(4);  // the arrival counter of all chunks' blocks
      r.zeroed_scratch = {1};
    }
    for (const auto& chunk : chunks) {
      r.launches.push_back(elements_launch(chunk));
      if (mp_.sum && !mp_.has_total) r.launches.push_back(sums_launch(chunk));
    }
    r.summary = "multi_tensor: " + std::to_string(mp_.groups) + " groups" + (mp_.sum ? " summed" : "") + " in " +
                std::to_string(r.launches.size()) + " launch(es), first " + launch_text(r.launches.front());
    return r;
  }

 private:
  // Over the chunk's elements: stores every body's value (map), or each block's partial sum.
  Launch elements_launch(const std::vector<GroupRange>& chunk) {
    const std::string name = mp_.sum ? "kiln_multi_tensor_partials" : "kiln_multi_tensor";
    KernelBuilder b(name);
    std::vector<ArgRef> args;
    const Type it = it_;
    const int nin = mp_.group_inputs;
    std::vector<Reg> vals(static_cast<size_t>(nin + mp_.shared_inputs));
    for (int k = 0; k < mp_.shared_inputs; ++k) {
      if (!mp_.reads(nin + k)) continue;
      Reg p = b.param("shared" + std::to_string(k), Type::u64);
      args.push_back({ArgRef::Kind::Input, static_cast<int>(mp_.shared(k))});
      vals[static_cast<size_t>(nin + k)] = load_as_f32(b, DType::f32, p, b.mov(Type::u32, imm_u32(0)));
    }
    Reg partials;
    if (mp_.sum) {
      partials = b.param("partials", Type::u64);
      args.push_back({ArgRef::Kind::Scratch, 0});
    }
    // The group's registers, set by the branch tree's leaf.
    Reg first = b.mov(Type::u32, imm_u32(0)), blocks = b.mov(Type::u32, imm_u32(1));
    Reg partial_base = b.mov(Type::u32, imm_u32(0)), n = b.mov(it, imm_index(it, 0));
    std::vector<Reg> in_ptr(static_cast<size_t>(nin)), step(static_cast<size_t>(nin)), out_ptr;
    for (int j = 0; j < nin; ++j) {
      if (!mp_.reads(j)) continue;
      in_ptr[static_cast<size_t>(j)] = b.mov(Type::u64, kir::imm_u64(0));
      if (addressing_[static_cast<size_t>(j)] == Addressing::PerGroup)
        step[static_cast<size_t>(j)] = b.mov(it, imm_index(it, 0));
    }
    if (!mp_.sum)
      for (size_t o = 0; o < mp_.bodies.size(); ++o) out_ptr.push_back(b.mov(Type::u64, kir::imm_u64(0)));
    Reg bid = b.sreg(SReg::ctaid_x);
    std::vector<uint32_t> starts;
    for (const GroupRange& g : chunk) starts.push_back(g.first_block);
    branch_tree(b, bid, starts, 0, chunk.size(), [&](size_t k) {
      const GroupRange& g = chunk[k];
      b.set(first, imm_u32(g.first_block));
      b.set(blocks, imm_u32(g.blocks));
      b.set(partial_base, imm_u32(g.first_partial));
      b.set(n, imm_index(it, g.n));
      for (int j = 0; j < nin; ++j) {
        if (!mp_.reads(j)) continue;
        const size_t input = mp_.input(g.g, j);
        b.set(in_ptr[static_cast<size_t>(j)], b.param(fmt_name("in", g.g, j), Type::u64));
        args.push_back({ArgRef::Kind::Input, static_cast<int>(input)});
        if (addressing_[static_cast<size_t>(j)] == Addressing::PerGroup)
          b.set(step[static_cast<size_t>(j)], imm_index(it, c_.info(op_.inputs[input]).shape.numel() == 1 ? 0 : 1));
      }
      for (size_t o = 0; o < out_ptr.size(); ++o) {
        b.set(out_ptr[o], b.param(fmt_name("out", g.g, static_cast<int>(o)), Type::u64));
        args.push_back({ArgRef::Kind::Output, static_cast<int>(mp_.output(g.g, static_cast<int>(o)))});
      }
    });
    // Element i = (block - first) * threads + tid, stepping by the group's blocks * threads.
    Reg tid = b.sreg(SReg::tid_x);
    Reg start = b.mad(Type::u32, b.sub(Type::u32, bid, first), imm_u32(kThreads), tid);
    Reg stride = b.mul(Type::u32, blocks, imm_u32(kThreads));
    if (it == Type::u64) {
      start = b.cvt(Type::u64, start);
      stride = b.cvt(Type::u64, stride);
    }
    Reg acc = b.mov(Type::f32, reduce_identity_operand(ReduceKind::Sum));
    b.for_(start, n, stride, [&](Reg i) {
      std::vector<Reg> ops = vals;
      for (int j = 0; j < nin; ++j) {
        if (!mp_.reads(j)) continue;
        Reg at;
        switch (addressing_[static_cast<size_t>(j)]) {
          case Addressing::Element: at = i; break;
          case Addressing::Scalar: at = b.mov(it, imm_index(it, 0)); break;
          case Addressing::PerGroup: at = b.mul(it, i, step[static_cast<size_t>(j)]); break;
        }
        ops[static_cast<size_t>(j)] = load_as_f32(b, DType::f32, in_ptr[static_cast<size_t>(j)], at);
      }
      if (mp_.sum) {
        b.set(acc, reduce_combine(b, ReduceKind::Sum, acc, emit_scalar_exp(b, mp_.bodies[0], ops)));
      } else {
        for (size_t o = 0; o < out_ptr.size(); ++o)
          b.st(Space::global, Type::f32, b.address(out_ptr[o], i, 4), emit_scalar_exp(b, mp_.bodies[o], ops));
      }
    });
    if (mp_.sum)
      block_reduce(b, ReduceKind::Sum, acc, kThreads, [&](Reg v) {
        Reg at = b.add(Type::u32, partial_base, b.sub(Type::u32, bid, first));
        b.st(Space::global, Type::f32, b.address(partials, at, 4), v);
      });
    if (mp_.has_total) {
      Reg counter = b.param("counter", Type::u64), out = b.param("total", Type::u64);
      args.push_back({ArgRef::Kind::Scratch, 1});
      args.push_back({ArgRef::Kind::Output, 0});
      after_last_block(b, counter, blocks_, [&] { finish_total(b, partials, out); });
    }
    const uint32_t grid = chunk.back().first_block + chunk.back().blocks;
    return finish_launch(b, name, {grid, 1, 1}, {kThreads, 1, 1}, std::move(args));
  }

  // In the last block: warp w adds the partials of groups w, w + 8, ... (lanes stride them, then
  // shuffles), into shared memory; thread 0 evaluates the total over the group sums.
  void finish_total(KernelBuilder& b, Reg partials, Reg out) {
    Reg tid = b.sreg(SReg::tid_x);
    Reg lane = b.and_(Type::u32, tid, imm_u32(31)), warp = b.shr(Type::u32, tid, imm_u32(5));
    Reg sums = b.shared_addr(b.shared_array("group_sums", 4 * static_cast<int64_t>(groups_.size()), 4));
    for (const GroupRange& g : groups_) {
      b.if_(b.setp(Cmp::eq, warp, imm_u32(static_cast<uint32_t>(g.g) % (kThreads / 32))), [&] {
        Reg acc = b.mov(Type::f32, reduce_identity_operand(ReduceKind::Sum));
        b.for_(lane, imm_u32(g.blocks), imm_u32(32), [&](Reg j) {
          Reg at = b.add(Type::u32, j, imm_u32(g.first_partial));
          b.set(acc,
                reduce_combine(b, ReduceKind::Sum, acc, b.ld(Space::global, Type::f32, b.address(partials, at, 4))));
        });
        Reg v = warp_reduce(b, ReduceKind::Sum, acc);
        b.if_(b.setp(Cmp::eq, lane, imm_u32(0)),
              [&] { b.st(Space::shared, Type::f32, sums, v, 4 * static_cast<int64_t>(g.g)); });
      });
    }
    b.bar();
    b.if_(b.setp(Cmp::eq, tid, imm_u32(0)), [&] {
      std::vector<Reg> s;
      for (const GroupRange& g : groups_)
        s.push_back(b.ld(Space::shared, Type::f32, sums, 4 * static_cast<int64_t>(g.g)));
      b.st(Space::global, Type::f32, out, emit_scalar_exp(b, mp_.total, s));
    });
  }

  // One block per group of the chunk: the sum of the group's partials, in order of blocks.
  Launch sums_launch(const std::vector<GroupRange>& chunk) {
    KernelBuilder b("kiln_multi_tensor_sums");
    std::vector<ArgRef> args{{ArgRef::Kind::Scratch, 0}};
    Reg partials = b.param("partials", Type::u64);
    Reg first = b.mov(Type::u32, imm_u32(0)), count = b.mov(Type::u32, imm_u32(0));
    Reg out = b.mov(Type::u64, kir::imm_u64(0));
    std::vector<uint32_t> starts;
    for (size_t k = 0; k < chunk.size(); ++k) starts.push_back(static_cast<uint32_t>(k));
    branch_tree(b, b.sreg(SReg::ctaid_x), starts, 0, chunk.size(), [&](size_t k) {
      b.set(first, imm_u32(chunk[k].first_partial));
      b.set(count, imm_u32(chunk[k].blocks));
      b.set(out, b.param(fmt_name("out", chunk[k].g, 0), Type::u64));
      args.push_back({ArgRef::Kind::Output, static_cast<int>(mp_.output(chunk[k].g, 0))});
    });
    Reg acc = b.mov(Type::f32, reduce_identity_operand(ReduceKind::Sum));
    b.for_(b.sreg(SReg::tid_x), count, imm_u32(kThreads), [&](Reg j) {
      Reg v = b.ld(Space::global, Type::f32, b.address(partials, b.add(Type::u32, first, j), 4));
      b.set(acc, reduce_combine(b, ReduceKind::Sum, acc, v));
    });
    block_reduce(b, ReduceKind::Sum, acc, kThreads, [&](Reg v) { b.st(Space::global, Type::f32, out, v); });
    return finish_launch(b, "kiln_multi_tensor_sums", {static_cast<uint32_t>(chunk.size()), 1, 1}, {kThreads, 1, 1},
                         std::move(args));
  }

  static std::string fmt_name(const char* what, int g, int j) {
    return std::string(what) + std::to_string(g) + "_" + std::to_string(j);
  }

  const Circuit& c_;
  const Op& op_;
  MultiTensorProgram mp_;
  std::vector<GroupRange> groups_;
  std::vector<Addressing> addressing_;
  Type it_ = Type::u32;
  uint32_t blocks_ = 0;  // of every group (and chunk) together: the partials of a sum
};

LoweredOp lower_multi_tensor(const Circuit& c, const Op& op, const Target& target) {
  return MultiTensorLowering(c, op, target).lower();
}

}  // namespace

void register_multi_tensor_lowering(LoweringTable& t) {
  t.add(PrimId::multi_tensor, lower_multi_tensor,
        "one launch over every group (block ranges per group); sums: partials");
}

}  // namespace kiln::cuda
