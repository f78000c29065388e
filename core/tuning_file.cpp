// The tuning cache file (core/tuning.hpp): where it lies (the user's and the shipped one), its
// JSON format, validated reading and atomic writing, and the cached choices a run loads from it.
#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/core/tuning.hpp>
#include <kiln/version.hpp>

namespace kiln {

namespace fs = std::filesystem;

std::string tuning_file_name(const std::string& identity) {
  std::string name;
  for (const char c : identity) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_';
    if (keep)
      name += c;
    else if (!name.empty() && name.back() != '-')
      name += '-';
  }
  while (!name.empty() && name.back() == '-') name.pop_back();
  return (name.empty() ? "device" : name) + ".json";
}

std::string user_tuning_path(const std::string& identity) {
  const std::string dir = settings().cache_dir;
  if (dir.empty() || dir == "off") return "";
  return dir + "/tuning/" + tuning_file_name(identity);
}

std::string shipped_tuning_path(const std::string& identity, const std::string& shipped_dir) {
  return (shipped_dir.empty() ? std::string(KILN_SHIPPED_TUNING_DIR) : shipped_dir) + "/" + tuning_file_name(identity);
}

KernelChoices TuningFile::choices() const {
  KernelChoices::Map m;
  for (const TuningEntry& e : entries)
    if (e.kiln_version == version_string) m[e.kernel] = e.choice;
  return KernelChoices(std::move(m));
}

void TuningFile::put(const TuningEntry& e) {
  for (TuningEntry& old : entries)
    if (old.kiln_version == e.kiln_version && old.kernel == e.kernel) {
      old = e;
      return;
    }
  entries.push_back(e);
}

namespace {
constexpr const char* kFormat = "kiln tuning 1";
}

TuningFile read_tuning_file(const std::string& path, const std::string& device) {
  TuningFile file;
  file.device = device;
  std::error_code ec;
  if (!fs::exists(path, ec)) return file;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("tuning file " + path + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  auto bad = [&](const std::string& what) {
    return Error("tuning file " + path + ": " + what + " (kiln tune --clear removes it)");
  };
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("not valid JSON: ") + e.what());
  }
  auto string_at = [](const nlohmann::json& object, const char* key) -> const std::string* {
    if (!object.is_object() || !object.contains(key) || !object[key].is_string()) return nullptr;
    return object[key].get_ptr<const std::string*>();
  };
  const std::string* format = string_at(doc, "format");
  if (!format || *format != kFormat)
    throw bad(std::string("not a kiln tuning file (expected \"format\": \"") + kFormat + "\")");
  const std::string* dev = string_at(doc, "device");
  if (!dev) throw bad("no \"device\" string");
  if (*dev != device) throw bad("made for another device: \"" + *dev + "\", this one is \"" + device + "\"");
  if (!doc.contains("entries") || !doc["entries"].is_array()) throw bad("no \"entries\" array");
  const nlohmann::json& entries = doc["entries"];
  for (size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& e = entries[i];
    const std::string where = "entry " + std::to_string(i);
    auto text_field = [&](const char* key) {
      const std::string* v = string_at(e, key);
      if (!v) throw bad(where + ": no \"" + key + "\" string");
      return *v;
    };
    auto number_field = [&](const char* key) {
      if (!e.is_object() || !e.contains(key) || !e[key].is_number() || e[key].get<double>() < 0)
        throw bad(where + ": no \"" + key + "\" number (0 or more)");
      return e[key].get<double>();
    };
    TuningEntry t;
    t.kiln_version = text_field("kiln");
    t.kernel = text_field("kernel");
    try {
      t.choice = KernelChoice::parse(text_field("choice"));
    } catch (const Error& err) {
      throw bad(where + ": " + err.what());
    }
    t.default_ms = number_field("default_ms");
    t.chosen_ms = number_field("chosen_ms");
    const double candidates = number_field("candidates");
    if (candidates != std::floor(candidates) || candidates > 1e6)
      throw bad(where + ": \"candidates\" must be a whole number up to 1000000");
    t.candidates = static_cast<int>(candidates);
    file.put(t);
  }
  return file;
}

void write_tuning_file(const std::string& path, const TuningFile& file) {
  auto quote = [](const std::string& s) { return nlohmann::json(s).dump(); };
  std::string text =
      "{\n  \"format\": " + quote(kFormat) + ",\n  \"device\": " + quote(file.device) + ",\n  \"entries\": [";
  for (size_t i = 0; i < file.entries.size(); ++i) {
    const TuningEntry& e = file.entries[i];
    text += fmt::format(
        "{}\n    {{\"kiln\": {}, \"kernel\": {}, \"choice\": {}, \"default_ms\": {:.4f}, \"chosen_ms\": {:.4f}, "
        "\"candidates\": {}}}",
        i ? "," : "", quote(e.kiln_version), quote(e.kernel), quote(e.choice.str()), e.default_ms, e.chosen_ms,
        e.candidates);
  }
  text += "\n  ]\n}\n";
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      throw Error("tuning file " + path + ": cannot write " + tmp);
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error("tuning file " + path + ": cannot replace it (" + ec.message() + ")");
  }
}

std::string record_tuning(const std::string& identity, const std::vector<TuningEntry>& entries) {
  const std::string path = user_tuning_path(identity);
  if (path.empty()) return "";
  TuningFile file = read_tuning_file(path, identity);
  for (const TuningEntry& e : entries) file.put(e);
  write_tuning_file(path, file);
  return path;
}

KernelChoices load_tuned_choices(const std::string& identity, std::string* from, const std::string& shipped_dir) {
  std::error_code ec;
  for (const std::string& path : {user_tuning_path(identity), shipped_tuning_path(identity, shipped_dir)})
    if (!path.empty() && fs::exists(path, ec)) {
      if (from) *from = path;
      return read_tuning_file(path, identity).choices();
    }
  if (from) from->clear();
  return {};
}

KernelChoices without_overridden(const KernelChoices& choices, bool threads_fixed, bool matmul_fixed) {
  if (!threads_fixed && !matmul_fixed) return choices;
  KernelChoices::Map m;
  for (auto [kernel, choice] : choices.entries()) {
    if (threads_fixed) choice.threads = 0;
    if (matmul_fixed) choice.matmul.clear();
    m.emplace(kernel, choice);  // kept as tuned, even where the default is left
  }
  return KernelChoices(std::move(m));
}

}  // namespace kiln
