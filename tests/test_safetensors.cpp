// safetensors files: kiln's writer read back by its reader (every float dtype), and hostile
// headers, each refused with an error naming the file and the tensor, never a crash or a read
// out of bounds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/safetensors.hpp>

namespace kiln {
namespace {

std::string tmp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kiln_st_" + std::to_string(getpid()) + "_" + name)).string();
}

// A file of the 8-byte length, `header` and `data` bytes (the length given, or the header's).
std::string file_with(const std::string& name, const std::string& header, size_t data_bytes, int64_t length = -1) {
  const std::string path = tmp_file(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_bytes, '\x01');
  return path;
}

void expect_refused(const std::string& path, const std::vector<std::string>& parts) {
  try {
    SafetensorsFile f(path);
    FAIL() << "accepted " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(Safetensors, WrittenTensorsReadBackInEveryFloatDtype) {
  const std::string path = tmp_file("roundtrip.safetensors");
  HostTensor a = HostTensor::zeros(DType::f32, Shape{2, 3}), b = HostTensor::zeros(DType::f32, Shape{5});
  for (int64_t i = 0; i < a.numel(); ++i) a.set(i, 0.25 * static_cast<double>(i) - 0.5);
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, 1.0 + static_cast<double>(i) / 1024);  // exact in f16, not in bf16
  const std::vector<SafetensorsTensorSpec> specs = {
      {"a32", DType::f32, a.shape()}, {"b16", DType::bf16, b.shape()}, {"h16", DType::f16, b.shape()}, {"s", DType::f32, Shape{}}};
  HostTensor scalar = HostTensor::zeros(DType::f32, Shape{});
  scalar.set(0, 7.5);
  write_safetensors(path, specs, [&](size_t i) { return i == 0 ? a : i == 3 ? scalar : b; }, {{"format", "pt"}});
  SafetensorsFile f(path);
  ASSERT_EQ(f.header().tensors.size(), 4u);
  EXPECT_EQ(f.header().metadata.at("format"), "pt");
  EXPECT_EQ((f.header().data_offset) % 8, 0u);  // the header padded to 8 bytes
  EXPECT_EQ(f.find("b16")->dtype, "BF16");
  EXPECT_EQ(f.find("h16")->dtype, "F16");
  const HostTensor ra = f.read_f32(*f.find("a32")), rb = f.read_f32(*f.find("b16")), rh = f.read_f32(*f.find("h16"));
  ASSERT_EQ(ra.shape(), a.shape());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(ra.get(i), a.get(i));
  for (int64_t i = 0; i < b.numel(); ++i) {
    EXPECT_EQ(rh.get(i), b.get(i));  // f16 holds these exactly
    EXPECT_NEAR(rb.get(i), b.get(i), 1.0 / 128);  // bf16 keeps 8 bits
  }
  EXPECT_EQ(f.read_f32(*f.find("s")).get(0), 7.5);
  std::filesystem::remove(path);
  // f16's edges: the largest half, the smallest subnormal, a value it rounds (1/3 -> 0x3555), negative
  // zero, and what overflows to infinity.
  HostTensor edges = HostTensor::zeros(DType::f32, Shape{6});
  const double in[] = {65504.0, std::ldexp(1.0, -24), 1.0 / 3, -0.0, 70000.0, -1e-9};
  const double out[] = {65504.0, std::ldexp(1.0, -24), 0.333251953125, -0.0, INFINITY, -0.0};
  for (int i = 0; i < 6; ++i) edges.set(i, in[i]);
  write_safetensors(path, {{"h", DType::f16, Shape{6}}}, [&](size_t) { return edges; });
  const HostTensor halves = SafetensorsFile(path).read_f32(*SafetensorsFile(path).find("h"));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(halves.get(i), out[i]) << in[i];
    EXPECT_EQ(std::signbit(halves.get(i)), std::signbit(out[i])) << in[i];
  }
  EXPECT_EQ(f.find("missing"), nullptr);
  std::filesystem::remove(path);
}

TEST(Safetensors, HostileHeadersAreRefusedNamingFileAndTensor) {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  SafetensorsFile(file_with("ok", ok, 8));  // the template the cases below break
  expect_refused(file_with("empty", "", 0), {"not valid JSON"});  // 8 bytes: an empty header
  {
    const std::string path = tmp_file("tiny");
    std::ofstream(path, std::ios::binary) << "abc";
    expect_refused(path, {"shorter than"});
  }
  expect_refused(file_with("past_end", ok, 8, 4000), {"runs past the end"});
  expect_refused(file_with("huge", ok, 8, 200'000'000), {"over the limit"});
  expect_refused(file_with("not_json", "{\"w\":", 8), {"not valid JSON"});
  expect_refused(file_with("array", "[1,2]", 0), {"not a JSON object"});
  // Nesting that would make copying or printing the value recurse deeply.
  expect_refused(file_with("deep", "{\"w\":" + std::string(100, '[') + std::string(100, ']') + "}", 0),
                 {"nested deeper than 64"});
  expect_refused(file_with("twice", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                 {"'w' twice"});
  expect_refused(file_with("dtype", R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
                 {"'w'", "unknown dtype 'F33'"});
  expect_refused(file_with("count", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                 {"'w'", "8 bytes of data", "needs 12"});
  expect_refused(file_with("range", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8),
                 {"'w'", "run past the data section"});
  expect_refused(file_with("reversed", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
                 {"'w'", "end before they begin"});
  expect_refused(file_with("overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                 {"'b'", "overlaps"});
  expect_refused(file_with("gap", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
                 {"'b'", "gap"});
  expect_refused(file_with("uncovered", ok, 12), {"cover 8 bytes", "12"});
  expect_refused(file_with("negative", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                 {"'w'", "non-negative"});
  expect_refused(file_with("overflow", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
                 {"'w'", "too large"});
  expect_refused(file_with("offsets", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
                 {"'w'", "data_offsets"});
  expect_refused(file_with("field", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
                 {"'w'", "unknown field 'x'"});
  expect_refused(file_with("metadata", R"({"__metadata__":{"a":1},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
                 {"__metadata__", "'a'"});
  // A dtype the format has but kiln does not convert: accepted as a file, refused when read.
  SafetensorsFile ints(file_with("ints", R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  try {
    ints.read_f32(*ints.find("w"));
    FAIL() << "read I64 as weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w' is I64"), std::string::npos) << e.what();
  }
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::temp_directory_path()))
    if (entry.path().filename().string().rfind("kiln_st_" + std::to_string(getpid()), 0) == 0)
      std::filesystem::remove(entry.path());
}

}  // namespace
}  // namespace kiln
