// Kernel choices: their text form and the signatures that key them.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/hash.hpp>
#include <kiln/circuit/ir/kernel_choice.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

namespace {

const char* gemm_name(KernelChoice::Gemm g) {
  switch (g) {
    case KernelChoice::Gemm::eigen:
      return "eigen";
    case KernelChoice::Gemm::onednn:
      return "onednn";
    default:
      return "standard";
  }
}

int parse_int(const std::string& key, const std::string& v, int lo, int hi, const char* what) {
  size_t used = 0;
  int x = 0;
  try {
    x = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < lo || x > hi)
    throw Error("kernel choice " + key + ": expected " + what + ", received '" + v + "'");
  return x;
}

}  // namespace

std::string KernelChoice::str() const {
  std::vector<std::string> items;
  if (gemm != Gemm::standard) items.push_back(std::string("gemm=") + gemm_name(gemm));
  if (threads) items.push_back("threads=" + std::to_string(threads));
  if (attention_rows) items.push_back("attention-rows=" + std::to_string(attention_rows));
  if (row_chunk) items.push_back("row-chunk=" + std::to_string(row_chunk));
  if (!matmul.empty()) items.push_back("matmul=" + matmul);
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out.empty() ? "default" : out;
}

KernelChoice KernelChoice::parse(std::string_view text) {
  KernelChoice c;
  if (text == "default") return c;
  std::vector<std::string> seen;
  std::stringstream items{std::string(text)};
  for (std::string item; std::getline(items, item, ',');) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw Error("kernel choice: expected KEY=VALUE items separated by commas, or 'default', received '" +
                  std::string(text) + "'");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      throw Error("kernel choice: key '" + key + "' given twice in '" + std::string(text) + "'");
    seen.push_back(key);
    if (key == "gemm") {
      if (v == "standard")
        c.gemm = Gemm::standard;
      else if (v == "eigen")
        c.gemm = Gemm::eigen;
      else if (v == "onednn")
        c.gemm = Gemm::onednn;
      else
        throw Error("kernel choice gemm: expected standard, eigen or onednn, received '" + v + "'");
    } else if (key == "threads") {
      c.threads = parse_int(key, v, 1, 4096, "a thread count from 1");
    } else if (key == "attention-rows") {
      c.attention_rows = parse_int(key, v, 1, 1 << 20, "query rows per block, from 1");
    } else if (key == "row-chunk") {
      c.row_chunk = parse_int(key, v, 1, 1 << 20, "rows per chunk, from 1");
    } else if (key == "matmul") {
      c.matmul = v;
      try {
        (void)c.matmul_policy(MatmulPolicy{});
      } catch (const Error& e) {
        throw Error(std::string("kernel choice matmul: ") + e.what());
      }
    } else {
      throw Error("kernel choice: unknown key '" + key +
                  "' (the keys: gemm, threads, attention-rows, row-chunk, matmul)");
    }
  }
  if (seen.empty() || text.back() == ',')
    throw Error("kernel choice: expected KEY=VALUE items separated by commas, or 'default', received '" +
                std::string(text) + "'");
  return c;
}

MatmulPolicy KernelChoice::matmul_policy(const MatmulPolicy& base) const {
  if (matmul.empty()) return base;
  std::string policy = matmul;
  std::replace(policy.begin(), policy.end(), '+', ',');
  return parse_matmul_policy(policy, base);
}

KernelChoices::KernelChoices(Map entries) : map_(std::make_shared<const Map>(std::move(entries))) {}

const KernelChoice* KernelChoices::find(const std::string& signature) const {
  if (!map_) return nullptr;
  const auto it = map_->find(signature);
  return it == map_->end() ? nullptr : &it->second;
}

const KernelChoices::Map& KernelChoices::entries() const {
  static const Map none;
  return map_ ? *map_ : none;
}

std::string KernelChoices::fingerprint() const {
  uint64_t h = 0;
  for (const auto& [signature, choice] : entries()) h = hash_combine(h, fnv1a64(signature + "=" + choice.str()));
  char text[12];
  std::snprintf(text, sizeof text, "%08llx", static_cast<unsigned long long>(h & 0xffffffffULL));
  return text;
}

std::string kernel_signature(const Circuit& c, const Op& op) {
  std::string s = op.prim->name;
  if (op.prim->describe) {
    const std::string d = op.prim->describe(op.params);
    constexpr size_t kShown = 48;  // fused bodies run to hundreds of characters
    if (d.size() <= kShown + 20) {
      s += " " + d;
    } else {
      char hash[24];
      std::snprintf(hash, sizeof hash, "#%016llx", static_cast<unsigned long long>(fnv1a64(d)));
      s += " " + d.substr(0, kShown) + "... " + hash;
    }
  }
  auto values = [&](const std::vector<ValueId>& ids) {
    for (ValueId v : ids) s += std::string(" ") + dtype_name(c.info(v).dtype) + c.info(v).shape.str();
  };
  values(op.inputs);
  s += " ->";
  values(op.outputs);
  return s;
}

}  // namespace kiln
