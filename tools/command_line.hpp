// The gqattn command line (command_line.cpp, on CLI11): which command runs,
// on which arguments. Checked through the Cli tests (tests/CMakeLists.txt)
// and tests/cpu/test_cli_bench.cpp.
#pragma once

#include "cli_args.hpp"

namespace gqattn_cli {

enum class Command { none, check, explain, info, bench };

struct CommandLine {
  Command command = Command::none;  // none: help or the version was printed
  int exit_status = 0;              // with Command::none, what main() returns
  CheckArgs check;                  // check, explain and bench; info reads only check.json
  BenchArgs bench;
};

// Parses the command line. Help (--help, -h, `gqattn help`, or no command
// at all, which exits 2) and the version (--version, -V, `gqattn version`)
// are printed here, on stdout. A bad command line (an unknown command or
// flag, a bad value, flags that do not go together) throws UsageError,
// its message naming the flag.
CommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace gqattn_cli
