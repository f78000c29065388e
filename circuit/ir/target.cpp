// Target: CPU feature detection, parsing and printing of the user's choices.
#include <sstream>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  bool osxsave = false;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.fma = (c >> 12) & 1;
    osxsave = (c >> 27) & 1;
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.amx_bf16 = (d >> 22) & 1;
  }
  // AMX tiles are usable only where the OS (or the hypervisor) enables their register state:
  // XCR0 bits 17 (tile configuration) and 18 (tile data).
  if (f.amx_bf16) {
    unsigned lo = 0, hi = 0;
    if (osxsave) __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.amx_bf16 = ((lo >> 17) & 3) == 3;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = (a >> 5) & 1;
#endif
  return f;
}

// On a 2-core Xeon with AMX, oneDNN's bf16 products made the bf16 step 0.58x (P2) and 0.85x (P1)
// of the rounded-f32 one (docs/BENCHMARKS.md); on CPUs with AVX512-BF16 alone they are untimed.
CpuBf16Products default_cpu_bf16(const CpuFeatures& cpu, bool have_onednn) {
  return have_onednn && cpu.amx_bf16 ? CpuBf16Products::onednn : CpuBf16Products::rounded_f32;
}

Target cpu_target() {
#if KILN_HAVE_DNNL
  constexpr bool have_onednn = true;
#else
  constexpr bool have_onednn = false;
#endif
  Target t;
  t.cpu = detect_cpu_features();
  t.cpu_bf16 = default_cpu_bf16(t.cpu, have_onednn);
  return t;
}

Target cuda_target(int sm, bool fake) {
  Target t = cpu_target();
  t.kind = Target::Kind::cuda;
  t.sm = sm;
  t.fake = fake;
  return t;
}

Target with_device_of(Target to, const Target& device) {
  to.kind = device.kind;
  to.sm = device.sm;
  to.fake = device.fake;
  to.cpu = device.cpu;
  return to;
}

namespace {

bool on_off(std::string_view key, std::string_view v) {
  if (v == "on") return true;
  if (v == "off") return false;
  throw Error("--matmul " + std::string(key) + ": expected on or off, received '" + std::string(v) + "'");
}

}  // namespace

MatmulPolicy parse_matmul_policy(std::string_view text, MatmulPolicy p) {
  std::stringstream items{std::string(text)};
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw Error("--matmul: expected KEY=VALUE items separated by commas, received '" + item + "'");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    auto bad = [&](const char* expected) {
      return Error("--matmul " + key + ": expected " + expected + ", received '" + v + "'");
    };
    if (key == "simt-tile") {
      if (v != "64" && v != "128") throw bad("64 or 128 (the FFMA kernel's square tile)");
      p.simt_tile = std::stoi(v);
    } else if (key == "bf16-mma") {
      p.bf16_mma = on_off(key, v);
    } else if (key == "tile") {
      p.tile_m = v == "192x256" ? 192 : 128;
      if (v == "auto")
        p.tile_n = MatmulPolicy::kTileAuto;
      else if (v == "waves")
        p.tile_n = MatmulPolicy::kTileWaves;
      else if (v == "128x128" || v == "128x256" || v == "192x256")
        p.tile_n = v == "128x128" ? 128 : 256;
      else
        throw bad("128x128, 128x256, 192x256, auto or waves (the tensor-core kernel's block tile)");
    } else if (key == "stages") {
      if (v != "2" && v != "3" && v != "4") throw bad("2, 3 or 4 (cp.async stages)");
      p.stages = std::stoi(v);
    } else if (key == "split-k") {
      if (v == "auto")
        p.split_k = -1;
      else if (v == "0" || v == "2" || v == "3" || v == "4")
        p.split_k = std::stoi(v);
      else
        throw bad("0, auto, 2, 3 or 4 (blocks sharing a tile's K)");
    } else if (key == "wgmma") {
      p.wgmma = on_off(key, v);
    } else if (key == "staged-stores") {
      if (v == "none")
        p.staged_stores = MmaStaging::none;
      else if (v == "odd")
        p.staged_stores = MmaStaging::odd_rows;
      else if (v == "all")
        p.staged_stores = MmaStaging::all;
      else
        throw bad("none, odd or all");
    } else if (key == "products-first") {
      p.products_first = on_off(key, v);
    } else if (key == "tensor-copies") {
      p.tensor_copies = on_off(key, v);
    } else {
      throw Error("--matmul: unknown key '" + key +
                  "' (the keys: simt-tile, bf16-mma, tile, stages, split-k, wgmma, staged-stores, products-first, "
                  "tensor-copies)");
    }
  }
  return p;
}

std::string matmul_policy_str(const MatmulPolicy& p) {
  const MatmulPolicy d;
  std::vector<std::string> items;
  if (p.simt_tile != d.simt_tile) items.push_back("simt-tile=" + std::to_string(p.simt_tile));
  if (p.bf16_mma != d.bf16_mma) items.push_back(std::string("bf16-mma=") + (p.bf16_mma ? "on" : "off"));
  if (p.tile_n == MatmulPolicy::kTileAuto)
    items.push_back("tile=auto");
  else if (p.tile_n == MatmulPolicy::kTileWaves)
    items.push_back("tile=waves");
  else if (p.tile_n > 0)
    items.push_back("tile=" + std::to_string(p.tile_m) + "x" + std::to_string(p.tile_n));
  if (p.stages != d.stages) items.push_back("stages=" + std::to_string(p.stages));
  if (p.split_k) items.push_back("split-k=" + (*p.split_k < 0 ? std::string("auto") : std::to_string(*p.split_k)));
  if (p.wgmma) items.push_back(std::string("wgmma=") + (*p.wgmma ? "on" : "off"));
  if (p.staged_stores != d.staged_stores)
    items.push_back(std::string("staged-stores=") + (p.staged_stores == MmaStaging::none       ? "none"
                                                     : p.staged_stores == MmaStaging::odd_rows ? "odd"
                                                                                               : "all"));
  if (p.products_first) items.push_back("products-first=on");
  if (p.tensor_copies) items.push_back("tensor-copies=on");
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

AttentionPath parse_attention_path(std::string_view text) {
  if (text == "mma") return AttentionPath::mma;
  if (text == "simt") return AttentionPath::simt;
  throw Error("--attention-path: expected mma or simt, received '" + std::string(text) + "'");
}

CpuBf16Products parse_cpu_bf16(std::string_view text) {
  if (text == "rounded-f32") return CpuBf16Products::rounded_f32;
  if (text == "onednn") return CpuBf16Products::onednn;
  throw Error("--cpu-bf16: expected rounded-f32 or onednn, received '" + std::string(text) + "'");
}

const char* cpu_bf16_name(CpuBf16Products p) { return p == CpuBf16Products::onednn ? "onednn" : "rounded-f32"; }

std::string cpu_bf16_summary(const Target& t, bool* warn) {
  const char* hardware = t.cpu.amx_bf16 ? "AMX" : t.cpu.avx512_bf16 ? "AVX512-BF16" : nullptr;
  const bool emulated = t.cpu_bf16 != CpuBf16Products::onednn || !hardware;
  if (warn) *warn = emulated;
  if (t.cpu_bf16 == CpuBf16Products::onednn)
    return hardware ? hardware : "oneDNN's, emulated on AVX-512 without AMX-BF16 or AVX512-BF16 (slower than f32)";
  if (!hardware) return "none: bf16 is emulated and slower than f32";
  return std::string("none used: bf16 is emulated and slower than f32 (the CPU has ") + hardware +
         ": --cpu-bf16 onednn runs oneDNN's bf16 kernels)";
}

std::string Target::str() const {
  std::string s;
  if (kind == Kind::cuda) {
    s = "cuda sm_" + std::to_string(sm) + (fake ? " (simulated)" : "");
    s += wgmma() ? " wgmma" : " mma.sync";
  } else {
    s = "cpu";
    for (auto [on, name] : {std::pair{cpu.avx2, "avx2"},
                            {cpu.fma, "fma"},
                            {cpu.avx512f, "avx512f"},
                            {cpu.avx512_bf16, "avx512_bf16"},
                            {cpu.amx_bf16, "amx_bf16"}})
      if (on) s += std::string(" ") + name;
  }
  s += tf32 ? " tf32" : " f32";
  if (const std::string m = matmul_policy_str(matmul); !m.empty()) s += " matmul=" + m;
  if (attention == AttentionPath::simt) s += " attention=simt";
  if (kind == Kind::cpu) s += std::string(" cpu-bf16=") + cpu_bf16_name(cpu_bf16);
  if (wide_indices) s += " wide-indices";
  if (deterministic) s += " deterministic";
  if (!cuda_graphs) s += " no-cuda-graphs";
  if (!cpu_overwrite_inputs) s += " no-overwrite";
  if (!tuned.empty()) s += " tuned=" + std::to_string(tuned.size()) + ":" + tuned.fingerprint();
  return s;
}

}  // namespace kiln
