// The gqattn command line on CLI11 (Debian's libcli11-dev, found by
// tools/CMakeLists.txt): the commands, each flag with its default and its
// help, and what was given turned into CheckArgs and BenchArgs. The only
// file of the tool that includes CLI11, a large header-only library, so
// that main.cpp and bench_command.cpp compile without it. Checked by the
// Cli tests (tests/CMakeLists.txt) and tests/cpu/test_cli_bench.cpp.
//
// CLI11 splits `--flag value` and `--flag=value`, finds the command, refuses
// unknown flags and stray arguments, and prints the help; the values of
// numbers are parsed here (parse_int, parse_float), since CLI11 reads
// integers with strtoll base 0 (010 is 8) and takes 2^64 as INT64_MAX, and
// converts floats through long double (1e39 becomes inf), without a word.
#include "command_line.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"

namespace gqattn_cli {
namespace {

const char* kDescription =
    R"(gqattn: exact attention with grouped-query heads, causal and sliding-window
masks and logit soft-capping, forward and backward, on the CPU and NVIDIA GPUs.)";

const char* kRootFooter = R"(Each command's flags: gqattn <command> --help.

exit status: 0 ok, 1 a failed check, 2 a usage error, 3 a runtime failure
(out of memory, a CUDA error).

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

const char* kBenchExamples = R"(examples:
  gqattn bench
  gqattn bench --B 4 --T 4096 --H 32 --Hkv 8 --d 128 --window 0 --softcap 0
  gqattn bench --device cpu --T 512 --repeats 5
  gqattn bench --backend cuda-flash --json
)";

// A command's description: its first paragraph is its line in `gqattn
// --help`, the whole text heads `gqattn <command> --help`.
const char* kCheckDescription =
    R"(run forward and backward on random inputs and compare
every output (o, lse, dq, dk, dv) with the f64 oracle;
exit 1 on a failure

Runs on every available backend (or the one --backend names); prints per
backend each output's error, the tolerance, pass or fail, whether a second
run gave the same bits, and the time.)";

const char* kExplainDescription =
    R"(for each backend (and auto): whether it runs the
problem's forward and backward, the plan it would run
(tile, score mode, splits, dQ path, workspace), or why
not; runs nothing

Takes check's problem flags (--varlen and --q-start included; the varlen
lengths are accepted and ignored, a plan does not depend on them; --seed
is accepted and ignored).)";

const char* kInfoDescription =
    R"(build configuration, CUDA devices, backends and why not

Prints the build configuration (version, CUDA runtime and architectures),
the visible CUDA devices, and each backend: available, or why not.)";

const char* kBenchDescription =
    R"(time each backend that runs the problem on one device:
forward and backward ms, TFLOP/s (GFLOP/s on the CPU)
and the ratio to the fastest

Prints, per backend, the forward and backward time per call, the rate
(TFLOP/s on CUDA, GFLOP/s on the CPU) and the time relative to the fastest
backend shown.
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
usage error (exit 2). --no-check-offsets is accepted and changes nothing
(bench checks a varlen batch's offsets once).)";

const char* kCommandsHint = "(commands: check, explain, info, bench, version; see gqattn --help)";
const char* kProblemGroup = "problem flags (check, explain and bench take the same)";
const char* kFlagsGroup = "flags";

// ---- values ---------------------------------------------------------------
// Each throws CLI11's ValidationError, which reads "--flag: <message>".

int64_t parse_int(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw CLI::ValidationError(flag, "expects an integer, got '" + text + "'");
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
    throw CLI::ValidationError(flag, "expects a number, got '" + text + "'");
  if (errno == ERANGE && std::isinf(value))
    throw CLI::ValidationError(flag, text + " is out of the float range");
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
      throw CLI::ValidationError(flag, "expects lengths in [0, 2^31), got " + item);
    out.push_back(int32_t(value));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

gqattn::DType parse_dtype(const std::string& text) {
  if (text == "f32") return gqattn::DType::f32;
  if (text == "f16") return gqattn::DType::f16;
  return gqattn::DType::bf16;  // one_of() let only f32, bf16 and f16 through
}

// A check that the value is one of `values` ("must be cpu or cuda, got
// 'gpu'"); no text of its own in the help (the flag's type says it).
CLI::Validator one_of(const std::vector<std::string>& values) {
  return CLI::Validator(
      [values](std::string& text) {
        if (std::find(values.begin(), values.end(), text) != values.end()) return std::string();
        std::string list;
        for (std::size_t i = 0; i < values.size(); ++i)
          list += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + values[i];
        return "must be " + list + ", got '" + text + "'";
      },
      "");
}

// ---- flags ----------------------------------------------------------------

// An integer flag into `target`, in [least, most]; the help prints the
// value `target` holds now as its default.
template <typename Int>
CLI::Option* add_int(CLI::App& command, const std::string& name, Int& target,
                     const std::string& help, int64_t least = std::numeric_limits<int64_t>::min(),
                     int64_t most = std::numeric_limits<int64_t>::max()) {
  const auto set = [&target, name, least, most](const std::string& text) {
    const int64_t value = parse_int(name, text);
    if (value < least || value > most)
      throw CLI::ValidationError(name, "must be in [" + std::to_string(least) + ", " +
                                           std::to_string(most) + "], got " + text);
    target = static_cast<Int>(value);
  };
  return command.add_option_function<std::string>(name, set, help)
      ->type_name("N")
      ->default_str(std::to_string(target));
}

CLI::Option* add_float(CLI::App& command, const std::string& name, float& target,
                       const std::string& help) {
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", double(target));
  return command
      .add_option_function<std::string>(
          name, [&target, name](const std::string& text) { target = parse_float(name, text); },
          help)
      ->type_name("X")
      ->default_str(shown);
}

// The problem flags that check, explain and bench share, on one command:
// what each flag gives lands here; resolve() then derives the rest (--T,
// the varlen lengths) and refuses flags that do not go together. The
// options keep references into this object: it stays where it is.
struct ProblemFlags {
  CheckArgs args;
  int64_t both_lengths = default_problem().Tq;  // --T
  bool varlen = false, no_check_offsets = false, forward_only = false;
  CLI::Option *B = nullptr, *T = nullptr, *Tq = nullptr, *Tk = nullptr, *seqused_k = nullptr;

  ProblemFlags() = default;
  ProblemFlags(const ProblemFlags&) = delete;
  ProblemFlags& operator=(const ProblemFlags&) = delete;

  void add_to(CLI::App& command);
  CheckArgs resolve() const;
};

void ProblemFlags::add_to(CLI::App& command) {
  gqattn::Problem& p = args.problem;
  gqattn::check::VarlenConfig& v = args.varlen;
  B = add_int(command, "--B", p.B, "batch");
  T = add_int(command, "--T", both_lengths, "sets both --Tq and --Tk; --Tq and --Tk override it");
  Tq = add_int(command, "--Tq", p.Tq, "query length");
  Tk = add_int(command, "--Tk", p.Tk, "key length; queries align to the end");
  add_int(command, "--H", p.H, "query heads");
  add_int(command, "--Hkv", p.Hkv, "key/value heads; H must be a multiple");
  add_int(command, "--d", p.d, "head dimension");
  command
      .add_option_function<std::string>(
          "--causal", [&p](const std::string& text) { p.causal = text == "1"; }, "causal mask")
      ->check(one_of({"0", "1"}))
      ->type_name("0|1")
      ->default_str(p.causal ? "1" : "0");
  add_int(command, "--window", p.window,
          "keys kept per query, self included; 0 = none\n"
          "(FlashAttention window_size=(N-1, 0))");
  add_float(command, "--softcap", p.softcap, "s = X * tanh(s / X); 0 = off");
  command
      .add_option_function<std::string>(
          "--scale", [&p](const std::string& text) { p.scale = parse_float("--scale", text); },
          "score scale")
      ->type_name("X")
      ->default_str("1/sqrt(d)");
  command
      .add_option_function<std::string>(
          "--q-start", [&p](const std::string& text) { p.q_start = parse_int("--q-start", text); },
          "query i sits at key position N + i; any integer,\n"
          "negative or past Tk (Tk - Tq: queries aligned to\n"
          "the end; in a varlen batch, each sequence's own\n"
          "Tk_b - Tq_b)")
      ->type_name("N")
      ->default_str("Tk - Tq");
  command.add_flag("--varlen", varlen,
                   "a packed variable-length batch of B sequences,\n"
                   "lengths drawn from --seed in [0, Tq] and [0, Tk]\n"
                   "(0 and 1 often)");
  CLI::Option* seqlens_q =
      command
          .add_option_function<std::string>(
              "--seqlens-q",
              [&v](const std::string& text) { v.seqlens_q = parse_lengths("--seqlens-q", text); },
              "varlen with these query lengths, e.g. 5,0,1,17\n"
              "(B = their count, Tq = the longest unless --Tq/--T\n"
              "is given); with --seqlens-k")
          ->type_name("L")
          ->default_str("drawn from --seed");
  CLI::Option* seqlens_k =
      command
          .add_option_function<std::string>(
              "--seqlens-k",
              [&v](const std::string& text) { v.seqlens_k = parse_lengths("--seqlens-k", text); },
              "varlen key lengths, e.g. 5,3,1,23 (with --seqlens-q)")
          ->type_name("L")
          ->default_str("drawn from --seed");
  seqlens_q->needs(seqlens_k);
  seqlens_k->needs(seqlens_q);
  seqused_k = command
                  .add_option_function<std::string>(
                      "--seqused-k",
                      [&v](const std::string& text) {
                        v.draw_seqused_k = text == "random";
                        v.seqused_k.clear();
                        if (!v.draw_seqused_k) v.seqused_k = parse_lengths("--seqused-k", text);
                      },
                      "varlen: keys used per sequence, e.g. 5,0,1,20, or\n"
                      "`random`: drawn from --seed, each at most its key\n"
                      "length")
                  ->type_name("L")
                  ->default_str("none");
  command.add_flag("--no-check-offsets", no_check_offsets,
                   "varlen: Options::check_offsets off (offsets on a\n"
                   "CUDA device are not copied and checked before the\n"
                   "call; backends that run sequence by sequence still\n"
                   "read them)");
  command
      .add_option_function<std::string>(
          "--dtype", [this](const std::string& text) { args.dtype = parse_dtype(text); },
          "f32, bf16 or f16")
      ->check(one_of({"f32", "bf16", "f16"}))
      ->type_name("T")
      ->default_str(gqattn::dtype_name(args.dtype));
  add_int(command, "--seed", args.seed, "random seed");
  for (CLI::Option* option : command.get_options())
    if (option != command.get_help_ptr()) option->group(kProblemGroup);
}

CheckArgs ProblemFlags::resolve() const {
  CheckArgs c = args;
  gqattn::Problem& p = c.problem;
  // --T gives both lengths; --Tq and --Tk override it, whatever the order.
  if (T->count() > 0) {
    if (Tq->count() == 0) p.Tq = both_lengths;
    if (Tk->count() == 0) p.Tk = both_lengths;
  }
  c.backward = !forward_only;
  c.varlen.check_offsets = !no_check_offsets;
  // Explicit lengths make a varlen batch of their count, as long as the
  // longest unless the bounds were given.
  bool is_varlen = varlen;
  const auto& lq = c.varlen.seqlens_q;
  const auto& lk = c.varlen.seqlens_k;
  if (!lq.empty()) {
    if (lq.size() != lk.size())
      throw UsageError{"--seqlens-q and --seqlens-k need as many lengths each"};
    is_varlen = true;
    if (B->count() == 0) p.B = int64_t(lq.size());
    if (Tq->count() + T->count() == 0)
      p.Tq = std::max<int64_t>(1, *std::max_element(lq.begin(), lq.end()));
    if (Tk->count() + T->count() == 0)
      p.Tk = std::max<int64_t>(1, *std::max_element(lk.begin(), lk.end()));
  }
  if (!is_varlen && seqused_k->count() > 0) throw UsageError{"--seqused-k needs --varlen"};
  if (!is_varlen && no_check_offsets) throw UsageError{"--no-check-offsets needs --varlen"};
  p.varlen = is_varlen;
  return c;
}

// The commands' flags beside the problem's.
void add_backend_flag(CLI::App& command, ProblemFlags& flags, const std::string& help) {
  command.add_option("--backend", flags.args.backend, help)
      ->type_name("B")
      ->capture_default_str()
      ->group(kFlagsGroup);
}

void add_forward_only_flag(CLI::App& command, ProblemFlags& flags, const std::string& help) {
  command.add_flag("--forward-only", flags.forward_only, help)->group(kFlagsGroup);
}

void add_json_flag(CLI::App& command, bool& json, const std::string& help) {
  command.add_flag("--json", json, help)->group(kFlagsGroup);
}

// -h,--help last in a command's "flags" (CLI11 makes it first, in a group
// of its own).
void add_help_flag(CLI::App& command, const std::string& help) {
  command.set_help_flag();
  command.set_help_flag("-h,--help", help)->group(kFlagsGroup);
}

// CLI11's help in the tool's layout: "usage: gqattn check [flags]" first,
// then the description, each group of flags with its type and, at the end
// of its text, its default, then the footer (examples). A command's line in
// `gqattn --help` is its description's first paragraph.
class HelpFormatter : public CLI::Formatter {
 public:
  static constexpr std::size_t kHelpWidth = 80;
  HelpFormatter() { column_width(24); }

  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    std::string out = "usage: " + name;
    out += app->get_subcommands({}).empty() ? " [flags]\n" : " <command> [flags]\n";
    out += make_description(app);
    out += make_groups(app, mode);
    out += make_subcommands(app, mode);
    out += "\n" + make_footer(app);
    // CLI11 puts two blank lines between groups of flags; one is enough.
    for (std::size_t at; (at = out.find("\n\n\n")) != std::string::npos;) out.erase(at, 1);
    return out;
  }

  std::string make_subcommand(const CLI::App* command) const override {
    const std::string& text = command->get_description();
    return two_columns(command->get_name(), text.substr(0, text.find("\n\n")));
  }

  std::string make_option(const CLI::Option* option, bool is_positional) const override {
    return two_columns(make_option_name(option, is_positional) + make_option_opts(option),
                       make_option_desc(option));
  }

  std::string make_option_opts(const CLI::Option* option) const override {
    return option->get_type_size() == 0 ? "" : " " + option->get_type_name();
  }

  // The text, then "(default: X)" on its last line, or on a line of its
  // own where the last line has no room for it.
  std::string make_option_desc(const CLI::Option* option) const override {
    const std::string text = option->get_description();
    const std::string shown = option->get_default_str();
    if (option->get_type_size() == 0 || shown.empty()) return text;
    const std::string with = "(default: " + shown + ")";
    const std::size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    const bool fits = column_width_ + text.size() - line_start + 1 + with.size() <= kHelpWidth;
    return text + (fits ? " " : "\n") + with;
  }

 private:
  // "  name" padded to the column, then the text, its lines indented to
  // the column (laid out here rather than by CLI11's internal helper,
  // whose layout differs between CLI11 versions).
  std::string two_columns(const std::string& name, const std::string& text) const {
    std::string out = "  " + name;
    if (text.empty()) return out + "\n";
    out += out.size() < column_width_ ? std::string(column_width_ - out.size(), ' ')
                                      : "\n" + std::string(column_width_, ' ');
    for (const char ch : text) {
      out += ch;
      if (ch == '\n') out += std::string(column_width_, ' ');
    }
    return out + "\n";
  }
};

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine line;
  // The flags' storage, one per command, outlives the parse.
  ProblemFlags check_flags, explain_flags, bench_flags;
  bool info_json = false;

  CLI::App app(kDescription, "gqattn");
  app.formatter(std::make_shared<HelpFormatter>());
  // A flag given twice: the last one counts (CLI11's default refuses it).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  const std::string version = "gqattn " + gqattn::build_info().version;
  add_help_flag(app, "this text (also: gqattn help)");
  app.set_version_flag("-V,--version", version, "the version (also: gqattn version)")
      ->group(kFlagsGroup);

  CLI::App* check = app.add_subcommand("check", kCheckDescription);
  check_flags.add_to(*check);
  add_backend_flag(*check, check_flags,
                   "cpu-flash, cpu (the mirror), cuda-unfused,\n"
                   "cuda-flash, cuda-hopper, auto, or all = every\n"
                   "backend available here");
  add_forward_only_flag(*check, check_flags, "skip the backward pass");
  add_json_flag(*check, check_flags.args.json,
                "print JSON on stdout instead of the table, one\n"
                "object per backend and line; progress (\"checking\n"
                "<backend> ...\") goes to stderr either way");
  add_help_flag(*check, "this text");
  check->footer(kExamples);

  CLI::App* explain = app.add_subcommand("explain", kExplainDescription);
  explain_flags.add_to(*explain);
  add_backend_flag(*explain, explain_flags,
                   "a backend (cpu-flash, cpu, cuda-unfused,\n"
                   "cuda-flash, cuda-hopper, auto), or all = every\n"
                   "backend and auto");
  add_forward_only_flag(*explain, explain_flags, "the forward pass only");
  add_json_flag(*explain, explain_flags.args.json,
                "one JSON object on stdout instead of the lines");
  add_help_flag(*explain, "this text");
  explain->footer(kExamples);

  CLI::App* info = app.add_subcommand("info", kInfoDescription);
  add_json_flag(*info, info_json, "one JSON object on stdout instead of the text");
  add_help_flag(*info, "this text");

  CLI::App* bench = app.add_subcommand("bench", kBenchDescription);
  bench_flags.add_to(*bench);
  add_backend_flag(*bench, bench_flags,
                   "a backend (cpu, cpu-flash, cuda-unfused,\n"
                   "cuda-flash, cuda-hopper), auto (the one auto\n"
                   "picks), or all: every backend that runs the\n"
                   "problem on the device");
  bench
      ->add_option("--device", line.bench.device,
                   "cpu (backends cpu, cpu-flash) or cuda (the cuda-*\n"
                   "backends); a named backend's own device")
      ->check(one_of({"cpu", "cuda"}))
      ->type_name("D")
      ->default_str("cuda if a CUDA device is usable, else cpu")
      ->group(kFlagsGroup);
  add_int(*bench, "--repeats", line.bench.repeats, "timed calls per pass", 1, kBenchMaxCalls)
      ->group(kFlagsGroup);
  add_int(*bench, "--warmup", line.bench.warmup, "untimed calls per pass before them", 0,
          kBenchMaxCalls)
      ->group(kFlagsGroup);
  add_forward_only_flag(*bench, bench_flags, "time the forward only");
  add_json_flag(*bench, bench_flags.args.json,
                "one JSON object on stdout instead of the table;\n"
                "progress (\"timing <backend> ...\") goes to stderr\n"
                "either way");
  add_help_flag(*bench, "this text");
  bench->footer(kBenchExamples);

  CLI::App* version_command = app.add_subcommand("version", "the version (same as --version)");
  add_help_flag(*version_command, "this text");
  // `gqattn help`: the same as --help; not listed (no group).
  CLI::App* help_command = app.add_subcommand("help", "this text")->group("");
  add_help_flag(*help_command, "this text");
  for (CLI::App* command : {check, explain, info, bench, version_command})
    command->group("commands");
  // Set after the commands, which would inherit them.
  app.footer(std::string(kRootFooter) + kExamples);
  app.require_subcommand(0, 1);

  // The help of `command` alone (App::help() would show a chosen subcommand's).
  const auto print_help = [](const CLI::App& command, const std::string& name) {
    const std::string text =
        command.get_formatter()->make_help(&command, name, CLI::AppFormatMode::Normal);
    std::fputs(text.c_str(), stdout);
  };
  if (argc <= 1) {
    print_help(app, "gqattn");
    line.exit_status = kExitUsage;
    return line;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    const std::vector<CLI::App*> chosen = app.get_subcommands();
    if (chosen.empty())
      print_help(app, "gqattn");
    else
      print_help(*chosen.front(), "gqattn " + chosen.front()->get_name());
    return line;
  } catch (const CLI::CallForVersion& e) {
    // CLI11 answers --version before it looks at the rest; the tool refused
    // `gqattn --version check` before CLI11 and still does.
    if (argc > 2) throw UsageError{std::string(argv[1]) + " takes no arguments"};
    std::printf("%s\n", e.what());
    return line;
  } catch (const CLI::ParseError& e) {
    const std::vector<CLI::App*> chosen = app.get_subcommands();
    const std::string see = chosen.empty()
                                ? std::string(" ") + kCommandsHint
                                : " (see gqattn " + chosen.front()->get_name() + " --help)";
    throw UsageError{e.what() + see};
  }

  if (check->parsed()) {
    line.command = Command::check;
    line.check = check_flags.resolve();
  } else if (explain->parsed()) {
    line.command = Command::explain;
    line.check = explain_flags.resolve();
  } else if (bench->parsed()) {
    line.command = Command::bench;
    line.check = bench_flags.resolve();
  } else if (info->parsed()) {
    line.command = Command::info;
    line.check.json = info_json;
  } else if (version_command->parsed()) {
    std::printf("%s\n", version.c_str());
  } else if (help_command->parsed()) {
    print_help(app, "gqattn");
  } else {
    throw UsageError{std::string("no command ") + kCommandsHint};
  }
  return line;
}

}  // namespace gqattn_cli
