// The test and benchmark hook of plan_override.hpp. Checked by
// tests/cpu/test_plan_override.cpp.
#include "api/plan_override.hpp"

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>

#include "gqattn/error.hpp"

namespace gqattn::detail {
namespace {

thread_local PlanOverride current;

int parse_int(const std::string& item, const std::string& value, long lo, long hi,
              const char* rule) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || n < lo || n > hi)
    throw Error("plan override '" + item + "'", rule);
  return int(n);
}

const char* name(DqPath path) {
  switch (path) {
    case DqPath::rule: return "rule";
    case DqPath::fused: return "fused";
    case DqPath::separate: return "separate";
    case DqPath::atomic: return "atomic";
  }
  return "?";
}

const char* name(DkdvTileChoice tile) {
  switch (tile) {
    case DkdvTileChoice::rule: return "rule";
    case DkdvTileChoice::small: return "small";
    case DkdvTileChoice::smaller: return "smaller";
  }
  return "?";
}

}  // namespace

const PlanOverride& plan_override() { return current; }

ScopedPlanOverride::ScopedPlanOverride(const PlanOverride& force) : previous_(current) {
  current = force;
}
ScopedPlanOverride::~ScopedPlanOverride() { current = previous_; }

PlanOverride parse_plan_override(const std::string& text) {
  PlanOverride force;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "splits") {
      force.forward_splits = parse_int(item, value, 1, 16, "splits must be 1 to 16");
    } else if (key == "dkdv_group") {
      force.dkdv_group_pairs =
          parse_int(item, value, 0, 1 << 30, "dkdv_group must be a whole number >= 0");
    } else if (key == "dq") {
      if (value == "fused")
        force.dq_path = DqPath::fused;
      else if (value == "separate")
        force.dq_path = DqPath::separate;
      else if (value == "atomic")
        force.dq_path = DqPath::atomic;
      else
        throw Error("plan override '" + item + "'", "dq must be fused, separate or atomic");
    } else if (key == "dkdv_tile") {
      if (value == "small")
        force.dkdv_tile = DkdvTileChoice::small;
      else if (value == "smaller")
        force.dkdv_tile = DkdvTileChoice::smaller;
      else
        throw Error("plan override '" + item + "'", "dkdv_tile must be small or smaller");
    } else {
      throw Error("plan override '" + item + "'",
                  "must be splits=N, dq=fused|separate|atomic, dkdv_group=N or "
                  "dkdv_tile=small|smaller");
    }
  }
  return force;
}

std::string to_string(const PlanOverride& force) {
  std::string out;
  auto add = [&out](const std::string& item) { out += (out.empty() ? "" : ",") + item; };
  if (force.forward_splits != 0) add("splits=" + std::to_string(force.forward_splits));
  if (force.dq_path != DqPath::rule) add(std::string("dq=") + name(force.dq_path));
  if (force.dkdv_group_pairs != -1) add("dkdv_group=" + std::to_string(force.dkdv_group_pairs));
  if (force.dkdv_tile != DkdvTileChoice::rule)
    add(std::string("dkdv_tile=") + name(force.dkdv_tile));
  return out;
}

}  // namespace gqattn::detail
