// `kiln dump`: one forward and backward pass on a given batch, written to HDF5 for comparison
// with other frameworks (logits, loss, and the gradient of every parameter).
#include <cstdio>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/batch_file.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/weights.hpp>

#include "args.hpp"
#include "commands.hpp"

namespace kiln::cli {

int cmd_dump(const std::vector<std::string>& argv) {
  Args a(argv,
         {{"weights", "weights file (required)"},
          {"batch", "HDF5 file with int32 datasets x and y of shape [B, T] (required)"},
          {"out", "HDF5 file to write (required)"},
          {"dtype", "f32 (default) or f64"},
          {"non-strict", kNonStrictHelp}},
         "usage: kiln dump --weights model.h5 --batch batch.h5 --out dump.h5 [--dtype f32|f64] [--non-strict]\n\n"
         "Runs forward and backward once (dropout off, no optimizer step) and writes logits [B, T, V],\n"
         "loss (scalar) and grads/<parameter path> for every parameter, in the weights file's layouts.",
         {"non-strict"});
  if (a.help()) {
    a.print_help();
    return 0;
  }
  std::string dt = a.str("dtype", "f32");
  if (dt != "f32" && dt != "f64") throw Error("--dtype must be f32 or f64, received '" + dt + "'");
  std::string path = a.required("weights");
  std::unique_ptr<models::CausalLM> model_ptr = load_model_as_flagged(path, a);
  models::CausalLM& model = *model_ptr;
  model.eval();
  model.to(dt == "f64" ? DType::f64 : DType::f32);
  const TokenBatch batch = read_batch_file(a.required("batch"), model.block_size(), model.vocab_size());
  Tensor logits = model.forward(Tensor::from_host(batch.x));
  Tensor loss = cross_entropy(logits, Tensor::from_host(batch.y));
  loss.backward();
  Engine::current().realize();
  h5::write_atomically(a.required("out"), [&](h5::File& out) {
    out.write("logits", logits.to_host());
    out.write("loss", loss.to_host());
    for (const auto& [name, p] : model.named_parameters()) out.write("grads/" + dataset_path(name), p.grad().to_host());
  });
  std::printf("loss %.8f; wrote logits, loss and %zu gradients to %s\n", loss.item(), model.named_parameters().size(),
              a.required("out").c_str());
  return 0;
}

}  // namespace kiln::cli
