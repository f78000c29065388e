// Hugging Face byte-level BPE tokenizers (tokenizer.json), pre-tokenized with PCRE2.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/hf_tokenizer.hpp>
#include <kiln/train/json_text.hpp>
#include <kiln/train/tokenizer.hpp>

namespace kiln {

using Json = nlohmann::json;  // (the class has a json() of its own)

namespace {

// GPT-2's pre-tokenization, which tokenizers' ByteLevel pre-tokenizer applies with use_regex.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others for 256 + n in
// byte order. Returns the byte -> code point table.
const std::vector<int32_t>& byte_characters() {
  static const std::vector<int32_t> table = [] {
    std::vector<int32_t> t(256, -1);
    auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
    int32_t next = 256;
    for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = printable(b) ? b : next++;
    return t;
  }();
  return table;
}

// A vocabulary entry's characters back to its bytes; false where a character is no byte's.
bool entry_bytes(const std::string& entry, std::string& out) {
  static const std::unordered_map<int32_t, char> back = [] {
    std::unordered_map<int32_t, char> m;
    for (int b = 0; b < 256; ++b) m[byte_characters()[static_cast<size_t>(b)]] = static_cast<char>(b);
    return m;
  }();
  out.clear();
  std::vector<int32_t> cps;
  try {
    cps = utf8_decode(entry);
  } catch (const Error&) {
    return false;
  }
  for (int32_t cp : cps) {
    auto it = back.find(cp);
    if (it == back.end()) return false;
    out += it->second;
  }
  return true;
}

std::string bytes_as_entry(const std::string& bytes) {
  std::vector<int32_t> cps;
  cps.reserve(bytes.size());
  for (unsigned char b : bytes) cps.push_back(byte_characters()[b]);
  return utf8_encode(cps);
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct HfBpeTokenizer::Pattern {
  pcre2_code* code = nullptr;
  std::string text;
  ~Pattern() {
    if (code) pcre2_code_free(code);
  }
};

namespace {
// A JSON value in an error message: scalars as written (cut at 80 characters), containers by kind.
std::string brief(const Json& j) {
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  std::string s = j.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}
}  // namespace

HfBpeTokenizer::~HfBpeTokenizer() = default;

bool HfBpeTokenizer::is_byte_level_bpe_unchecked(const std::string& json_text) {
  require_json_depth(json_text, "tokenizer.json");
  const Json doc = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object()) return false;
  if (doc["model"].value("type", "") != "BPE") return false;
  auto byte_level = [](const Json& j) { return j.is_object() && j.value("type", "") == "ByteLevel"; };
  if (doc.contains("decoder") && byte_level(doc["decoder"])) return true;
  if (!doc.contains("pre_tokenizer")) return false;
  const Json& pre = doc["pre_tokenizer"];
  if (byte_level(pre)) return true;
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
      pre["pretokenizers"].is_array())
    for (const Json& p : pre["pretokenizers"])
      if (byte_level(p)) return true;
  return false;
}

namespace {
// A setting of a tokenizer.json that kiln does not run, and why: for the file `source`.
UnsupportedTokenizer refuse(const std::string& source, const std::string& setting, const std::string& why) {
  return UnsupportedTokenizer(source + ": " + setting + " is not supported: " + why);
}

// An absent setting.
const Json& none() {
  static const Json j;
  return j;
}

// Refuses the model settings kiln does not run: another model type, a normalizer, dropout, byte
// fallback, subword affixes.
void check_model(const Json& doc, const Json& model, const std::string& source) {
  if (model.value("type", "") != "BPE")
    throw refuse(source, "model type '" + model.value("type", "?") + "'", "kiln reads BPE models");
  if (doc.contains("normalizer") && !doc["normalizer"].is_null())
    throw refuse(source, "a normalizer (" + doc["normalizer"].value("type", "?") + ")",
                 "byte-level BPE tokenizers have none");
  if (model.contains("dropout") && !model["dropout"].is_null())
    throw refuse(source, "BPE dropout", "kiln encodes deterministically");
  if (model.value("byte_fallback", false)) throw refuse(source, "byte_fallback", "byte-level BPE covers every byte");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(affix) && model[affix].is_string() && !model[affix].get<std::string>().empty())
      throw refuse(source, std::string(affix), "byte-level BPE uses none");
}
}  // namespace

// The phases of from_json_unchecked, in its order, reading the parsed file `doc` (its BPE
// model: `model`) into `t`; errors name the file `source`.
struct HfBpeTokenizer::Loader {
  Json& doc;
  const Json& model;
  const std::string& source;
  HfBpeTokenizer& t;

  UnsupportedTokenizer refuse(const std::string& setting, const std::string& why) const {
    return kiln::refuse(source, setting, why);
  }
  // The vocabulary's (id, entry) pairs, ids checked to be non-negative int32s.
  std::vector<std::pair<int64_t, std::string>> vocab_entries() const;
  // The added tokens (those that strip or match single words refused), in the file's order.
  std::vector<Added> added_tokens() const;
  // Sets t's pieces_, ids_ and byte_ids_ from the vocabulary and the added tokens (an added
  // token's id takes its text); returns the vocabulary size (the largest id + 1).
  int64_t fill_vocabulary(const std::vector<std::pair<int64_t, std::string>>& entries,
                          const std::vector<Added>& added) const;
  // Reads the merges into t.merges_ (rank: the position; a repeated merge keeps its last).
  void read_merges() const;
  // Reads the pre-tokenizer (sets t.add_prefix_space_); returns its pattern ("" for none).
  std::string pre_tokenizer_pattern() const;
  // Compiles `pattern` with PCRE2 into t.pattern_ (JIT where available).
  void compile_pattern(const std::string& pattern) const;
  // Reads the post-processor's special tokens into t.prefix_ and t.suffix_ (ids below `size`).
  void read_post_processor(int64_t size) const;
};

std::vector<std::pair<int64_t, std::string>> HfBpeTokenizer::Loader::vocab_entries() const {
  // The vocabulary: entries are byte characters; ids may leave gaps (filled by added tokens).
  if (!model.contains("vocab") || !model["vocab"].is_object())
    throw Error(source + ": the BPE model has no vocab object");
  std::vector<std::pair<int64_t, std::string>> entries;
  for (const auto& [entry, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= std::numeric_limits<int32_t>::max())
      throw Error(source + ": vocab entry '" + entry + "' has id " + brief(id) + ", not a non-negative int32");
    entries.emplace_back(id.get<int64_t>(), entry);
  }
  return entries;
}

std::vector<HfBpeTokenizer::Added> HfBpeTokenizer::Loader::added_tokens() const {
  // Added tokens: their text is taken as it is (not byte characters).
  std::vector<Added> added;
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    for (const Json& a : doc["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        throw Error(source + ": an added token without an integer id and a content string: " +
                    brief(a.value("content", Json())));
      const std::string content = a["content"].get<std::string>();
      for (const char* flag : {"single_word", "lstrip", "rstrip"})
        if (a.value(flag, false))
          throw refuse("added token '" + content + "' with " + flag, "kiln matches added tokens exactly");
      if (content.empty()) throw Error(source + ": an added token with empty content");
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= std::numeric_limits<int32_t>::max())
        throw Error(source + ": added token '" + content + "' has id " + std::to_string(id));
      added.push_back({content, static_cast<int32_t>(id)});
    }
  }
  return added;
}

int64_t HfBpeTokenizer::Loader::fill_vocabulary(const std::vector<std::pair<int64_t, std::string>>& entries,
                                                const std::vector<Added>& added) const {
  int64_t size = 0;
  for (const auto& [id, entry] : entries) size = std::max(size, id + 1);
  for (const Added& a : added) size = std::max<int64_t>(size, a.id + 1);
  const int64_t defined = static_cast<int64_t>(entries.size() + added.size());
  if (size > defined + 65536)
    throw Error(source + ": ids run up to " + std::to_string(size - 1) + " for " + std::to_string(defined) +
                " tokens: the vocabulary leaves more than 65536 ids undefined");
  t.pieces_.assign(static_cast<size_t>(size), "");
  std::vector<bool> taken(static_cast<size_t>(size), false);
  for (const Added& a : added) {
    t.pieces_[static_cast<size_t>(a.id)] = a.content;
    taken[static_cast<size_t>(a.id)] = true;
  }
  std::string bytes;
  for (const auto& [id, entry] : entries) {
    if (taken[static_cast<size_t>(id)]) continue;  // an added token's own vocab entry (its text)
    if (!entry_bytes(entry, bytes))
      throw Error(source + ": vocab entry '" + entry + "' (id " + std::to_string(id) +
                  ") is not made of byte-level characters: not a byte-level BPE vocabulary");
    t.pieces_[static_cast<size_t>(id)] = bytes;
    taken[static_cast<size_t>(id)] = true;
    t.ids_.emplace(bytes, static_cast<int32_t>(id));
  }
  t.byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = t.ids_.find(std::string(1, static_cast<char>(b)));
    if (it == t.ids_.end())
      throw Error(source + ": the vocabulary lacks byte " + std::to_string(b) + " ('" +
                  bytes_as_entry(std::string(1, static_cast<char>(b))) + "'): not a byte-level BPE vocabulary");
    t.byte_ids_[static_cast<size_t>(b)] = it->second;
  }
  return size;
}

void HfBpeTokenizer::Loader::read_merges() const {
  // Merges: "left right" strings (older files) or [left, right] pairs; rank = position.
  if (!model.contains("merges") || !model["merges"].is_array())
    throw Error(source + ": the BPE model has no merges array");
  int32_t rank = 0;
  for (const Json& m : model["merges"]) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw Error(source + ": merge " + std::to_string(rank) + " '" + s + "' is not two tokens separated by a space");
      left = s.substr(0, space), right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      throw Error(source + ": merge " + std::to_string(rank) + " is " + brief(m) + ", not a pair of tokens");
    }
    std::string lb, rb;
    if (!entry_bytes(left, lb) || !entry_bytes(right, rb))
      throw Error(source + ": merge " + std::to_string(rank) + " (" + left + ", " + right +
                  ") joins tokens that are not byte-level");
    auto l = t.ids_.find(lb), r = t.ids_.find(rb), merged = t.ids_.find(lb + rb);
    if (l == t.ids_.end() || r == t.ids_.end() || merged == t.ids_.end())
      throw Error(source + ": merge " + std::to_string(rank) + " (" + left + ", " + right +
                  ") names a token the vocabulary lacks");
    // A repeated merge keeps its last rank, as tokenizers' map of merges does.
    t.merges_.insert_or_assign(pair_key(l->second, r->second), std::make_pair(rank, merged->second));
    ++rank;
  }
}

std::string HfBpeTokenizer::Loader::pre_tokenizer_pattern() const {
  // The pre-tokenizer: ByteLevel (its own GPT-2 split with use_regex), or a Sequence of one Split
  // (Isolated, not inverted) and a ByteLevel without a regex.
  std::string pattern;
  auto byte_level = [&](const Json& p, bool split_before) {
    if (p.value("use_regex", true)) {
      if (split_before) throw refuse("a Split followed by a ByteLevel with use_regex", "two splits");
      pattern = kGpt2Pattern;
    }
    t.add_prefix_space_ = p.value("add_prefix_space", false);
    // After a Split, ByteLevel would prefix every chunk; kiln prefixes the text once.
    if (split_before && t.add_prefix_space_)
      throw refuse("add_prefix_space after a Split", "kiln prefixes the text once");
  };
  const Json& pre = doc.contains("pre_tokenizer") ? doc["pre_tokenizer"] : none();
  const std::string pre_type = pre.is_object() ? pre.value("type", "") : "";
  if (pre_type == "ByteLevel") {
    byte_level(pre, false);
  } else if (pre_type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
             pre["pretokenizers"].size() == 2 && pre["pretokenizers"][0].value("type", "") == "Split" &&
             pre["pretokenizers"][1].value("type", "") == "ByteLevel") {
    const Json& s = pre["pretokenizers"][0];
    if (s.value("behavior", "") != "Isolated" || s.value("invert", false))
      throw refuse("a Split with behavior " + s.value("behavior", "?") + (s.value("invert", false) ? ", inverted" : ""),
                   "kiln runs Isolated splits");
    if (!s.contains("pattern") || !s["pattern"].is_object() || !s["pattern"].contains("Regex") ||
        !s["pattern"]["Regex"].is_string())
      throw refuse("a Split whose pattern is not a Regex", "kiln runs regular expressions");
    pattern = s["pattern"]["Regex"].get<std::string>();
    byte_level(pre["pretokenizers"][1], true);
  } else {
    throw refuse("pre_tokenizer " + (pre_type.empty() ? brief(pre) : pre_type),
                 "kiln runs ByteLevel, or a Split then a ByteLevel");
  }
  return pattern;
}

void HfBpeTokenizer::Loader::compile_pattern(const std::string& pattern) const {
  t.pattern_ = std::make_unique<Pattern>();
  t.pattern_->text = pattern;
  int code = 0;
  PCRE2_SIZE offset = 0;
  t.pattern_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &code, &offset, nullptr);
  if (!t.pattern_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(code, message, sizeof message);
    throw Error(source + ": the pre-tokenizer pattern '" + pattern + "' cannot run on PCRE2: " +
                reinterpret_cast<const char*>(message) + " at offset " + std::to_string(offset));
  }
  pcre2_jit_compile(t.pattern_->code, PCRE2_JIT_COMPLETE);  // the interpreter serves where JIT is unavailable
}

void HfBpeTokenizer::Loader::read_post_processor(int64_t size) const {
  // The post-processor: none, ByteLevel (offsets only), or a TemplateProcessing whose single
  // template is special tokens around the sequence $A.
  // Llama 3's files wrap them in a Sequence [ByteLevel, TemplateProcessing].
  const Json* post = doc.contains("post_processor") ? &doc["post_processor"] : &none();
  if (post->is_object() && post->value("type", "") == "Sequence" && post->contains("processors") &&
      (*post)["processors"].is_array()) {
    const Json* template_processing = nullptr;
    for (const Json& p : (*post)["processors"]) {
      const std::string type = p.is_object() ? p.value("type", "") : "";
      if (type == "TemplateProcessing" && !template_processing)
        template_processing = &p;
      else if (type != "ByteLevel")
        throw refuse("post_processor Sequence with " + (type.empty() ? brief(p) : type),
                     "kiln runs ByteLevel and one TemplateProcessing");
    }
    post = template_processing ? template_processing : &none();
  }
  const std::string post_type = post->is_object() ? post->value("type", "") : "";
  if (post_type == "TemplateProcessing") {
    if (!post->contains("single") || !(*post)["single"].is_array())
      throw Error(source + ": a TemplateProcessing without a single template");
    bool seen_sequence = false;
    for (const Json& piece : (*post)["single"]) {
      if (piece.contains("Sequence")) {
        if (seen_sequence) throw refuse("a single template with two sequences", "one text is one sequence");
        seen_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken") || !piece["SpecialToken"].contains("id"))
        throw refuse("a template piece other than SpecialToken and Sequence", "kiln runs those two");
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      const Json* special = post->contains("special_tokens") && (*post)["special_tokens"].contains(name)
                                ? &(*post)["special_tokens"][name]
                                : nullptr;
      if (!special || !special->contains("ids") || !(*special)["ids"].is_array())
        throw Error(source + ": the template's special token '" + name + "' has no ids");
      for (const Json& id : (*special)["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= size)
          throw Error(source + ": the template's special token '" + name + "' has id " + brief(id) +
                      " outside the vocabulary");
        (seen_sequence ? t.suffix_ : t.prefix_).push_back(id.get<int32_t>());
      }
    }
    if (!seen_sequence) throw refuse("a single template without $A", "the text must appear in it");
  } else if (!post->is_null() && post_type != "ByteLevel") {
    throw refuse("post_processor " + post_type, "kiln runs TemplateProcessing and ByteLevel");
  }
}

std::shared_ptr<const HfBpeTokenizer> HfBpeTokenizer::from_json_unchecked(const std::string& json_text,
                                                                          const std::string& source) {
  require_json_depth(json_text, source);
  Json doc;
  try {
    doc = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw Error(source + " is not valid JSON (" + e.what() + ")");
  }
  if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object())
    throw Error(source + ": no \"model\" object");
  const Json& model = doc["model"];
  check_model(doc, model, source);

  auto t = std::shared_ptr<HfBpeTokenizer>(new HfBpeTokenizer());
  t->json_ = json_text;
  t->ignore_merges_ = model.value("ignore_merges", false);
  const Loader load{doc, model, source, *t};
  const std::vector<std::pair<int64_t, std::string>> entries = load.vocab_entries();
  std::vector<Added> added = load.added_tokens();
  const int64_t size = load.fill_vocabulary(entries, added);
  load.read_merges();
  std::sort(added.begin(), added.end(),
            [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  t->added_first_byte_.assign(256, false);
  for (const Added& a : added) t->added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
  t->added_ = std::move(added);

  const std::string pattern = load.pre_tokenizer_pattern();
  if (!pattern.empty()) load.compile_pattern(pattern);
  load.read_post_processor(size);
  return t;
}

// A setting of an unexpected JSON type (a number where a string belongs) makes nlohmann throw:
// such a file is no tokenizer of this kind, or a malformed one, named as such.
bool HfBpeTokenizer::is_byte_level_bpe(const std::string& json_text) {
  try {
    return is_byte_level_bpe_unchecked(json_text);
  } catch (const Json::exception&) {
    return false;
  }
}

std::shared_ptr<const HfBpeTokenizer> HfBpeTokenizer::from_json(const std::string& json_text,
                                                                const std::string& source) {
  try {
    return from_json_unchecked(json_text, source);
  } catch (const Json::exception& e) {
    throw Error(source + ": a setting of the wrong type (" + e.what() + ")");
  }
}

std::vector<std::pair<size_t, size_t>> HfBpeTokenizer::split(const std::string& text, size_t begin, size_t end,
                                                             void* match_data) const {
  auto* match = static_cast<pcre2_match_data*>(match_data);
  std::vector<std::pair<size_t, size_t>> out;
  if (!pattern_) {
    if (end > begin) out.emplace_back(begin, end);
    return out;
  }
  // Isolated: each match is a chunk, and so is each stretch between matches (empty matches
  // split nothing).
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap = begin, search = begin;
  while (search < end) {
    const int rc = pcre2_match(pattern_->code, subject, end, search, PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw Error("tokenizer: the pattern '" + pattern_->text + "' failed at byte " + std::to_string(search) + ": " +
                  reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    const size_t s = ov[0], e = ov[1];
    if (s < search || e < s || e > end)  // (\K in a lookaround can report such a match)
      throw Error("tokenizer: the pattern '" + pattern_->text + "' matched backwards at byte " +
                  std::to_string(search));
    if (e == s) {  // step over one character
      search = s + 1;
      while (search < end && (static_cast<unsigned char>(text[search]) & 0xC0) == 0x80) ++search;
      continue;
    }
    if (s > gap) out.emplace_back(gap, s);
    out.emplace_back(s, e);
    gap = search = e;
  }
  if (gap < end) out.emplace_back(gap, end);
  return out;
}

void HfBpeTokenizer::encode_chunk(const std::string& chunk, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto whole = ids_.find(chunk);
    if (whole != ids_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(chunk.size());
  for (unsigned char b : chunk) symbols.push_back(byte_ids_[b]);
  // The lowest-ranked adjacent pair merges first, the leftmost among equals (tokenizers' order).
  while (symbols.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), merged = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merges_.find(pair_key(symbols[i], symbols[i + 1]));
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first, merged = it->second.second, best = i;
      }
    }
    if (merged < 0) break;
    symbols[best] = merged;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

std::vector<int32_t> HfBpeTokenizer::encode(const std::string& text) const {
  utf8_decode(text);  // invalid UTF-8 is an error naming the offset (PCRE2 then skips its own check)
  std::vector<int32_t> out = prefix_;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pattern_ ? pcre2_match_data_create_from_pattern(pattern_->code, nullptr) : nullptr, &pcre2_match_data_free);
  // The added tokens are cut out first; each stretch between them is pre-tokenized alone.
  auto encode_stretch = [&](size_t begin, size_t end) {
    if (begin == end) return;
    std::string piece = text.substr(begin, end - begin);
    if (add_prefix_space_ && piece[0] != ' ') piece.insert(piece.begin(), ' ');
    for (auto [b, e] : split(piece, 0, piece.size(), match.get())) encode_chunk(piece.substr(b, e - b), out);
  };
  size_t stretch = 0, at = 0;
  while (at < text.size()) {
    const Added* hit = nullptr;
    if (added_first_byte_[static_cast<unsigned char>(text[at])]) {
      for (const Added& a : added_) {  // longest first
        if (text.compare(at, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
    }
    if (!hit) {
      ++at;
      continue;
    }
    encode_stretch(stretch, at);
    out.push_back(hit->id);
    at += hit->content.size();
    stretch = at;
  }
  encode_stretch(stretch, text.size());
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::string HfBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw Error("tokenizer: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(vocab_size()) + ")");
    out += pieces_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace kiln
