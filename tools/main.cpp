// The gqattn command-line tool.
//   gqattn check [flags]  forward + backward on each backend against the f64 oracle
//   gqattn info           build configuration, CUDA devices, backends and why not
//   gqattn explain [flags] which backend runs a problem, with which plan, or why not
//   gqattn bench [flags]  times each backend's forward and backward: ms and FLOP/s
//   gqattn --version      the library's version
// Flags take `--flag value` or `--flag=value`; --json prints JSON instead of
// tables (check: one object per backend and line; info, explain, bench: one
// object), and check's and bench's progress ("checking <backend> ...",
// "timing <backend> ...") always goes to stderr.
// Usage errors print one line and exit 2; a failed check exits 1; a runtime
// failure (out of memory, a CUDA error) exits 3.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"

#ifdef GQATTN_WITH_CUDA
#include "bench_cuda.hpp"  // events, a private stream and the spin: CUDA builds only
#endif

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitRuntime = 3;

const char* kHelp = R"(gqattn: exact attention with grouped-query heads, causal and sliding-window
masks and logit soft-capping, forward and backward, on the CPU and NVIDIA GPUs.

usage:
  gqattn check [flags]   run forward and backward on random inputs and compare every
                         output (o, lse, dq, dk, dv) with the f64 oracle; exit 1 on a failure
  gqattn info [--json]   build configuration, CUDA devices, backends and why not
  gqattn explain [flags] for each backend (and auto): whether it runs the problem's
                         forward and backward, the plan it would run (tile, score
                         mode, splits, dQ path, workspace), or why not; runs nothing.
                         Takes check's problem flags, --dtype, --backend,
                         --forward-only and --json
  gqattn bench [flags]   time each backend that runs the problem on one device:
                         forward and backward ms, TFLOP/s (GFLOP/s on the CPU)
                         and the ratio to the fastest; see gqattn bench --help
  gqattn --version       the version (also: gqattn version)
  gqattn --help          this text (also: gqattn <command> --help)

exit status: 0 ok, 1 a failed check, 2 a usage error, 3 a runtime failure
(out of memory, a CUDA error).

)";

// check's and explain's flags; `--flag=value` is the same as `--flag value`.
const char* kFlags =
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

const char* kExamples = R"(examples:
  gqattn check
  gqattn check --backend cpu --dtype f32 --T 1000 --window 0
  gqattn check --B 1 --Tq 7 --Tk 300 --H 16 --Hkv 1 --d 128 --causal 0
  gqattn check --json --backend=cpu --dtype=f32 --T=64
  gqattn check --backend cpu --varlen --B 6 --Tq 40 --Tk 70 --seqused-k random
  gqattn check --backend cpu --seqlens-q 5,0,1,17 --seqlens-k 5,3,1,23 --q-start -3
  gqattn explain --B 8 --Tq 1 --Tk 8192 --H 32 --Hkv 8 --d 128 --causal 0 --window 0 --softcap 0
)";

const char* kCheckUsage = R"(usage: gqattn check [flags]
Runs forward and backward on random inputs on each backend and compares every
output (o, lse, dq, dk, dv) with the f64 oracle; exits 1 on a failure.

)";

const char* kExplainUsage = R"(usage: gqattn explain [flags]
For each backend (and auto): whether it runs the problem's forward and backward,
the plan it would run (tile, score mode, splits, dQ path, workspace), or why
not; runs nothing. Takes check's problem flags (--varlen and --q-start
included; the varlen lengths are accepted and ignored, a plan does not depend
on them), --dtype, --backend, --forward-only and --json (--seed is accepted
and ignored).

)";

const char* kInfoUsage = R"(usage: gqattn info [--json]
Prints the build configuration (version, CUDA runtime and architectures), the
visible CUDA devices, and each backend: available, or why not.
  --json   one JSON object on stdout instead of the text
  --help   this text
)";

struct UsageError {
  std::string message;
};

int64_t parse_int(const std::string& flag, const std::string& text) {
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
float parse_float(const std::string& flag, const std::string& text) {
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
std::vector<int32_t> parse_lengths(const std::string& flag, const std::string& text) {
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

std::string lengths_text(const std::vector<int32_t>& lengths) {
  std::string out;
  for (std::size_t i = 0; i < lengths.size(); ++i)
    out += (i ? "," : "") + std::to_string(lengths[i]);
  return out;
}

gqattn::DType parse_dtype(const std::string& text) {
  if (text == "f32") return gqattn::DType::f32;
  if (text == "bf16") return gqattn::DType::bf16;
  if (text == "f16") return gqattn::DType::f16;
  throw UsageError{"--dtype must be f32, bf16 or f16, got '" + text + "'"};
}

// Minimal JSON output: strings escaped per RFC 8259, non-finite numbers as
// null (JSON has no NaN or infinity).
std::string json_string(const std::string& text) {
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

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.12g", value);
  return buf;
}

std::string json_int(long long value) { return std::to_string(value); }

const char* json_bool(bool value) { return value ? "true" : "false"; }

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

std::string json_array(const std::vector<std::string>& items) {
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
gqattn::check::Config check_config(const CheckArgs& c, gqattn::Backend backend) {
  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = backend;
  config.seed = c.seed;
  config.backward = c.backward;
  config.varlen = c.varlen;
  return config;
}

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

CheckArgs parse_check(const std::vector<std::string>& args) {
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
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) throw UsageError{flag + " needs a value"};
      value = args[++i];
    }
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

std::string json_ints(const std::vector<int32_t>& values) {
  std::vector<std::string> items;
  for (int32_t v : values) items.push_back(std::to_string(v));
  return json_array(items);
}

// A varlen batch's offsets as check runs them (given, or drawn from the
// seed), or null for a dense problem.
std::string varlen_json(const CheckArgs& c) {
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
std::string problem_json(const CheckArgs& c) {
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

void print_report(const gqattn::check::Report& r) {
  const char* name = gqattn::backend_name(r.backend);
  if (!r.ran) {
    std::printf("%-13s skipped: %s\n\n", name, r.skipped.c_str());
    return;
  }
  std::printf("%-13s %-4s %10s %10s  %s\n", "backend", "out", "error", "tolerance", "result");
  for (const auto& m : r.metrics)
    std::printf("%-13s %-4s %10.2e %10.2e  %s%s%s\n", name, m.name.c_str(), m.error, m.tolerance,
                m.pass ? "pass" : "FAIL", m.note.empty() ? "" : "  ", m.note.c_str());
  if (!r.backward_skipped.empty())
    std::printf("%-13s backward skipped: %s\n", name, r.backward_skipped.c_str());
  std::printf("%-13s %s, %s, forward %.2f ms, backward %.2f ms\n\n", name, r.pass ? "PASS" : "FAIL",
              r.deterministic ? "deterministic" : "NOT deterministic", r.forward_ms, r.backward_ms);
}

// One line of JSON per backend: the Report's fields and the problem.
void print_report_json(const gqattn::check::Report& r, const std::string& problem) {
  std::vector<std::string> outputs;
  for (const auto& m : r.metrics)
    outputs.push_back(JsonObject()
                          .str("name", m.name)
                          .add("error", json_number(m.error))
                          .add("tolerance", json_number(m.tolerance))
                          .boolean("pass", m.pass)
                          .str("note", m.note)
                          .done());
  const std::string line = JsonObject()
                               .str("backend", gqattn::backend_name(r.backend))
                               .boolean("ran", r.ran)
                               .boolean("pass", r.ran && r.pass)
                               .str("skipped", r.skipped)
                               .str("backward_skipped", r.backward_skipped)
                               .add("outputs", json_array(outputs))
                               .boolean("deterministic", r.deterministic)
                               .add("forward_ms", json_number(r.forward_ms))
                               .add("backward_ms", json_number(r.backward_ms))
                               .add("problem", problem)
                               .done();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int run_check(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kCheckUsage, stdout);
    std::fputs(kFlags, stdout);
    std::fputs(kExamples, stdout);
    return 0;
  }
  const CheckArgs c = parse_check(args);
  const gqattn::Problem& p = c.problem;
  // Lengths that do not fit the problem are a usage error (gqattn::Error,
  // exit 2), reported before any work.
  gqattn::oracle::VarlenLayout layout;
  if (p.varlen) layout = gqattn::check::layout_of(check_config(c, gqattn::Backend::Cpu));
  std::vector<gqattn::Backend> backends;
  const bool all = c.backend == "all";
  if (all) {
    backends = gqattn::all_backends();
  } else {
    backends.push_back(gqattn::parse_backend(c.backend));
  }
  // Problem errors (H % Hkv, window < 0, ...) surface here, before any work.
  const gqattn::Explanation cpu_view =
      gqattn::explain(p, c.dtype, gqattn::Device::cpu, gqattn::Backend::Cpu);
  if (!cpu_view.supported) throw UsageError{cpu_view.reason};
  // An explicitly named backend that cannot run is an error, not a skip.
  // Auto runs where check::run runs it: on CUDA when a device is visible,
  // else on the CPU.
  if (!all) {
    const gqattn::Backend b = backends.front();
    const bool on_cpu = b == gqattn::Backend::Cpu || b == gqattn::Backend::CpuFlash ||
                        (b == gqattn::Backend::Auto && gqattn::cuda_devices().empty());
    const auto device = on_cpu ? gqattn::Device::cpu : gqattn::Device::cuda;
    const gqattn::Explanation why = gqattn::explain(p, c.dtype, device, b);
    if (!why.supported) throw UsageError{why.reason};
  }

  const std::string problem = c.json ? problem_json(c) : std::string();
  if (!c.json)
    std::printf(
        "problem: B=%lld Tq=%lld Tk=%lld H=%lld Hkv=%lld d=%lld causal=%d window=%lld "
        "softcap=%g scale=%g q_start=%s dtype=%s seed=%llu\n",
        (long long)p.B, (long long)p.Tq, (long long)p.Tk, (long long)p.H, (long long)p.Hkv,
        (long long)p.d, p.causal ? 1 : 0, (long long)p.window, double(p.softcap),
        double(p.effective_scale()),
        p.q_start ? std::to_string(*p.q_start).c_str() : (p.varlen ? "Tk_b-Tq_b" : "Tk-Tq"),
        gqattn::dtype_name(c.dtype), (unsigned long long)c.seed);
  if (!c.json && p.varlen)
    std::printf("varlen: cu_seqlens_q=%s cu_seqlens_k=%s seqused_k=%s check_offsets=%d\n",
                lengths_text(layout.cu_seqlens_q).c_str(),
                lengths_text(layout.cu_seqlens_k).c_str(),
                layout.seqused_k.empty() ? "none" : lengths_text(layout.seqused_k).c_str(),
                c.varlen.check_offsets ? 1 : 0);
  if (!c.json) std::printf("\n");
  bool failed = false;
  int ran = 0;
  for (gqattn::Backend b : backends) {
    const gqattn::check::Config config = check_config(c, b);
    // Progress on stderr, so that a long check shows life and --json's
    // stdout stays JSON only.
    std::fflush(stdout);
    std::fprintf(stderr, "checking %s ...\n", gqattn::backend_name(b));
    std::fflush(stderr);
    gqattn::check::Report report;
    try {
      report = gqattn::check::run(config);
    } catch (const std::exception& e) {
      // The arguments were valid: whatever fails now is a runtime failure.
      std::fflush(stdout);
      std::fprintf(stderr, "gqattn: %s: error while running: %s\n", gqattn::backend_name(b),
                   e.what());
      return kExitRuntime;
    }
    if (c.json)
      print_report_json(report, problem);
    else
      print_report(report);
    ran += report.ran ? 1 : 0;
    failed = failed || (report.ran && !report.pass);
  }
  if (!c.json) std::printf("%s: %d backend(s) checked\n", failed ? "FAILED" : "all passed", ran);
  return failed ? kExitFailed : 0;
}

// One line per backend and pass: the plan it would run, or why not.
int run_explain(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kExplainUsage, stdout);
    std::fputs(kFlags, stdout);
    std::fputs(kExamples, stdout);
    return 0;
  }
  const CheckArgs c = parse_check(args);
  std::vector<gqattn::Backend> backends;
  if (c.backend == "all") {
    backends = gqattn::all_backends();
    backends.push_back(gqattn::Backend::Auto);
  } else {
    backends.push_back(gqattn::parse_backend(c.backend));
  }
  // Problem errors (H % Hkv, window < 0, ...) surface here.
  const gqattn::Explanation cpu_view =
      gqattn::explain(c.problem, c.dtype, gqattn::Device::cpu, gqattn::Backend::Cpu);
  if (!cpu_view.supported) throw UsageError{cpu_view.reason};
  std::string why_none;
  const bool have_gpu = !gqattn::cuda_devices(&why_none).empty();
  std::vector<std::string> entries;
  const gqattn::Pass passes[] = {gqattn::Pass::forward, gqattn::Pass::backward};
  for (gqattn::Pass pass : passes) {
    if (pass == gqattn::Pass::backward && !c.backward) break;
    const char* pass_name = pass == gqattn::Pass::forward ? "forward" : "backward";
    for (gqattn::Backend b : backends) {
      const bool on_cpu = b == gqattn::Backend::Cpu || b == gqattn::Backend::CpuFlash ||
                          (b == gqattn::Backend::Auto && !have_gpu);
      const gqattn::Explanation e = gqattn::explain(
          c.problem, c.dtype, on_cpu ? gqattn::Device::cpu : gqattn::Device::cuda, b, pass);
      if (c.json) {
        entries.push_back(JsonObject()
                              .str("pass", pass_name)
                              .str("backend", gqattn::backend_name(b))
                              .str("device", on_cpu ? "cpu" : "cuda")
                              .boolean("supported", e.supported)
                              .str("chosen", e.supported ? gqattn::backend_name(e.chosen) : "")
                              .str("plan", e.supported ? e.plan : "")
                              .str("reason", e.supported ? "" : e.reason)
                              .done());
        continue;
      }
      std::string line = e.supported ? "runs" : "no: " + e.reason;
      if (e.supported && b == gqattn::Backend::Auto)
        line += std::string(" on ") + gqattn::backend_name(e.chosen);
      if (e.supported && !e.plan.empty()) line += ": " + e.plan;
      std::printf("%-8s %-13s %s\n", pass_name, gqattn::backend_name(b), line.c_str());
    }
  }
  if (c.json)
    std::printf("%s\n", JsonObject()
                            .add("problem", problem_json(c))
                            .add("explanations", json_array(entries))
                            .done()
                            .c_str());
  return 0;
}

int run_info(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kInfoUsage, stdout);
    return 0;
  }
  bool json = false;
  for (const auto& a : args) {
    if (a != "--json") throw UsageError{"info takes only --json and --help, got '" + a + "'"};
    json = true;
  }
  const gqattn::BuildInfo build = gqattn::build_info();
  std::string why_none;
  const auto devices = gqattn::cuda_devices(&why_none);
  const auto statuses = gqattn::backend_status();
  if (json) {
    std::vector<std::string> devs, backends;
    for (const auto& d : devices)
      devs.push_back(JsonObject()
                         .add("index", json_int(d.index))
                         .str("name", d.name)
                         .str("sm", std::to_string(d.cc_major) + std::to_string(d.cc_minor))
                         .add("multiprocessors", json_int(d.multiprocessors))
                         .add("memory_bytes", std::to_string(d.memory_bytes))
                         .done());
    for (const auto& s : statuses)
      backends.push_back(JsonObject()
                             .str("name", gqattn::backend_name(s.backend))
                             .boolean("compiled", s.compiled)
                             .boolean("available", s.available)
                             .str("reason", s.reason)
                             .done());
    std::printf("%s\n", JsonObject()
                            .str("version", build.version)
                            .boolean("cuda_compiled", build.cuda_compiled)
                            .str("cuda_runtime", build.cuda_runtime)
                            .str("cuda_architectures", build.cuda_architectures)
                            .add("cuda_devices", json_array(devs))
                            .str("cuda_devices_why_none", devices.empty() ? why_none : "")
                            .add("backends", json_array(backends))
                            .done()
                            .c_str());
    return 0;
  }
  std::printf("gqattn %s\n", build.version.c_str());
  if (build.cuda_compiled)
    std::printf("cuda: compiled, runtime %s, architectures %s\n", build.cuda_runtime.c_str(),
                build.cuda_architectures.c_str());
  else
    std::printf("cuda: not compiled (nvcc was not found at configure time)\n");
  if (devices.empty()) std::printf("cuda devices: none (%s)\n", why_none.c_str());
  for (const auto& d : devices)
    std::printf("cuda device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", d.index, d.name.c_str(),
                d.cc_major, d.cc_minor, d.multiprocessors,
                double(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0));
  std::printf("backends:\n");
  for (const auto& s : statuses)
    std::printf("  %-13s %s%s%s\n", gqattn::backend_name(s.backend),
                s.available ? "available" : (s.compiled ? "compiled, unavailable" : "unavailable"),
                s.reason.empty() ? "" : ": ", s.reason.c_str());
  return 0;
}

// ---- gqattn bench -----------------------------------------------------------

const char* kBenchUsage = R"(usage: gqattn bench [flags]
Times each backend that runs the problem on one device and prints, per
backend, the forward and backward time per call, the rate (TFLOP/s on CUDA,
GFLOP/s on the CPU) and the time relative to the fastest backend shown.
FLOPs: forward 4 * d * H * B * kept pairs (the (query, key) pairs the mask
keeps per batch and head, Problem::kept_pairs(); summed over the sequences
of a varlen batch), backward 2.5x that.
Method: random normal inputs (mean 0.5, never zeros), warm-up calls, then
timed calls; the median is printed. On the CPU, wall clock per call
(steady_clock). On CUDA, CUDA events around each call on a private stream
with a GPU spin queued ahead of every timed call, so that the host's launch
time stays out; the inputs are copied into up to 16 sets of 256 MiB in all,
more than the L2 cache, rotated between calls. A varlen batch's offsets are
checked on the first call and not again (Options::check_offsets off, as a
training step under a CUDA graph runs).
Backends that cannot run the problem are listed as skipped, with the reason
gqattn explain gives; a backend named by --backend that cannot run it is a
usage error (exit 2).
  --backend B    a backend (cpu, cpu-flash, cuda-unfused, cuda-flash,
                 cuda-hopper), auto (the one auto picks), or all: every
                 backend that runs the problem on the device   (all)
  --device D     cpu (backends cpu, cpu-flash) or cuda (the cuda-* backends)
                 (cuda if a CUDA device is usable, else cpu; a named
                 backend's own device)
  --repeats N    timed calls per pass                   (20)
  --warmup N     untimed calls per pass before them     (3)
  --forward-only time the forward only
  --json         one JSON object on stdout instead of the table; progress
                 ("timing <backend> ...") goes to stderr either way
Takes check's problem flags below (and --dtype, --seed); --no-check-offsets
is accepted and changes nothing (bench checks a varlen batch's offsets once).

)";

const char* kBenchExamples = R"(examples:
  gqattn bench
  gqattn bench --B 4 --T 4096 --H 32 --Hkv 8 --d 128 --window 0 --softcap 0
  gqattn bench --device cpu --T 512 --repeats 5
  gqattn bench --backend cuda-flash --json
)";

constexpr double kFlopsPerPairPerDim = 4.0;  // QK^T and PV: 2 FLOPs per multiply-add each
constexpr double kBackwardFlopFactor = 2.5;  // as gqattn_bench and docs/performance.md count
constexpr float kBenchInputMean = 0.5f;
constexpr int kBenchDefaultRepeats = 20;
constexpr int kBenchDefaultWarmup = 3;
constexpr int64_t kBenchMaxCalls = 1000000;
// CUDA: the spin queued ahead of each timed call (a gqattn call takes the
// host 0.01-0.07 ms to queue, docs/performance.md; calls the host queued
// slower than this are counted and reported), and the input sets rotated
// between calls: together more than 4x the L2 cache of an H100/H200.
constexpr int kSpinAheadUs = 500;
constexpr std::size_t kRotateBytes = std::size_t(256) << 20;
constexpr int kMaxSets = 16;

struct BenchArgs {
  CheckArgs c;
  std::string device;  // "cpu", "cuda", or "" (the default)
  int repeats = kBenchDefaultRepeats;
  int warmup = kBenchDefaultWarmup;
};

// bench's own flags; the rest go to check's parser.
BenchArgs parse_bench(const std::vector<std::string>& args) {
  BenchArgs b;
  std::vector<std::string> rest;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const std::size_t eq = arg.find('=');
    const std::string flag = arg.substr(0, eq);
    if (flag != "--device" && flag != "--repeats" && flag != "--warmup") {
      rest.push_back(arg);
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) throw UsageError{flag + " needs a value"};
      value = args[++i];
    }
    if (flag == "--device") {
      if (value != "cpu" && value != "cuda")
        throw UsageError{"--device must be cpu or cuda, got '" + value + "'"};
      b.device = value;
    } else {
      const int64_t n = parse_int(flag, value);
      const int64_t least = flag == "--repeats" ? 1 : 0;
      if (n < least || n > kBenchMaxCalls)
        throw UsageError{flag + " must be in [" + std::to_string(least) + ", " +
                         std::to_string(kBenchMaxCalls) + "], got " + value};
      (flag == "--repeats" ? b.repeats : b.warmup) = int(n);
    }
  }
  b.c = parse_check(rest);
  return b;
}

// (query, key) pairs the mask keeps in one head, over the whole batch:
// B x Problem::kept_pairs(), or for a varlen batch the sum over its
// sequences, each the dense problem of its own lengths (docs/semantics.md).
double batch_kept_pairs(const gqattn::Problem& p, const gqattn::oracle::VarlenLayout& layout) {
  if (!p.varlen) return double(p.B) * double(p.kept_pairs());
  double pairs = 0.0;
  for (std::size_t b = 0; b + 1 < layout.cu_seqlens_q.size(); ++b) {
    gqattn::Problem one = p;
    one.varlen = false;
    one.B = 1;
    one.Tq = layout.cu_seqlens_q[b + 1] - layout.cu_seqlens_q[b];
    one.Tk = layout.seqused_k.empty() ? layout.cu_seqlens_k[b + 1] - layout.cu_seqlens_k[b]
                                      : layout.seqused_k[b];
    pairs += double(one.kept_pairs());
  }
  return pairs;
}

double median(std::vector<double> x) {
  if (x.empty()) return 0.0;
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// Memory on the bench's device, all freed together.
class Arena {
 public:
  explicit Arena(bool cuda) : cuda_(cuda) {
#ifndef GQATTN_WITH_CUDA
    if (cuda_) throw std::runtime_error("this build of the tool has no CUDA");
#endif
  }
  ~Arena() {
#ifdef GQATTN_WITH_CUDA
    for (void* data : device_) gqattn_tool::cuda_free(data);
#endif
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* alloc(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 1);  // an empty varlen batch still gets an address
#ifdef GQATTN_WITH_CUDA
    if (cuda_) {
      device_.push_back(gqattn_tool::cuda_alloc(bytes));
      return device_.back();
    }
#endif
    host_.emplace_back(new unsigned char[bytes]());
    return host_.back().get();
  }
  void* copy_of(const void* host, std::size_t bytes) {
    void* data = alloc(bytes);
#ifdef GQATTN_WITH_CUDA
    if (cuda_) {
      if (bytes > 0) gqattn_tool::cuda_upload(data, host, bytes);
      return data;
    }
#endif
    if (bytes > 0) std::memcpy(data, host, bytes);
    return data;
  }

 private:
  bool cuda_;
  std::vector<std::unique_ptr<unsigned char[]>> host_;
  std::vector<void*> device_;
};

// n elements of `dtype` drawn from normal(kBenchInputMean, 1).
std::vector<unsigned char> random_tensor(std::size_t n, gqattn::DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(kBenchInputMean, 1.0f);
  std::vector<unsigned char> out(n * gqattn::dtype_size(dtype));
  for (std::size_t i = 0; i < n; ++i) gqattn::store_from_float(out.data(), dtype, i, normal(rng));
  return out;
}

// One backend's result.
struct BenchRow {
  gqattn::Backend backend = gqattn::Backend::Cpu;
  bool ran = false;
  std::string skipped;           // why it did not run
  std::string backward_skipped;  // why the backward did not (forward-only backend)
  std::string forward_plan, backward_plan;
  double forward_ms = 0.0, backward_ms = 0.0;  // medians; 0 = not timed
  int host_late = 0;  // CUDA: timed calls queued slower than the spin (they include host time)
};

// An explanation's reason without the leading "<backend>: ".
std::string reason_of(const gqattn::Explanation& e, gqattn::Backend b) {
  const std::string prefix = std::string(gqattn::backend_name(b)) + ": ";
  return e.reason.rfind(prefix, 0) == 0 ? e.reason.substr(prefix.size()) : e.reason;
}

bool cpu_backend(gqattn::Backend b) {
  return b == gqattn::Backend::Cpu || b == gqattn::Backend::CpuFlash;
}

int run_bench(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kBenchUsage, stdout);
    std::fputs(kFlags, stdout);
    std::fputs(kBenchExamples, stdout);
    return 0;
  }
  const BenchArgs a = parse_bench(args);
  const CheckArgs& c = a.c;
  const gqattn::Problem& p = c.problem;

  // Problem errors (H % Hkv, window < 0, ...) and lengths that do not fit
  // surface here, before any work.
  const gqattn::Explanation cpu_view =
      gqattn::explain(p, c.dtype, gqattn::Device::cpu, gqattn::Backend::Cpu);
  if (!cpu_view.supported) throw UsageError{cpu_view.reason};
  gqattn::oracle::VarlenLayout layout;
  if (p.varlen) layout = gqattn::check::layout_of(check_config(c, gqattn::Backend::Cpu));

  // The device: --device, else a named backend's, else cuda where usable.
  const bool all = c.backend == "all";
  const gqattn::Backend named = all ? gqattn::Backend::Auto : gqattn::parse_backend(c.backend);
  std::string why_no_gpu;
  std::vector<gqattn::CudaDeviceInfo> gpus;
#ifdef GQATTN_WITH_CUDA
  gpus = gqattn::cuda_devices(&why_no_gpu);
#else
  why_no_gpu = "this build has no CUDA (nvcc was not found at configure time)";
#endif
  std::string device = a.device;
  if (device.empty()) {
    if (!all && named != gqattn::Backend::Auto)
      device = cpu_backend(named) ? "cpu" : "cuda";
    else
      device = gpus.empty() ? "cpu" : "cuda";
  }
  const bool on_cuda = device == "cuda";
  const gqattn::Device dev = on_cuda ? gqattn::Device::cuda : gqattn::Device::cpu;
  if (on_cuda && gpus.empty() && (all || named == gqattn::Backend::Auto))
    throw UsageError{"--device cuda: no usable CUDA device: " + why_no_gpu};

  // Which backends run each pass, and why the others do not.
  gqattn::Options plan_options;
  plan_options.check_offsets = !on_cuda;
  std::vector<BenchRow> rows;
  const std::vector<gqattn::Backend> candidates =
      all ? gqattn::all_backends() : std::vector<gqattn::Backend>{named};
  for (gqattn::Backend b : candidates) {
    BenchRow row;
    row.backend = b;
    const gqattn::Explanation fwd =
        gqattn::explain(p, c.dtype, dev, b, gqattn::Pass::forward, plan_options);
    if (b == gqattn::Backend::Auto && fwd.supported) row.backend = fwd.chosen;
    if (!fwd.supported) {
      if (!all)
        throw UsageError{std::string(gqattn::backend_name(b)) + " is skipped on the " + device +
                         " device: " + reason_of(fwd, b)};
      row.skipped = reason_of(fwd, b);
      rows.push_back(row);
      continue;
    }
    row.ran = true;
    row.forward_plan = fwd.plan;
    if (c.backward) {
      const gqattn::Explanation bwd =
          gqattn::explain(p, c.dtype, dev, row.backend, gqattn::Pass::backward, plan_options);
      if (bwd.supported)
        row.backward_plan = bwd.plan;
      else
        row.backward_skipped = reason_of(bwd, row.backend);
    }
    rows.push_back(row);
  }
  if (std::none_of(rows.begin(), rows.end(), [](const BenchRow& r) { return r.ran; })) {
    std::string why;
    for (const BenchRow& r : rows)
      why +=
          std::string(why.empty() ? "" : "; ") + gqattn::backend_name(r.backend) + ": " + r.skipped;
    throw UsageError{"no backend runs this problem on the " + device + " device: " + why};
  }

  // FLOPs per call, exact from the mask.
  const double pairs = batch_kept_pairs(p, layout);
  const double fwd_flops = kFlopsPerPairPerDim * double(p.d) * double(p.H) * pairs;
  const double bwd_flops = kBackwardFlopFactor * fwd_flops;

  // Shapes and host inputs.
  const int64_t rows_q = p.varlen ? layout.cu_seqlens_q.back() : p.B * p.Tq;
  const int64_t rows_k = p.varlen ? layout.cu_seqlens_k.back() : p.B * p.Tk;
  const std::size_t elem = gqattn::dtype_size(c.dtype);
  const std::size_t q_elems = std::size_t(rows_q * p.H * p.d);
  const std::size_t kv_elems = std::size_t(rows_k * p.Hkv * p.d);
  const std::size_t lse_bytes = std::size_t(p.H * rows_q) * sizeof(float);
  const std::size_t set_bytes = (5 * q_elems + 4 * kv_elems) * elem + lse_bytes;
  const int sets =
      on_cuda
          ? int(std::clamp<std::size_t>(
                (kRotateBytes + set_bytes - 1) / std::max<std::size_t>(set_bytes, 1), 1, kMaxSets))
          : 1;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());

  // The method, in one line (and in JSON).
  char method[512];
  if (on_cuda)
    std::snprintf(method, sizeof method,
                  "cuda device 0 (%s): CUDA events around each call on a private stream, a %d us "
                  "GPU spin queued ahead of every timed call (host launch time excluded); median "
                  "of %d timed calls after %d warm-up calls; %d input set(s) rotated",
                  gpus.empty() ? "?" : gpus.front().name.c_str(), kSpinAheadUs, a.repeats, a.warmup,
                  sets);
  else
    std::snprintf(method, sizeof method,
                  "cpu: wall clock per call (steady_clock); median of %d timed calls after %d "
                  "warm-up calls; %u threads",
                  a.repeats, a.warmup, threads);

  // Time every backend that runs.
  try {
    std::mt19937_64 rng(c.seed);
    const std::vector<unsigned char> hq = random_tensor(q_elems, c.dtype, rng);
    const std::vector<unsigned char> hk = random_tensor(kv_elems, c.dtype, rng);
    const std::vector<unsigned char> hv = random_tensor(kv_elems, c.dtype, rng);
    const std::vector<unsigned char> hdo = random_tensor(q_elems, c.dtype, rng);
    Arena arena(on_cuda);
    struct Set {
      void *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    };
    std::vector<Set> all_sets;
    for (int s = 0; s < sets; ++s) {
      Set set;
      set.q = arena.copy_of(hq.data(), hq.size());
      set.k = arena.copy_of(hk.data(), hk.size());
      set.v = arena.copy_of(hv.data(), hv.size());
      set.dout = arena.copy_of(hdo.data(), hdo.size());
      set.o = arena.alloc(q_elems * elem);
      set.lse = arena.alloc(lse_bytes);
      set.dq = arena.alloc(q_elems * elem);
      set.dk = arena.alloc(kv_elems * elem);
      set.dv = arena.alloc(kv_elems * elem);
      all_sets.push_back(set);
    }
    gqattn::VarlenOffsets offsets;
    if (p.varlen) {
      const auto offsets_of = [&](const std::vector<int32_t>& v) {
        return gqattn::OffsetsRef{
            static_cast<const int32_t*>(arena.copy_of(v.data(), v.size() * sizeof(int32_t))), dev,
            int64_t(v.size())};
      };
      offsets.cu_seqlens_q = offsets_of(layout.cu_seqlens_q);
      offsets.cu_seqlens_k = offsets_of(layout.cu_seqlens_k);
      if (!layout.seqused_k.empty()) offsets.seqused_k = offsets_of(layout.seqused_k);
    }
    const auto ref_q = [&](void* data) {
      return p.varlen ? gqattn::contiguous(data, c.dtype, dev, rows_q, p.H, p.d)
                      : gqattn::contiguous(data, c.dtype, dev, p.B, p.Tq, p.H, p.d);
    };
    const auto ref_kv = [&](void* data) {
      return p.varlen ? gqattn::contiguous(data, c.dtype, dev, rows_k, p.Hkv, p.d)
                      : gqattn::contiguous(data, c.dtype, dev, p.B, p.Tk, p.Hkv, p.d);
    };
    const auto ref_lse = [&](void* data) {
      return p.varlen ? gqattn::contiguous(data, gqattn::DType::f32, dev, p.H, rows_q)
                      : gqattn::contiguous(data, gqattn::DType::f32, dev, p.B, p.H, p.Tq);
    };

#ifdef GQATTN_WITH_CUDA
    std::unique_ptr<gqattn_tool::CudaTimer> timer;
    if (on_cuda) timer = std::make_unique<gqattn_tool::CudaTimer>(kSpinAheadUs);
#endif
    for (BenchRow& row : rows) {
      if (!row.ran) continue;
      std::fflush(stdout);
      std::fprintf(stderr, "timing %s ...\n", gqattn::backend_name(row.backend));
      std::fflush(stderr);
      gqattn::Options options;
      options.backend = row.backend;
#ifdef GQATTN_WITH_CUDA
      if (timer) options.stream = timer->stream();
#endif
      const auto forward = [&](const Set& x) {
        if (p.varlen)
          gqattn::forward(p, offsets, ref_q(x.q), ref_kv(x.k), ref_kv(x.v), ref_q(x.o),
                          ref_lse(x.lse), options);
        else
          gqattn::forward(p, ref_q(x.q), ref_kv(x.k), ref_kv(x.v), ref_q(x.o), ref_lse(x.lse),
                          options);
      };
      const auto backward = [&](const Set& x) {
        if (p.varlen)
          gqattn::backward(p, offsets, ref_q(x.q), ref_kv(x.k), ref_kv(x.v), ref_q(x.o),
                           ref_lse(x.lse), ref_q(x.dout), ref_q(x.dq), ref_kv(x.dk), ref_kv(x.dv),
                           options);
        else
          gqattn::backward(p, ref_q(x.q), ref_kv(x.k), ref_kv(x.v), ref_q(x.o), ref_lse(x.lse),
                           ref_q(x.dout), ref_q(x.dq), ref_kv(x.dk), ref_kv(x.dv), options);
      };
      // Warm-up, then the timed calls; the median in ms.
      const auto time_pass = [&](const std::function<void(const Set&)>& call) {
        for (int i = 0; i < a.warmup; ++i) call(all_sets[std::size_t(i % sets)]);
        std::vector<double> ms;
#ifdef GQATTN_WITH_CUDA
        if (timer) {
          timer->synchronize();
          for (int i = 0; i < a.repeats; ++i) {
            const Set& x = all_sets[std::size_t(i % sets)];
            bool late = false;
            ms.push_back(timer->time([&] { call(x); }, &late));
            row.host_late += late ? 1 : 0;
          }
          return median(ms);
        }
#endif
        for (int i = 0; i < a.repeats; ++i) {
          const Set& x = all_sets[std::size_t(i % sets)];
          const auto start = std::chrono::steady_clock::now();
          call(x);
          ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
        }
        return median(ms);
      };
      // Every set's o and lse (the backward's inputs); the offsets are
      // checked on this first call and, on CUDA, not read on the host again.
      for (const Set& x : all_sets) forward(x);
      options.check_offsets = !on_cuda;
      row.forward_ms = time_pass(forward);
      if (c.backward && row.backward_skipped.empty()) row.backward_ms = time_pass(backward);
#ifdef GQATTN_WITH_CUDA
      if (timer) timer->synchronize();
#endif
    }
  } catch (const std::exception& e) {
    // The arguments were valid: whatever fails now is a runtime failure.
    std::fflush(stdout);
    std::fprintf(stderr, "gqattn: bench: error while running: %s\n", e.what());
    return kExitRuntime;
  }

  // The fastest of each pass, for the ratios.
  double best_fwd = 0.0, best_bwd = 0.0;
  int host_late = 0;
  for (const BenchRow& r : rows) {
    if (r.forward_ms > 0.0 && (best_fwd == 0.0 || r.forward_ms < best_fwd)) best_fwd = r.forward_ms;
    if (r.backward_ms > 0.0 && (best_bwd == 0.0 || r.backward_ms < best_bwd))
      best_bwd = r.backward_ms;
    host_late += r.host_late;
  }
  const double unit = on_cuda ? 1e12 : 1e9;  // TFLOP/s on CUDA, GFLOP/s on the CPU
  const auto rate = [&](double flops, double ms) { return ms > 0.0 ? flops / (ms * 1e-3) : 0.0; };

  if (c.json) {
    std::vector<std::string> results;
    for (const BenchRow& r : rows) {
      const bool bwd = r.backward_ms > 0.0;
      const auto num_or_null = [](bool present, double v) {
        return present ? json_number(v) : std::string("null");
      };
      results.push_back(
          JsonObject()
              .str("backend", gqattn::backend_name(r.backend))
              .boolean("ran", r.ran)
              .str("skipped", r.skipped)
              .str("backward_skipped", r.backward_skipped)
              .str("forward_plan", r.forward_plan)
              .str("backward_plan", r.backward_plan)
              .add("forward_ms", num_or_null(r.ran, r.forward_ms))
              .add("forward_tflops", num_or_null(r.ran, rate(fwd_flops, r.forward_ms) / 1e12))
              .add("forward_gflops", num_or_null(r.ran, rate(fwd_flops, r.forward_ms) / 1e9))
              .add("forward_vs_fastest", num_or_null(r.ran, r.forward_ms / best_fwd))
              .add("backward_ms", num_or_null(bwd, r.backward_ms))
              .add("backward_tflops", num_or_null(bwd, rate(bwd_flops, r.backward_ms) / 1e12))
              .add("backward_gflops", num_or_null(bwd, rate(bwd_flops, r.backward_ms) / 1e9))
              .add("backward_vs_fastest", num_or_null(bwd, r.backward_ms / best_bwd))
              .add("host_late_calls", json_int(r.host_late))
              .done());
    }
    std::printf("%s\n", JsonObject()
                            .add("problem", problem_json(c))
                            .str("device", device)
                            .str("method", method)
                            .str("timer", on_cuda ? "cuda-events" : "steady-clock")
                            .add("spin_ahead_us", on_cuda ? json_int(kSpinAheadUs) : "null")
                            .add("repeats", json_int(a.repeats))
                            .add("warmup", json_int(a.warmup))
                            .add("threads", on_cuda ? "null" : json_int(threads))
                            .add("input_sets", json_int(sets))
                            .add("kept_pairs", json_number(pairs))
                            .add("forward_flops", json_number(fwd_flops))
                            .add("backward_flops", json_number(c.backward ? bwd_flops : 0.0))
                            .add("results", json_array(results))
                            .done()
                            .c_str());
    return 0;
  }

  std::printf(
      "problem: B=%lld Tq=%lld Tk=%lld H=%lld Hkv=%lld d=%lld causal=%d window=%lld softcap=%g "
      "scale=%g q_start=%s dtype=%s%s\n",
      (long long)p.B, (long long)p.Tq, (long long)p.Tk, (long long)p.H, (long long)p.Hkv,
      (long long)p.d, p.causal ? 1 : 0, (long long)p.window, double(p.softcap),
      double(p.effective_scale()),
      p.q_start ? std::to_string(*p.q_start).c_str() : (p.varlen ? "Tk_b-Tq_b" : "Tk-Tq"),
      gqattn::dtype_name(c.dtype), p.varlen ? " varlen" : "");
  if (p.varlen)
    std::printf("varlen: cu_seqlens_q=%s cu_seqlens_k=%s seqused_k=%s\n",
                lengths_text(layout.cu_seqlens_q).c_str(),
                lengths_text(layout.cu_seqlens_k).c_str(),
                layout.seqused_k.empty() ? "none" : lengths_text(layout.seqused_k).c_str());
  std::printf("flops: forward %.4g per call (4 * d * H * %.0f kept pairs), backward 2.5x\n",
              fwd_flops, pairs);
  std::printf("method: %s\n\n", method);
  const char* unit_name = on_cuda ? "TFLOP/s" : "GFLOP/s";
  std::printf("%-13s %10s %11s %8s %10s %11s %8s\n", "backend", "fwd ms", unit_name, "fwd x",
              "bwd ms", unit_name, "bwd x");
  for (const BenchRow& r : rows) {
    if (!r.ran) continue;
    std::printf("%-13s %10.4f %11.3f %7.2fx", gqattn::backend_name(r.backend), r.forward_ms,
                rate(fwd_flops, r.forward_ms) / unit, r.forward_ms / best_fwd);
    if (r.backward_ms > 0.0)
      std::printf(" %10.4f %11.3f %7.2fx\n", r.backward_ms, rate(bwd_flops, r.backward_ms) / unit,
                  r.backward_ms / best_bwd);
    else
      std::printf(" %10s %11s %8s\n", "-", "-", "-");
  }
  std::printf("(x: time / the fastest backend's time; 1.00x = the fastest)\n");
  for (const BenchRow& r : rows) {
    if (!r.ran)
      std::printf("%-13s skipped: %s\n", gqattn::backend_name(r.backend), r.skipped.c_str());
    else if (c.backward && !r.backward_skipped.empty())
      std::printf("%-13s backward skipped: %s\n", gqattn::backend_name(r.backend),
                  r.backward_skipped.c_str());
  }
  if (host_late > 0)
    std::printf(
        "note: %d timed call(s) took the host longer to queue than the %d us spin: "
        "their times include host time\n",
        host_late, kSpinAheadUs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      std::fputs(kHelp, stdout);
      std::fputs(kFlags, stdout);
      std::fputs(kExamples, stdout);
      return args.empty() ? kExitUsage : 0;
    }
    const std::string command = args[0];
    args.erase(args.begin());
    if (command == "--version" || command == "-V" || command == "version") {
      if (!args.empty()) throw UsageError{command + " takes no arguments"};
      std::printf("gqattn %s\n", gqattn::build_info().version.c_str());
      return 0;
    }
    if (command == "check") return run_check(args);
    if (command == "explain") return run_explain(args);
    if (command == "info") return run_info(args);
    if (command == "bench") return run_bench(args);
    throw UsageError{"unknown command '" + command +
                     "' (commands: check, explain, info, bench, version; see --help)"};
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gqattn: %s\n", e.message.c_str());
    return kExitUsage;
  } catch (const gqattn::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gqattn: error: %s\n", e.what());
    return kExitRuntime;
  }
}
