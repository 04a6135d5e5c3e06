// The gqattn tool's shared pieces: exit codes, the usage error, the
// arguments each command runs on (CheckArgs, BenchArgs, with their
// defaults), and the JSON writer. No parsing here: command_line.cpp turns
// the command line into these with CLI11, so that only that file compiles
// CLI11. Header-only: main.cpp, bench_command.cpp and command_line.cpp
// include it; checked through the Cli tests (tests/CMakeLists.txt) and
// tests/cpu/test_cli_bench.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"

namespace gqattn_cli {

inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitRuntime = 3;

// A bad command line or a problem the library refuses: main() prints
// "gqattn: <message>" on stderr and exits kExitUsage.
struct UsageError {
  std::string message;
};

// check's default problem: a small GQA problem with causal, window and
// softcap all on. The flags' defaults are these values, and the help text
// prints them from here.
inline gqattn::Problem default_problem() {
  gqattn::Problem p;
  p.B = 2;
  p.Tq = p.Tk = 256;
  p.H = 8;
  p.Hkv = 2;
  p.d = 64;
  p.causal = true;
  p.window = 96;
  p.softcap = 30.0f;
  return p;
}

// The problem of check, explain and bench, and how to run it.
struct CheckArgs {
  gqattn::Problem problem = default_problem();
  gqattn::DType dtype = gqattn::DType::bf16;
  std::string backend = "all";
  uint64_t seed = 1;
  bool backward = true;
  bool json = false;
  gqattn::check::VarlenConfig varlen;  // problem.varlen
};

// bench's own settings (its problem is a CheckArgs).
inline constexpr int kBenchDefaultRepeats = 20;
inline constexpr int kBenchDefaultWarmup = 3;
inline constexpr int64_t kBenchMaxCalls = 1000000;
struct BenchArgs {
  std::string device;  // "cpu", "cuda", or "" (cuda where usable, else cpu)
  int repeats = kBenchDefaultRepeats;
  int warmup = kBenchDefaultWarmup;
};

inline std::string lengths_text(const std::vector<int32_t>& lengths) {
  std::string out;
  for (std::size_t i = 0; i < lengths.size(); ++i)
    out += (i ? "," : "") + std::to_string(lengths[i]);
  return out;
}

// Minimal JSON output: strings escaped per RFC 8259, non-finite numbers as
// null (JSON has no NaN or infinity).
inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(u));
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

inline std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.12g", value);
  return buf;
}

inline std::string json_int(long long value) { return std::to_string(value); }

inline const char* json_bool(bool value) { return value ? "true" : "false"; }

// Builds one JSON object: add("key", raw JSON text), in insertion order.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& raw) {
    text_ += text_.empty() ? "{" : ",";
    text_ += json_string(key) + ":" + raw;
    return *this;
  }
  JsonObject& str(const std::string& key, const std::string& value) {
    return add(key, json_string(value));
  }
  JsonObject& boolean(const std::string& key, bool value) { return add(key, json_bool(value)); }
  std::string done() const { return text_.empty() ? "{}" : text_ + "}"; }

 private:
  std::string text_;
};

inline std::string json_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out + "]";
}

// The checker's configuration for one backend.
inline gqattn::check::Config check_config(const CheckArgs& c, gqattn::Backend backend) {
  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = backend;
  config.seed = c.seed;
  config.backward = c.backward;
  config.varlen = c.varlen;
  return config;
}

inline std::string json_ints(const std::vector<int32_t>& values) {
  std::vector<std::string> items;
  for (int32_t v : values) items.push_back(std::to_string(v));
  return json_array(items);
}

// A varlen batch's offsets as check runs them (given, or drawn from the
// seed), or null for a dense problem.
inline std::string varlen_json(const CheckArgs& c) {
  if (!c.problem.varlen) return "null";
  const auto layout = gqattn::check::layout_of(check_config(c, gqattn::Backend::Cpu));
  return JsonObject()
      .add("cu_seqlens_q", json_ints(layout.cu_seqlens_q))
      .add("cu_seqlens_k", json_ints(layout.cu_seqlens_k))
      .add("seqused_k", layout.seqused_k.empty() ? "null" : json_ints(layout.seqused_k))
      .boolean("check_offsets", c.varlen.check_offsets)
      .done();
}

// The problem as check and explain print it in JSON.
inline std::string problem_json(const CheckArgs& c) {
  const gqattn::Problem& p = c.problem;
  return JsonObject()
      .add("B", json_int(p.B))
      .add("Tq", json_int(p.Tq))
      .add("Tk", json_int(p.Tk))
      .add("H", json_int(p.H))
      .add("Hkv", json_int(p.Hkv))
      .add("d", json_int(p.d))
      .boolean("causal", p.causal)
      .add("window", json_int(p.window))
      .add("softcap", json_number(p.softcap))
      .add("scale", json_number(p.effective_scale()))
      .add("q_start", p.q_start ? json_int(*p.q_start) : "null")
      .str("dtype", gqattn::dtype_name(c.dtype))
      .add("seed", std::to_string(c.seed))
      .boolean("backward", c.backward)
      .add("varlen", varlen_json(c))
      .done();
}

}  // namespace gqattn_cli
