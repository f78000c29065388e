// Fuzz target: the tokenizers on arbitrary bytes. The input's first byte picks how the rest
// is used: as a corpus (char vocabulary built from it, then encode/decode round trip), as a
// stored vocabulary of int32 code points (as weights files hold it) with ids to decode, or as
// bytes for the byte tokenizer.
#include <cstring>

#include <kiln/train/tokenizer.hpp>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  return fuzz::refuse_or_accept([&] {
    switch (data[0] % 3) {
      case 0: {  // a corpus: valid UTF-8 round-trips exactly
        const Tokenizer t = Tokenizer::char_level(rest);
        fuzz::require(t.decode(t.encode(rest)) == rest, "char tokenizer round trip");
        break;
      }
      case 1: {  // a stored vocabulary: the first half's int32s, ids from the rest
        auto int32s = [](const char* bytes, size_t n) {
          std::vector<int32_t> v(n);
          if (n > 0) std::memcpy(v.data(), bytes, n * sizeof(int32_t));
          return v;
        };
        const std::vector<int32_t> vocab = int32s(rest.data(), rest.size() / 8);
        const Tokenizer t = Tokenizer::from_vocab(vocab);
        const std::vector<int32_t> ids = int32s(rest.data() + vocab.size() * 4, (rest.size() - vocab.size() * 4) / 4);
        const std::string text = t.decode(ids);
        fuzz::require(t.encode(text) == ids, "decoded ids encode back");
        break;
      }
      default: {  // bytes
        const Tokenizer t = Tokenizer::byte_level();
        fuzz::require(t.decode(t.encode(rest)) == rest, "byte tokenizer round trip");
      }
    }
  });
}
