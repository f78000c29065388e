// Byte-level BPE (pre-tokenization rule, training, exact round trips of any bytes, merges checked
// when loaded, the weights file's copy) and pre-tokenized token files (nanoGPT's flat uint16,
// uint32, llm.c's header; memory-mapped; every bad file a clear error), with training on them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/models/llama.hpp>
#include <kiln/train/bpe.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/dataset.hpp>
#include <kiln/train/token_file.hpp>
#include <kiln/train/trainer.hpp>
#include <kiln/train/weights.hpp>

#include "training_test_util.hpp"

namespace kiln {
namespace {

std::string tmp_path(const std::string& name) { return testing::temp_file_path("bpe", name); }

void expect_error(const std::function<void()>& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

std::string corpus() {
  std::string s;
  const char* words[] = {"the ", "quick ", "brown ", "fox ", "naïve ", "café ", "日本語 ", "it's ",
                         "  ",   "\t",     "123 ",   "4.5 ", "!! ",    "x\ny ", "Zürich "};
  for (int i = 0; i < 3000; ++i) s += words[(i * 7 + i / 5) % 15];
  return s;
}

std::vector<std::string> chunks(const std::string& text) {
  std::vector<std::string> out;
  for (auto [b, e] : BpeModel::pretokenize(text)) out.push_back(text.substr(b, e - b));
  return out;
}

TEST(Bpe, PretokenizationFollowsTheGpt2RuleWithAsciiClasses) {
  EXPECT_EQ(chunks("Hello  world!\n\n x12 3"),
            (std::vector<std::string>{"Hello", " ", " world", "!", "\n\n", " x", "12", " 3"}));
  EXPECT_EQ(chunks("a \t b  "), (std::vector<std::string>{"a", " \t", " b", "  "}));
  EXPECT_EQ(chunks("café"), (std::vector<std::string>{"caf", "é"}));  // bytes >= 0x80 are "other"
  EXPECT_TRUE(chunks("").empty());
}

TEST(Bpe, LearnsMergesAndRoundTripsAnyBytes) {
  const BpeModel m = BpeModel::train(corpus(), 300);
  EXPECT_EQ(m.vocab_size(), 300);
  const std::vector<int32_t> ids = m.encode(corpus());
  EXPECT_LT(ids.size(), corpus().size() / 2);  // it compresses the text it learned on
  EXPECT_EQ(m.decode(ids), corpus());
  std::string bytes;  // arbitrary bytes, invalid UTF-8 included
  for (int i = 0; i < 5000; ++i) bytes += static_cast<char>((i * 2654435761u) >> 13);
  EXPECT_EQ(m.decode(m.encode(bytes)), bytes);
  EXPECT_EQ(m.token_bytes(m.encode("the")[0]), "the");  // a frequent word is one token
  EXPECT_EQ(BpeModel::from_merges(m.merges()).encode(corpus()), ids);
  expect_error([&] { m.decode({300}); }, "id 300 is outside the bpe vocabulary [0, 300)");
  expect_error([] { BpeModel::from_merges({{97, 98}, {256, 258}}); }, "merge 1 joins tokens 256 and 258");
  expect_error([] { BpeModel::from_merges({{97, 98}, {97, 98}}); }, "repeats an earlier merge");
  expect_error([] { BpeModel::train("abc", 100); }, "must lie in [256, 2^20]");
}

TEST(Bpe, StoredInTheWeightsFile) {
  const Tokenizer tok = Tokenizer::bpe(BpeModel::train(corpus(), 280));
  models::LlamaConfig c;
  c.vocab_size = tok.vocab_size(), c.block_size = 8, c.n_layer = 1, c.n_head = 2, c.n_kv_head = 1, c.n_embd = 8;
  models::Llama model(c);
  const std::string path = tmp_path("w.h5");
  save_weights(path, model, &tok);
  const std::optional<Tokenizer> back = load_tokenizer(path);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->kind(), Tokenizer::Kind::Bpe);
  EXPECT_EQ(back->encode(corpus()), tok.encode(corpus()));
  std::filesystem::remove(path);
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<unsigned char> le(const std::vector<uint32_t>& values, size_t width) {
  std::vector<unsigned char> out;
  for (uint32_t v : values)
    for (size_t k = 0; k < width; ++k) out.push_back(static_cast<unsigned char>(v >> (8 * k)));
  return out;
}

TEST(TokenFiles, FlatUint16Uint32AndLlmcHeaderAreRead) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 100; ++i) ids.push_back((i * 37) % 50);
  const std::string p16 = tmp_path("t16.bin"), p32 = tmp_path("t32.bin"), pllmc = tmp_path("llmc.bin");
  write_bytes(p16, le(ids, 2));
  write_bytes(p32, le(ids, 4));
  std::vector<uint32_t> header(256, 0);
  header[0] = 20240520, header[1] = 2, header[2] = 100;
  std::vector<unsigned char> llmc = le(header, 4), body = le(ids, 4);
  llmc.insert(llmc.end(), body.begin(), body.end());
  write_bytes(pllmc, llmc);
  for (auto [path, dtype] : {std::pair{p16, TokenDType::U16}, std::pair{p32, TokenDType::U32},
                             std::pair{pllmc, TokenDType::U16}}) {  // the header overrides the dtype
    auto f = TokenFile::open(path, dtype);
    ASSERT_EQ(f->size(), 100u) << path;
    std::vector<int32_t> got(100);
    f->copy(0, 100, got.data(), 50);
    EXPECT_EQ(std::vector<uint32_t>(got.begin(), got.end()), ids) << path;
    expect_error([&] { f->copy(0, 100, got.data(), 40); }, "token 4 is 48, outside the model's vocabulary [0, 40)");
  }
  // The same tokens give the same batches from a file as from memory.
  TextDataset from_file(TokenFile::open(p16), 50, 7);
  TextDataset in_memory(std::vector<int32_t>(ids.begin(), ids.end()), 7);
  EXPECT_EQ(from_file.train_batch(3, 2, 8).x.to_vector(), in_memory.train_batch(3, 2, 8).x.to_vector());
  EXPECT_EQ(from_file.val_batch(0, 1, 4).y.to_vector(), in_memory.val_batch(0, 1, 4).y.to_vector());
  // Bad files: odd sizes, a header that disagrees, empty, missing.
  write_bytes(p16, {1, 2, 3});
  expect_error([&] { TokenFile::open(p16); }, "3 bytes are no whole number of 2-byte tokens");
  header[2] = 99;
  llmc = le(header, 4);
  llmc.insert(llmc.end(), body.begin(), body.end());
  write_bytes(pllmc, llmc);
  expect_error([&] { TokenFile::open(pllmc); }, "its llm.c header says 99 tokens");
  write_bytes(p32, {});
  expect_error([&] { TokenFile::open(p32); }, "is empty");
  expect_error([&] { TokenFile::open(tmp_path("missing.bin")); }, "cannot open it");
  for (const auto& p : {p16, p32, pllmc}) std::filesystem::remove(p);
}

// A model trains on a token file with no tokenizer, and resumes from a checkpoint without one.
TEST(TokenFiles, TrainingOnTokensCheckpointsWithoutATokenizer) {
  const Tokenizer tok = Tokenizer::bpe(BpeModel::train(corpus(), 300));
  std::vector<uint32_t> ids;
  for (int32_t id : tok.encode(corpus())) ids.push_back(static_cast<uint32_t>(id));
  const std::string path = tmp_path("train.bin"), ckpt = tmp_path("ckpt.h5");
  write_bytes(path, le(ids, 2));
  TextDataset data(TokenFile::open(path), tok.vocab_size(), 3);
  models::LlamaConfig c;
  c.vocab_size = tok.vocab_size(), c.block_size = 8, c.n_layer = 1, c.n_head = 2, c.n_kv_head = 1, c.n_embd = 16;
  manual_seed(3);
  models::Llama model(c);
  TrainOptions o;
  o.batch = 4, o.steps = 40, o.lr = 1e-2, o.warmup = 2, o.eval_interval = 0, o.eval_batches = 2, o.log_interval = 1000;
  o.checkpoint = ckpt, o.checkpoint_interval = 0;
  Trainer t(model, data, 3, o);
  const TrainResult r = t.run();
  EXPECT_LT(r.losses.back(), 0.7 * r.losses.front());
  EXPECT_FALSE(read_checkpoint_tokenizer_if_any(ckpt).has_value());
  std::unique_ptr<models::CausalLM> again = read_checkpoint_model(ckpt);
  optim::AdamW opt(again->parameters(), {});
  EXPECT_EQ(load_checkpoint(ckpt, *again, opt).step, 40);
  for (const auto& p : {path, ckpt}) std::filesystem::remove(p);
}

}  // namespace
}  // namespace kiln
