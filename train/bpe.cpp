// Byte-level BPE: pre-tokenization, training, encoding, and the tokenizer.json export.
#include <algorithm>
#include <cstdio>
#include <map>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/bpe.hpp>

namespace kiln {

namespace {

bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_letter(unsigned char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_other(unsigned char c) { return !is_space(c) && !is_letter(c) && !is_digit(c); }

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// GPT-2's byte-to-character map: printable bytes stand for themselves, the others for U+0100..
std::vector<int32_t> byte_chars() {
  std::vector<int32_t> map(256);
  int32_t next = 256;
  for (int b = 0; b < 256; ++b)
    map[static_cast<size_t>(b)] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE) ? b : next++;
  return map;
}

void append_utf8(std::string& s, int32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A token's bytes as a JSON string of byte-level characters.
std::string json_token(const std::string& bytes, const std::vector<int32_t>& chars) {
  std::string s = "\"";
  for (unsigned char b : bytes) {
    const int32_t cp = chars[b];
    if (cp == '"' || cp == '\\') s += '\\';
    append_utf8(s, cp);
  }
  return s + "\"";
}

}  // namespace

std::vector<std::pair<size_t, size_t>> BpeModel::pretokenize(const std::string& text) {
  std::vector<std::pair<size_t, size_t>> chunks;
  const size_t n = text.size();
  auto at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  for (size_t i = 0; i < n;) {
    size_t end = i;
    // ' ?[class]+' for the three classes, in order.
    for (bool (*cls)(unsigned char) : {is_letter, is_digit, is_other}) {
      size_t j = i + (at(i) == ' ' ? 1 : 0);
      size_t k = j;
      while (k < n && cls(at(k))) ++k;
      if (k > j) {
        end = k;
        break;
      }
    }
    if (end == i) {  // whitespace: 'ws+(?!\S)' leaves the last space to the word after it, else 'ws+'
      size_t k = i;
      while (k < n && is_space(at(k))) ++k;
      end = (k == n || k - i == 1) ? k : k - 1;
    }
    chunks.emplace_back(i, end);
    i = end;
  }
  return chunks;
}

BpeModel BpeModel::from_merges(std::vector<Merge> merges) {
  BpeModel m;
  for (int b = 0; b < 256; ++b) m.bytes_.emplace_back(1, static_cast<char>(b));
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto [a, b] = merges[i];
    const int32_t limit = 256 + static_cast<int32_t>(i);
    if (a < 0 || b < 0 || a >= limit || b >= limit)
      throw Error("bpe tokenizer: merge " + std::to_string(i) + " joins tokens " + std::to_string(a) + " and " +
                  std::to_string(b) + "; it may only join tokens [0, " + std::to_string(limit) + ") made before it");
    if (!m.rank_.emplace(pair_key(a, b), static_cast<int32_t>(i)).second)
      throw Error("bpe tokenizer: merge " + std::to_string(i) + " repeats an earlier merge");
    m.bytes_.push_back(m.bytes_[static_cast<size_t>(a)] + m.bytes_[static_cast<size_t>(b)]);
  }
  m.merges_ = std::move(merges);
  return m;
}

BpeModel BpeModel::train(const std::string& corpus, int64_t vocab_size) {
  if (vocab_size < 256 || vocab_size > (int64_t{1} << 20))
    throw Error("bpe tokenizer: the vocabulary size must lie in [256, 2^20], received " + std::to_string(vocab_size));
  // Distinct chunks with their counts, as token sequences.
  std::map<std::string, int64_t> counts;
  for (auto [b, e] : pretokenize(corpus)) ++counts[corpus.substr(b, e - b)];
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [w, c] : counts) {
    words.emplace_back(w.begin(), w.end());
    for (int32_t& t : words.back()) t = static_cast<unsigned char>(t);
    freq.push_back(c);
  }
  std::vector<Merge> merges;
  while (256 + static_cast<int64_t>(merges.size()) < vocab_size) {
    std::unordered_map<uint64_t, int64_t, PairHash> pairs;
    for (size_t w = 0; w < words.size(); ++w)
      for (size_t i = 0; i + 1 < words[w].size(); ++i) pairs[pair_key(words[w][i], words[w][i + 1])] += freq[w];
    uint64_t best = 0;
    int64_t best_count = 1;  // a pair must occur at least twice
    for (const auto& [k, c] : pairs)
      if (c > best_count || (c == best_count && best_count > 1 && k < best)) best = k, best_count = c;
    if (best_count < 2) break;
    const auto a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xFFFFFFFFu);
    const int32_t id = 256 + static_cast<int32_t>(merges.size());
    merges.emplace_back(a, b);
    for (auto& word : words) {  // left to right, as encoding merges
      std::vector<int32_t> out;
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == a && word[i + 1] == b) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(word[i]);
        }
      }
      word.swap(out);
    }
  }
  return from_merges(std::move(merges));
}

void BpeModel::encode_chunk(const std::string& chunk, std::vector<int32_t>& out) const {
  std::vector<int32_t> t(chunk.begin(), chunk.end());
  for (int32_t& x : t) x = static_cast<unsigned char>(x);
  // Repeatedly join the adjacent pair of lowest merge rank (its leftmost occurrence first).
  while (t.size() > 1) {
    int32_t best_rank = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < t.size(); ++i) {
      auto it = rank_.find(pair_key(t[i], t[i + 1]));
      if (it != rank_.end() && (best_rank < 0 || it->second < best_rank)) best_rank = it->second, best_at = i;
    }
    if (best_rank < 0) break;
    t[best_at] = 256 + best_rank;
    t.erase(t.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  out.insert(out.end(), t.begin(), t.end());
}

std::vector<int32_t> BpeModel::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 2);
  std::unordered_map<std::string, std::vector<int32_t>> cache;  // chunks repeat: encode each once
  for (auto [b, e] : pretokenize(text)) {
    std::string chunk = text.substr(b, e - b);
    auto it = cache.find(chunk);
    if (it == cache.end()) {
      std::vector<int32_t> enc;
      encode_chunk(chunk, enc);
      it = cache.emplace(std::move(chunk), std::move(enc)).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  return ids;
}

std::string BpeModel::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw Error("decode: id " + std::to_string(id) + " is outside the bpe vocabulary [0, " +
                  std::to_string(vocab_size()) + ")");
    s += bytes_[static_cast<size_t>(id)];
  }
  return s;
}

std::string BpeModel::hf_tokenizer_json() const {
  const std::vector<int32_t> chars = byte_chars();
  // The pattern of pretokenize(), as a JSON string (backslashes doubled).
  const std::string ws = "\\\\t\\\\n\\\\x0B\\\\f\\\\r ";
  const std::string pattern =
      " ?[A-Za-z]+| ?[0-9]+| ?[^" + ws + "A-Za-z0-9]+|[" + ws + "]+(?![^" + ws + "])|[" + ws + "]+";
  const std::string byte_level =
      R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false})";
  std::string j =
      "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [],\n";
  j += "  \"normalizer\": null,\n";
  j += "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
       "{\"Regex\": \"" +
       pattern + "\"}, \"behavior\": \"Isolated\", \"invert\": false}, " + byte_level + "]},\n";
  j += "  \"post_processor\": null,\n  \"decoder\": " + byte_level + ",\n";
  j += "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
       "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n";
  j += "    \"vocab\": {";
  for (size_t id = 0; id < bytes_.size(); ++id)
    j += (id ? ", " : "") + json_token(bytes_[id], chars) + ": " + std::to_string(id);
  j += "},\n    \"merges\": [";
  for (size_t i = 0; i < merges_.size(); ++i)
    j += std::string(i ? ", " : "") + "[" + json_token(bytes_[static_cast<size_t>(merges_[i].first)], chars) + ", " +
         json_token(bytes_[static_cast<size_t>(merges_[i].second)], chars) + "]";
  j += "]\n  }\n}\n";
  return j;
}

}  // namespace kiln
