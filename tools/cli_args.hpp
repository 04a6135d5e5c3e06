// The gqattn tool's shared command-line pieces: exit codes, the usage
// error, value parsers, the JSON writer, and the problem flags that check,
// explain and bench share (parse_check). Header-only: main.cpp and
// bench_command.cpp include it; checked through the Cli tests.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"

namespace gqattn_cli {

inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitRuntime = 3;

// check's and explain's flags; `--flag=value` is the same as `--flag value`.
inline const char* const kFlags =
    R"(check flags (defaults: a small GQA problem with causal, window and softcap all on);
each takes `--flag value` or `--flag=value`:
  --B N          batch                                  (2)
  --T N          sets both --Tq and --Tk
  --Tq N         query length                           (256)
  --Tk N         key length; queries align to the end   (256)
  --H N          query heads                            (8)
  --Hkv N        key/value heads; H must be a multiple  (2)
  --d N          head dimension                         (64)
  --causal 0|1   causal mask                            (1)
  --window N     keys kept per query, self included;
                 0 = none (FlashAttention window_size=(N-1, 0))   (96)
  --softcap X    s = X * tanh(s / X); 0 = off           (30)
  --scale X      score scale                            (1/sqrt(d))
  --q-start N    query i sits at key position N + i; any integer, negative
                 or past Tk (Tk - Tq: queries aligned to the end; in a
                 varlen batch, each sequence's own Tk_b - Tq_b)
  --varlen       a packed variable-length batch of B sequences, lengths
                 drawn from --seed in [0, Tq] and [0, Tk] (0 and 1 often)
  --seqlens-q L  varlen with these query lengths, e.g. 5,0,1,17 (B = their
                 count, Tq = the longest unless --Tq/--T is given)
  --seqlens-k L  varlen key lengths, e.g. 5,3,1,23 (with --seqlens-q)
  --seqused-k L  varlen: keys used per sequence, e.g. 5,0,1,20, or
                 `random`: drawn from --seed, each at most its key length
  --no-check-offsets  varlen: Options::check_offsets off (offsets on a
                 CUDA device are not copied and checked before the call;
                 backends that run sequence by sequence still read them)
  --dtype T      f32, bf16 or f16                       (bf16)
  --backend B    cpu-flash, cpu (the mirror), cuda-unfused, cuda-flash,
                 cuda-hopper, auto, or
                 all = every backend available here      (all)
  --seed N       random seed                            (1)
  --forward-only skip the backward pass
  --json         print JSON on stdout instead of the table: check, one object
                 per backend and line; explain, one object. Progress
                 ("checking <backend> ...") goes to stderr either way
  --help         this text

)";

struct UsageError {
  std::string message;
};

inline int64_t parse_int(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw UsageError{flag + " expects an integer, got '" + text + "'"};
  return value;
}

// Any finite float, subnormals included (std::stof refuses those as out
// of range); a value beyond the float range is refused.
inline float parse_float(const std::string& flag, const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const float value = std::strtof(begin, &end);
  if (text.empty() || end != begin + text.size())
    throw UsageError{flag + " expects a number, got '" + text + "'"};
  if (errno == ERANGE && std::isinf(value))
    throw UsageError{flag + " = " + text + " is out of the float range"};
  return value;
}

// A comma-separated list of lengths, each in [0, 2^31).
inline std::vector<int32_t> parse_lengths(const std::string& flag, const std::string& text) {
  std::vector<int32_t> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? comma : comma - at);
    const int64_t value = parse_int(flag, item);
    if (value < 0 || value > INT32_MAX)
      throw UsageError{flag + " expects lengths in [0, 2^31), got " + item};
    out.push_back(int32_t(value));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

inline std::string lengths_text(const std::vector<int32_t>& lengths) {
  std::string out;
  for (std::size_t i = 0; i < lengths.size(); ++i)
    out += (i ? "," : "") + std::to_string(lengths[i]);
  return out;
}

inline gqattn::DType parse_dtype(const std::string& text) {
  if (text == "f32") return gqattn::DType::f32;
  if (text == "bf16") return gqattn::DType::bf16;
  if (text == "f16") return gqattn::DType::f16;
  throw UsageError{"--dtype must be f32, bf16 or f16, got '" + text + "'"};
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

struct CheckArgs {
  gqattn::Problem problem;
  gqattn::DType dtype = gqattn::DType::bf16;
  std::string backend = "all";
  uint64_t seed = 1;
  bool backward = true;
  bool json = false;
  gqattn::check::VarlenConfig varlen;  // problem.varlen
};

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

// The value of the flag args[i] (`--flag=value`, eq its '=', or `--flag
// value`, then i moves past it).
inline std::string flag_value(const std::vector<std::string>& args, std::size_t& i,
                              std::size_t eq) {
  const std::string& arg = args[i];
  if (eq != std::string::npos) return arg.substr(eq + 1);
  if (i + 1 >= args.size()) throw UsageError{arg + " needs a value"};
  return args[++i];
}

inline bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

inline CheckArgs parse_check(const std::vector<std::string>& args) {
  CheckArgs c;
  gqattn::Problem& p = c.problem;
  p.B = 2;
  p.Tq = p.Tk = 256;
  p.H = 8;
  p.Hkv = 2;
  p.d = 64;
  p.causal = true;
  p.window = 96;
  p.softcap = 30.0f;
  bool tq_given = false, tk_given = false, b_given = false, varlen_flag = false;
  bool varlen_only = false;  // a flag that means nothing without varlen
  std::string varlen_only_flag;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) throw UsageError{"unexpected argument '" + arg + "'"};
    // --flag=value or --flag value.
    const std::size_t eq = arg.find('=');
    const std::string flag = arg.substr(0, eq);
    if (flag == "--forward-only" || flag == "--json" || flag == "--varlen" ||
        flag == "--no-check-offsets") {
      if (eq != std::string::npos) throw UsageError{flag + " takes no value"};
      if (flag == "--json") {
        c.json = true;
      } else if (flag == "--varlen") {
        varlen_flag = true;
      } else if (flag == "--no-check-offsets") {
        c.varlen.check_offsets = false;
        varlen_only = true;
        varlen_only_flag = flag;
      } else {
        c.backward = false;
      }
      continue;
    }
    const std::string value = flag_value(args, i, eq);
    if (flag == "--B") {
      p.B = parse_int(flag, value);
      b_given = true;
    } else if (flag == "--T") {
      p.Tq = p.Tk = parse_int(flag, value);
      tq_given = tk_given = true;
    } else if (flag == "--Tq") {
      p.Tq = parse_int(flag, value);
      tq_given = true;
    } else if (flag == "--Tk") {
      p.Tk = parse_int(flag, value);
      tk_given = true;
    } else if (flag == "--q-start")
      p.q_start = parse_int(flag, value);
    else if (flag == "--seqlens-q")
      c.varlen.seqlens_q = parse_lengths(flag, value);
    else if (flag == "--seqlens-k")
      c.varlen.seqlens_k = parse_lengths(flag, value);
    else if (flag == "--seqused-k") {
      c.varlen.seqused_k.clear();
      c.varlen.draw_seqused_k = value == "random";
      if (!c.varlen.draw_seqused_k) c.varlen.seqused_k = parse_lengths(flag, value);
      varlen_only = true;
      varlen_only_flag = flag;
    } else if (flag == "--H")
      p.H = parse_int(flag, value);
    else if (flag == "--Hkv")
      p.Hkv = parse_int(flag, value);
    else if (flag == "--d")
      p.d = parse_int(flag, value);
    else if (flag == "--causal") {
      if (value != "0" && value != "1") throw UsageError{"--causal expects 0 or 1"};
      p.causal = value == "1";
    } else if (flag == "--window")
      p.window = parse_int(flag, value);
    else if (flag == "--softcap")
      p.softcap = parse_float(flag, value);
    else if (flag == "--scale")
      p.scale = parse_float(flag, value);
    else if (flag == "--dtype")
      c.dtype = parse_dtype(value);
    else if (flag == "--backend")
      c.backend = value;
    else if (flag == "--seed")
      c.seed = static_cast<uint64_t>(parse_int(flag, value));
    else
      throw UsageError{"unknown flag '" + flag + "' (see gqattn --help)"};
  }
  // Explicit lengths make a varlen batch of their count, as long as the
  // longest unless the bounds were given.
  const auto& lq = c.varlen.seqlens_q;
  const auto& lk = c.varlen.seqlens_k;
  if (lq.empty() != lk.empty()) throw UsageError{"--seqlens-q and --seqlens-k go together"};
  if (!lq.empty()) {
    if (lq.size() != lk.size())
      throw UsageError{"--seqlens-q and --seqlens-k need as many lengths each"};
    varlen_flag = true;
    if (!b_given) p.B = int64_t(lq.size());
    if (!tq_given) p.Tq = std::max<int64_t>(1, *std::max_element(lq.begin(), lq.end()));
    if (!tk_given) p.Tk = std::max<int64_t>(1, *std::max_element(lk.begin(), lk.end()));
  }
  if (varlen_only && !varlen_flag) throw UsageError{varlen_only_flag + " needs --varlen"};
  p.varlen = varlen_flag;
  return c;
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
