// The gqattn command-line tool.
//   gqattn check [flags]  forward + backward on each backend against the f64 oracle
//   gqattn info           build configuration, CUDA devices, backends and why not
//   gqattn explain [flags] which backend runs a problem, with which plan, or why not
// Usage errors print one line and exit 2; a failed check exits 1; a runtime
// failure (out of memory, a CUDA error) exits 3.
#include <cerrno>
#include <cmath>
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
  gqattn info            build configuration, CUDA devices, backends and why not
  gqattn explain [flags] for each backend (and auto): whether it runs the problem's
                         forward and backward, the plan it would run (tile, score
                         mode, splits, dQ path, workspace), or why not; runs nothing.
                         Takes check's problem flags, --dtype, --backend and
                         --forward-only
  gqattn --help          this text

check flags (defaults: a small GQA problem with causal, window and softcap all on):
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
  --dtype T      f32, bf16 or f16                       (bf16)
  --backend B    cpu, cuda-unfused, cuda-flash, cuda-hopper, auto, or
                 all = every backend available here      (all)
  --seed N       random seed                            (1)
  --forward-only skip the backward pass

examples:
  gqattn check
  gqattn check --backend cpu --dtype f32 --T 1000 --window 0
  gqattn check --B 1 --Tq 7 --Tk 300 --H 16 --Hkv 1 --d 128 --causal 0
  gqattn explain --B 8 --Tq 1 --Tk 8192 --H 32 --Hkv 8 --d 128 --causal 0 --window 0 --softcap 0
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

gqattn::DType parse_dtype(const std::string& text) {
  if (text == "f32") return gqattn::DType::f32;
  if (text == "bf16") return gqattn::DType::bf16;
  if (text == "f16") return gqattn::DType::f16;
  throw UsageError{"--dtype must be f32, bf16 or f16, got '" + text + "'"};
}

struct CheckArgs {
  gqattn::Problem problem;
  gqattn::DType dtype = gqattn::DType::bf16;
  std::string backend = "all";
  uint64_t seed = 1;
  bool backward = true;
};

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
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--forward-only") {
      c.backward = false;
      continue;
    }
    if (flag.rfind("--", 0) != 0) throw UsageError{"unexpected argument '" + flag + "'"};
    if (i + 1 >= args.size()) throw UsageError{flag + " needs a value"};
    const std::string& value = args[++i];
    if (flag == "--B")
      p.B = parse_int(flag, value);
    else if (flag == "--T")
      p.Tq = p.Tk = parse_int(flag, value);
    else if (flag == "--Tq")
      p.Tq = parse_int(flag, value);
    else if (flag == "--Tk")
      p.Tk = parse_int(flag, value);
    else if (flag == "--H")
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
  return c;
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

int run_check(const std::vector<std::string>& args) {
  const CheckArgs c = parse_check(args);
  const gqattn::Problem& p = c.problem;
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
    const bool on_cpu =
        b == gqattn::Backend::Cpu || (b == gqattn::Backend::Auto && gqattn::cuda_devices().empty());
    const auto device = on_cpu ? gqattn::Device::cpu : gqattn::Device::cuda;
    const gqattn::Explanation why = gqattn::explain(p, c.dtype, device, b);
    if (!why.supported) throw UsageError{why.reason};
  }

  std::printf(
      "problem: B=%lld Tq=%lld Tk=%lld H=%lld Hkv=%lld d=%lld causal=%d window=%lld "
      "softcap=%g scale=%g dtype=%s seed=%llu\n\n",
      (long long)p.B, (long long)p.Tq, (long long)p.Tk, (long long)p.H, (long long)p.Hkv,
      (long long)p.d, p.causal ? 1 : 0, (long long)p.window, double(p.softcap),
      double(p.effective_scale()), gqattn::dtype_name(c.dtype), (unsigned long long)c.seed);
  bool failed = false;
  int ran = 0;
  for (gqattn::Backend b : backends) {
    gqattn::check::Config config;
    config.problem = p;
    config.dtype = c.dtype;
    config.backend = b;
    config.seed = c.seed;
    config.backward = c.backward;
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
    print_report(report);
    ran += report.ran ? 1 : 0;
    failed = failed || (report.ran && !report.pass);
  }
  std::printf("%s: %d backend(s) checked\n", failed ? "FAILED" : "all passed", ran);
  return failed ? kExitFailed : 0;
}

// One line per backend and pass: the plan it would run, or why not.
int run_explain(const std::vector<std::string>& args) {
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
  const gqattn::Pass passes[] = {gqattn::Pass::forward, gqattn::Pass::backward};
  for (gqattn::Pass pass : passes) {
    if (pass == gqattn::Pass::backward && !c.backward) break;
    const char* pass_name = pass == gqattn::Pass::forward ? "forward" : "backward";
    for (gqattn::Backend b : backends) {
      const bool on_cpu = b == gqattn::Backend::Cpu || (b == gqattn::Backend::Auto && !have_gpu);
      const gqattn::Explanation e = gqattn::explain(
          c.problem, c.dtype, on_cpu ? gqattn::Device::cpu : gqattn::Device::cuda, b, pass);
      std::string line = e.supported ? "runs" : "no: " + e.reason;
      if (e.supported && b == gqattn::Backend::Auto)
        line += std::string(" on ") + gqattn::backend_name(e.chosen);
      if (e.supported && !e.plan.empty()) line += ": " + e.plan;
      std::printf("%-8s %-13s %s\n", pass_name, gqattn::backend_name(b), line.c_str());
    }
  }
  return 0;
}

int run_info() {
  const gqattn::BuildInfo build = gqattn::build_info();
  std::printf("gqattn %s\n", build.version.c_str());
  if (build.cuda_compiled)
    std::printf("cuda: compiled, runtime %s, architectures %s\n", build.cuda_runtime.c_str(),
                build.cuda_architectures.c_str());
  else
    std::printf("cuda: not compiled (nvcc was not found at configure time)\n");
  std::string why_none;
  const auto devices = gqattn::cuda_devices(&why_none);
  if (devices.empty()) std::printf("cuda devices: none (%s)\n", why_none.c_str());
  for (const auto& d : devices)
    std::printf("cuda device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", d.index, d.name.c_str(),
                d.cc_major, d.cc_minor, d.multiprocessors,
                double(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0));
  std::printf("backends:\n");
  for (const auto& s : gqattn::backend_status())
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
      return args.empty() ? kExitUsage : 0;
    }
    const std::string command = args[0];
    args.erase(args.begin());
    if (command == "check") return run_check(args);
    if (command == "explain") return run_explain(args);
    if (command == "info") {
      if (!args.empty()) throw UsageError{"info takes no arguments"};
      return run_info();
    }
    throw UsageError{"unknown command '" + command +
                     "' (commands: check, explain, info; see --help)"};
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
