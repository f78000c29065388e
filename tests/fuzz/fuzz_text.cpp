// Fuzz target: a corpus file through the text loader, as `kiln train --data` takes it: read,
// tokenized at the character level, split, and a batch drawn from each split.
#include <kiln/train/dataset.hpp>
#include <kiln/train/tokenizer.hpp>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const std::string& path = fuzz::input_file(data, size);
  return fuzz::refuse_or_accept([&] {
    const std::string text = read_corpus(path);
    fuzz::require(text.size() == size, "a corpus file is read whole");
    const Tokenizer t = Tokenizer::char_level(text);
    TextDataset d(t.encode(text), 7);
    const Batch b = d.train_batch(0, 2, 4);
    const Batch v = d.val_batch(0, 2, 4);
    for (double id : b.x.to_vector()) fuzz::require(id >= 0 && id < t.vocab_size(), "batch ids in the vocabulary");
    (void)v;
  });
}
