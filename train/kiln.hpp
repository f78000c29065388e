// The umbrella header of kiln's API, installed as <kiln/kiln.hpp>: everything docs/USING.md and
// the examples use. Tensors and the engine, replayed steps (TracedStep), the gradient check,
// devices and distributed set-up, the layers and models, optimizers and schedules, the trainer,
// tokenizers and token files, sampling, weights files, checkpoints, HDF5 data files and batch
// files, metrics logs, the random streams (Philox) and kiln's version. Narrower headers
// (<kiln/core/tensor.hpp>, ...) compile faster.
#pragma once

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/philox.hpp>
#include <kiln/core/device.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/gradcheck.hpp>
#include <kiln/core/prim_catalogue.hpp>
#include <kiln/core/tensor.hpp>
#include <kiln/core/traced_step.hpp>
#include <kiln/core/user_prim.hpp>
#include <kiln/layers/attention.hpp>
#include <kiln/layers/dropout.hpp>
#include <kiln/layers/embedding.hpp>
#include <kiln/layers/gated_mlp.hpp>
#include <kiln/layers/layer_norm.hpp>
#include <kiln/layers/linear.hpp>
#include <kiln/layers/mlp.hpp>
#include <kiln/layers/module.hpp>
#include <kiln/layers/multi_head_attention.hpp>
#include <kiln/layers/rms_norm.hpp>
#include <kiln/models/causal_lm.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/models/llama.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/atomic_file.hpp>
#include <kiln/train/batch_file.hpp>
#include <kiln/train/bpe.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/dataset.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/metrics_log.hpp>
#include <kiln/train/sample.hpp>
#include <kiln/train/schedule.hpp>
#include <kiln/train/sgd.hpp>
#include <kiln/train/token_file.hpp>
#include <kiln/train/tokenizer.hpp>
#include <kiln/train/trainer.hpp>
#include <kiln/train/weights.hpp>
#include <kiln/version.hpp>
