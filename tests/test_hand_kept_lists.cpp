// The hand-kept lists of Prims checked against the registry: the families' comments in
// circuit/prims/families.hpp and cuda/lower/families.hpp, and the Builder's typed methods in
// circuit/prims/builder.hpp. A Prim added without its entries fails here.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <kiln/circuit/ir/prim.hpp>

namespace kiln {
namespace {

// The lines of a source file (a path from the repository's root).
std::vector<std::string> source_lines(const std::string& file) {
  const std::filesystem::path path = std::filesystem::path(__FILE__).parent_path().parent_path() / file;
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// One Prim of a family list: "void register_NAME<suffix>(...);  // prim, prim (what makes it), ...".
struct ListedPrim {
  std::string family_file;  // NAME.cpp: the family's source file
  std::string name;
  bool made_otherwise = false;  // a parenthesis after the name: no Builder method records it
};

std::vector<ListedPrim> family_list(const std::string& header, const std::string& suffix) {
  const std::regex line("^void register_(\\w+)" + suffix + "\\([A-Za-z]+& [a-z]\\);\\s*// (.*)$");
  std::vector<ListedPrim> listed;
  for (const std::string& text : source_lines(header)) {
    std::smatch m;
    if (!std::regex_match(text, m, line)) continue;
    std::stringstream items(m[2].str());
    for (std::string item; std::getline(items, item, ',');) {
      std::stringstream words(item);
      ListedPrim p{m[1].str() + ".cpp", "", false};
      std::string rest;
      words >> p.name >> rest;
      p.made_otherwise = !rest.empty() && rest[0] == '(';
      listed.push_back(p);
    }
  }
  return listed;
}

// Each family list names its family's Prims (a Prim's family is the file that registered it).
TEST(HandKeptLists, FamilyListsNameEachFamilysPrims) {
  std::map<std::string, std::set<std::string>> registered;  // family file -> its Prims
  for (const PrimDef* p : PrimRegistry::instance().all())
    if (p->id != PrimId::user) registered[p->family].insert(p->name);
  for (const auto& [header, suffix] : {std::pair{"circuit/prims/families.hpp", std::string()},
                                       std::pair{"cuda/lower/families.hpp", std::string("_lowering")}}) {
    std::map<std::string, std::set<std::string>> listed;
    for (const ListedPrim& p : family_list(header, suffix)) listed[p.family_file].insert(p.name);
    EXPECT_EQ(listed, registered) << header;
  }
}

// The Builder's typed methods are the list through which VJP rules, composites and core's Tensor
// record kiln's Prims: every registered Prim has a method of its name, except those that
// circuit/prims/families.hpp says something else makes (a fusion pass, a VJP, the data-parallel
// trainer).
TEST(HandKeptLists, EveryRecordedPrimHasABuilderMethod) {
  std::set<std::string> made_otherwise;
  for (const ListedPrim& p : family_list("circuit/prims/families.hpp", ""))
    if (p.made_otherwise) made_otherwise.insert(p.name);
  ASSERT_FALSE(made_otherwise.empty());
  std::set<std::string> methods;
  const std::regex method(R"(^  (?:ValueId|std::vector<ValueId>) (\w+)\(.*)");
  for (const std::string& line : source_lines("circuit/prims/builder.hpp")) {
    std::smatch m;
    if (std::regex_match(line, m, method)) methods.insert(m[1].str());
  }
  ASSERT_TRUE(methods.count("matmul")) << "no Builder method parsed from circuit/prims/builder.hpp";
  for (const PrimDef* p : PrimRegistry::instance().all()) {
    if (p->id == PrimId::user) continue;  // recorded through core/user_prim.hpp
    EXPECT_NE(methods.count(p->name) + made_otherwise.count(p->name), 0u)
        << "Prim '" << p->name << "' has no Builder method and circuit/prims/families.hpp does not say what makes it";
    EXPECT_FALSE(methods.count(p->name) && made_otherwise.count(p->name))
        << "Prim '" << p->name << "' has a Builder method, but circuit/prims/families.hpp says something else makes it";
  }
}

}  // namespace
}  // namespace kiln
