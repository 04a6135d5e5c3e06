// `gqattn bench` (bench_command.cpp).
#pragma once

#include <string>
#include <vector>

namespace gqattn_cli {

// Runs `gqattn bench` with the arguments after the command: 0 ok, 2 usage
// (UsageError thrown), 3 runtime error.
int run_bench(const std::vector<std::string>& args);

}  // namespace gqattn_cli
