// Hugging Face tokenizer.json files run by kiln (train/hf_tokenizer): kiln's own BPE exported as
// tokenizer.json runs to the same ids as kiln's BpeModel; settings kiln does not run are refused
// by name; a tokenizer.json tokenizer survives a weights file. tokenizers itself is the oracle in
// scripts/check_hf_models.py (GPT-2's and Llama 3's kinds, special tokens).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/hf_tokenizer.hpp>
#include <kiln/train/tokenizer.hpp>
#include <kiln/train/weights.hpp>

#include "expect_error.hpp"

namespace kiln {
namespace {

const std::string& corpus() {
  static const std::string text = [] {
    std::string t;
    const char* words[] = {"the ", "cat ", "sat ", "on ", "mat. ", "naïve ", "café ", "日本語 ", "x2 ", "1234 ", "!!\n"};
    for (int i = 0; i < 400; ++i) t += words[(i * 7 + i / 3) % 11];
    return t;
  }();
  return text;
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(HfTokenizer, KilnsOwnExportRunsToKilnsIds) {
  const BpeModel bpe = BpeModel::train(corpus(), 300);
  const std::string json = bpe.hf_tokenizer_json();
  ASSERT_TRUE(HfBpeTokenizer::is_byte_level_bpe(json));
  const auto hf = HfBpeTokenizer::from_json(json, "kiln's export");
  EXPECT_EQ(hf->vocab_size(), bpe.vocab_size());
  const std::string text = corpus().substr(100, 900) + "  unseen wörds\t\n\n 42";
  const std::vector<int32_t> ids = hf->encode(text);
  EXPECT_EQ(ids, bpe.encode(text));
  EXPECT_EQ(hf->decode(ids), text);
  expect_error([&] { hf->encode("bad \xff utf-8"); }, {"invalid UTF-8"});
}

TEST(HfTokenizer, SettingsKilnDoesNotRunAreRefusedByName) {
  const std::string json = BpeModel::train(corpus(), 280).hf_tokenizer_json();
  const std::string source = "'tokenizer.json'";
  auto refused = [&](const std::string& text, const std::vector<std::string>& parts) {
    expect_error([&] { HfBpeTokenizer::from_json(text, source); }, parts);
  };
  refused(replaced(json, "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}"), {source, "normalizer (NFC)"});
  refused(replaced(json, "\"type\": \"BPE\"", "\"type\": \"WordPiece\""), {"model type 'WordPiece'"});
  refused(replaced(json, "\"dropout\": null", "\"dropout\": 0.1"), {"BPE dropout"});
  refused(replaced(json, "\"behavior\": \"Isolated\"", "\"behavior\": \"Removed\""), {"behavior Removed"});
  refused(json.substr(0, json.size() / 2), {source, "not valid JSON"});
  refused(replaced(json, "\"use_regex\": false", "\"use_regex\": 1"), {source, "a setting of the wrong type"});
  EXPECT_FALSE(HfBpeTokenizer::is_byte_level_bpe(replaced(json, "\"type\": \"BPE\"", "\"type\": 7")));
  // A pattern PCRE2 cannot compile (a lookbehind of no fixed length) names the pattern.
  const size_t at = json.find("\"Regex\": \"") + 10;
  std::string bad = json;
  bad.insert(at, "(?<=a+)");
  refused(bad, {"the pre-tokenizer pattern '(?<=a+)", "cannot run on PCRE2"});
  // A vocabulary without every byte is no byte-level vocabulary.
  refused(replaced(json, "\"!\": 33", "\"<x>\": 33"), {"lacks byte 33"});
}

TEST(HfTokenizer, ATokenizerJsonTokenizerSurvivesAWeightsFile) {
  const BpeModel bpe = BpeModel::train(corpus(), 300);
  const Tokenizer tok = Tokenizer::hf_bpe(HfBpeTokenizer::from_json(bpe.hf_tokenizer_json(), "export"));
  const std::string path =
      (std::filesystem::temp_directory_path() / ("kiln_hf_tok_" + std::to_string(getpid()) + ".h5")).string();
  models::GPTConfig c;
  c.vocab_size = 320, c.block_size = 4, c.n_layer = 1, c.n_head = 2, c.n_embd = 8;  // a padded vocabulary
  save_weights(path, models::GPT(c), &tok);
  const std::optional<Tokenizer> back = load_tokenizer(path);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind(), Tokenizer::Kind::HfBpe);
  EXPECT_EQ(back->hf_tokenizer_json(), tok.hf_tokenizer_json());
  EXPECT_EQ(back->encode(corpus()), tok.encode(corpus()));
  c.vocab_size = 200;  // fewer ids than the tokenizer emits
  expect_error([&] { save_weights(path, models::GPT(c), &tok); },
               {"ids up to " + std::to_string(tok.vocab_size() - 1), "vocab_size is 200"});
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
