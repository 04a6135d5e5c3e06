// `gqattn bench` (bench_command.cpp); its flags are parsed by
// command_line.cpp.
#pragma once

#include "cli_args.hpp"

namespace gqattn_cli {

// Times the problem `c` on the backends it names, as `b` says: 0 ok; a
// problem or backend that cannot run throws UsageError or gqattn::Error
// (exit 2); a failure while running returns kExitRuntime.
int run_bench(const CheckArgs& c, const BenchArgs& b);

}  // namespace gqattn_cli
