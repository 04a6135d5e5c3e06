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
// failure (out of memory, a CUDA error) exits 3. The command line is parsed
// by command_line.cpp (CLI11), which also holds the help texts; the shared
// argument structs and the JSON writer live in cli_args.hpp, `bench` in
// bench_command.cpp. Checked by the Cli tests (tests/CMakeLists.txt) and
// tests/cpu/test_cli_bench.cpp.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"

#include "bench_command.hpp"
#include "cli_args.hpp"
#include "command_line.hpp"

namespace {

using namespace gqattn_cli;  // the tool's shared pieces (cli_args.hpp)

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

int run_check(const CheckArgs& c) {
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
int run_explain(const CheckArgs& c) {
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

int run_info(bool json) {
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
  try {
    const CommandLine line = parse_command_line(argc, argv);
    switch (line.command) {
      case Command::none: return line.exit_status;  // help or the version
      case Command::check: return run_check(line.check);
      case Command::explain: return run_explain(line.check);
      case Command::info: return run_info(line.check.json);
      case Command::bench: return run_bench(line.check, line.bench);
    }
    return kExitUsage;
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
