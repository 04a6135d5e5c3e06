// The gqattn command-line tool.
//   gqattn check [flags]  forward + backward on each backend against the f64 oracle
//   gqattn info           build configuration, CUDA devices, backends and why not
//   gqattn explain [flags] which backend runs a problem, with which plan, or why not
//   gqattn --version      the library's version
// Flags take `--flag value` or `--flag=value`; --json prints JSON instead of
// tables (check: one object per backend and line; info, explain: one object),
// and check's progress ("checking <backend> ...") always goes to stderr.
// Usage errors print one line and exit 2; a failed check exits 1; a runtime
// failure (out of memory, a CUDA error) exits 3.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"

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
    throw UsageError{"unknown command '" + command +
                     "' (commands: check, explain, info, version; see --help)"};
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
