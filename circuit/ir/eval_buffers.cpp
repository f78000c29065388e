// EvalBuffers: planned outputs and the scratch pool of an op's reference.
#include <cstring>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/eval_buffers.hpp>
#include <kiln/circuit/ir/prim.hpp>

namespace kiln {

size_t EvalBuffers::size() const { return infos_.size(); }
const ValueInfo& EvalBuffers::info(size_t k) const { return infos_[k]; }

EvalBuffers::EvalBuffers(const std::vector<ValueInfo>& infos, std::vector<HostTensor> planned, OpState* state,
                         bool poison, const Target* target)
    : infos_(infos), planned_(std::move(planned)), state_(state), poison_(poison), target_(target) {
  planned_.resize(infos_.size());
}

const Target& EvalBuffers::target() const {
  static const Target host = cpu_target();
  return target_ ? *target_ : host;
}

const KernelChoice& EvalBuffers::choice() const { return state_ ? state_->choice : local_.choice; }

HostTensor EvalBuffers::output(size_t k) {
  if (k >= infos_.size())
    throw Error("EvalBuffers: output " + std::to_string(k) + " asked of an op with " + std::to_string(infos_.size()));
  HostTensor t = planned_[k].defined() ? planned_[k] : HostTensor::zeros(infos_[k].dtype, infos_[k].shape);
  if (poison_) poison_bytes(t);
  return t;
}

HostTensor EvalBuffers::zeroed_output(size_t k) {
  HostTensor t = output(k);
  if (t.nbytes()) std::memset(t.raw(), 0, t.nbytes());
  return t;
}

HostTensor EvalBuffers::scratch(DType dtype, const Shape& shape) {
  if (!state_) return HostTensor::zeros(dtype, shape);
  std::vector<HostTensor>& blocks = state_->blocks;
  if (next_scratch_ == blocks.size()) blocks.emplace_back();
  HostTensor& block = blocks[next_scratch_++];
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (!block.defined() || block.nbytes() < bytes)
    block = HostTensor::zeros(DType::f64, Shape{static_cast<int64_t>((bytes + 7) / 8)});
  HostTensor t = HostTensor::view(dtype, shape, block.raw());
  if (poison_) poison_bytes(t);
  return t;
}

void poison_bytes(const HostTensor& t) {
  if (t.nbytes()) std::memset(t.raw(), 0xff, t.nbytes());
}

}  // namespace kiln
