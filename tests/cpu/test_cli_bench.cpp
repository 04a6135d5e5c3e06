// `gqattn bench` (tools/main.cpp) run as a process on the CPU device: a row
// with positive rates for cpu and cpu-flash, --json parsed by python3 (as
// the Cli.* JSON tests in tests/CMakeLists.txt do) with its fields and the
// FLOP count from the mask, a named CUDA backend on the CPU device refused
// with its reason, bad flags exit 2 naming the flag, --help exits 0.
// The tool is looked up in the build tree beside this binary
// (<build>/tools/gqattn), or at $GQATTN_CLI; a build without the tool
// (GQATTN_BUILD_TOOL=OFF, e.g. the sanitize preset) skips these, saying so.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

// Tiny shapes: every run takes milliseconds.
const std::string kTiny = " --device cpu --B 1 --T 64 --H 2 --Hkv 1 --d 32 --repeats 2";

std::string tool_path() {
  if (const char* env = std::getenv("GQATTN_CLI")) return env;
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  const fs::path dir = error ? fs::current_path() : exe.parent_path();  // <build>/tests
  const fs::path tool = dir.parent_path() / "tools" / "gqattn";
  return fs::exists(tool) ? tool.string() : std::string();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A file under the test temp dir, unique to this process and test.
fs::path temp_file(const std::string& suffix) {
  const auto* test = testing::UnitTest::GetInstance()->current_test_info();
  return fs::path(testing::TempDir()) /
         ("gqattn_cli_bench_" + std::to_string(getpid()) + "_" + test->name() + suffix);
}

struct Outcome {
  int status = -1;  // the exit status
  std::string out, err;
  fs::path out_path;  // stdout, kept for a parser
};

class CliBench : public testing::Test {
 protected:
  void SetUp() override {
    tool_ = tool_path();
    if (tool_.empty())
      GTEST_SKIP() << "the gqattn tool is not built here (GQATTN_BUILD_TOOL=OFF?); "
                      "set GQATTN_CLI to its path to run these";
  }
  void TearDown() override {
    for (const fs::path& p : made_) fs::remove(p);
  }

  Outcome bench(const std::string& args) {
    Outcome r;
    r.out_path = temp_file(".out");
    const fs::path err = temp_file(".err");
    made_.push_back(r.out_path);
    made_.push_back(err);
    const std::string command = "'" + tool_ + "' bench " + args + " >'" + r.out_path.string() +
                                "' 2>'" + err.string() + "'";
    const int raw = std::system(command.c_str());
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.out = read_file(r.out_path);
    r.err = read_file(err);
    return r;
  }

  // Runs python3 on `script` with `input` on stdin; its exit status.
  int python(const std::string& script, const fs::path& input) {
    const fs::path file = temp_file(".py");
    made_.push_back(file);
    std::ofstream(file) << script;
    const std::string command =
        "python3 '" + file.string() + "' <'" + input.string() + "' 1>&2";  // failures in the log
    const int raw = std::system(command.c_str());
    return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  }

  std::string tool_;
  std::vector<fs::path> made_;
};

TEST_F(CliBench, CpuRowsHavePositiveRates) {
  const Outcome r = bench(kTiny);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("method: cpu: wall clock per call (steady_clock)"), std::string::npos)
      << r.out;
  int rows = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name, fwd_x, bwd_x;
    double fwd_ms = 0, fwd_rate = 0, bwd_ms = 0, bwd_rate = 0;
    fields >> name;
    if (name != "cpu" && name != "cpu-flash") continue;
    ASSERT_TRUE(fields >> fwd_ms >> fwd_rate >> fwd_x >> bwd_ms >> bwd_rate >> bwd_x) << line;
    EXPECT_GT(fwd_ms, 0.0) << line;
    EXPECT_GT(fwd_rate, 0.0) << line;
    EXPECT_GT(bwd_ms, 0.0) << line;
    EXPECT_GT(bwd_rate, 0.0) << line;
    EXPECT_EQ(fwd_x.back(), 'x') << line;
    ++rows;
  }
  EXPECT_EQ(rows, 2) << r.out;
  // Progress on stderr, one line per backend timed.
  EXPECT_NE(r.err.find("timing cpu ..."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("timing cpu-flash ..."), std::string::npos) << r.err;
}

TEST_F(CliBench, JsonParsesWithItsFields) {
  const Outcome r = bench("--json" + kTiny);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  // B1 T64 causal (window 96 keeps all): 64 * 65 / 2 = 2080 pairs per head;
  // forward 4 * d * H * pairs = 4 * 32 * 2 * 2080.
  const std::string script = R"(import json, sys
o = json.load(sys.stdin)
for key in ("problem", "device", "method", "timer", "repeats", "warmup", "threads",
            "input_sets", "kept_pairs", "forward_flops", "backward_flops", "results"):
    assert key in o, key
assert o["device"] == "cpu" and o["timer"] == "steady-clock", o
assert o["repeats"] == 2 and o["warmup"] == 3, o
assert o["kept_pairs"] == 2080 and o["forward_flops"] == 532480, o
assert o["backward_flops"] == 2.5 * 532480, o
rows = {r["backend"]: r for r in o["results"]}
assert set(rows) == {"cpu", "cpu-flash", "cuda-unfused", "cuda-flash", "cuda-hopper"}, rows
for name in ("cpu", "cpu-flash"):
    r = rows[name]
    assert r["ran"] and r["skipped"] == "", r
    for key in ("forward_ms", "forward_tflops", "forward_gflops", "backward_ms",
                "backward_tflops", "backward_gflops"):
        assert r[key] > 0, (key, r)
    assert r["forward_vs_fastest"] >= 1 and r["backward_vs_fastest"] >= 1, r
assert min(rows[n]["forward_vs_fastest"] for n in ("cpu", "cpu-flash")) == 1, rows
for name in ("cuda-unfused", "cuda-flash", "cuda-hopper"):
    r = rows[name]
    assert not r["ran"] and r["skipped"] and r["forward_ms"] is None, r
)";
  EXPECT_EQ(python(script, r.out_path), 0) << "python3 rejected:\n" << r.out;
}

TEST_F(CliBench, VarlenCountsEachSequence) {
  // Sequences (5, 5), (0, 3), (1, 1), causal: 15 + 0 + 1 kept pairs per head.
  const Outcome r = bench(
      "--json --device cpu --backend cpu-flash --forward-only --seqlens-q 5,0,1 "
      "--seqlens-k 5,3,1 --H 2 --Hkv 1 --d 16 --repeats 1 --warmup 0");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const std::string script = R"(import json, sys
o = json.load(sys.stdin)
assert o["kept_pairs"] == 16 and o["forward_flops"] == 4 * 16 * 2 * 16, o
assert o["problem"]["varlen"]["cu_seqlens_q"] == [0, 5, 5, 6], o
[r] = o["results"]
assert r["backend"] == "cpu-flash" and r["forward_ms"] > 0 and r["backward_ms"] is None, r
)";
  EXPECT_EQ(python(script, r.out_path), 0) << "python3 rejected:\n" << r.out;
}

TEST_F(CliBench, CudaBackendOnTheCpuDeviceSaysWhySkipped) {
  // Named: nothing to time, a usage error with explain's reason.
  const Outcome named = bench("--backend cuda-hopper" + kTiny);
  EXPECT_EQ(named.status, 2) << named.out << named.err;
  const std::string said = "cuda-hopper is skipped on the cpu device: ";
  const std::size_t at = named.err.find(said);
  ASSERT_NE(at, std::string::npos) << named.err;
  EXPECT_GT(named.err.size(), at + said.size() + 1) << "no reason given: " << named.err;
  // Among all: listed as skipped, with the reason.
  const Outcome all = bench(kTiny);
  ASSERT_EQ(all.status, 0) << all.out << all.err;
  EXPECT_NE(all.out.find("cuda-hopper   skipped: "), std::string::npos) << all.out;
}

TEST_F(CliBench, BadFlagsExit2NamingTheFlag) {
  const std::pair<std::string, std::string> cases[] = {
      {"--repeats 0", "--repeats"}, {"--repeats=abc", "--repeats"},
      {"--warmup -1", "--warmup"},  {"--device gpu", "--device"},
      {"--bogus 1", "--bogus"},     {"--dtype f8", "--dtype"},
      {"--causal 2", "--causal"},   {"stray", "stray"},
      {"--backend nope", "nope"},   {"--H 3 --Hkv 2 --device cpu", "H = 3"},
  };
  for (const auto& [args, named] : cases) {
    const Outcome r = bench(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(named), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

TEST_F(CliBench, HelpExits0) {
  const Outcome r = bench("--help");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("usage: gqattn bench"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--repeats"), std::string::npos) << r.out;
}

}  // namespace
