// Forcing a fused backend's plan, for tests and benchmarks only.
//
// Each fused backend decides its plan (tile, split count, dQ path, grid
// order, ...) once per call from the problem and the device. A test that
// must run a path its small shapes would never take, or a benchmark that
// compares two paths, sets a PlanOverride for the calls it makes on this
// thread through ScopedPlanOverride. It is not part of the public API, and
// no environment variable reaches it: the benchmark's --force flag goes
// through parse_plan_override, the one parser. A backend that cannot honour
// a forced field refuses the call, naming the field (why_not), rather than
// running something else.
#pragma once

#include <string>

namespace gqattn::detail {

// How dQ is formed in a backward.
enum class DqPath {
  rule,      // the backend's measured rule (not forced)
  fused,     // dK/dV kernel adds dQ into an f32 accumulator, in a fixed order
  separate,  // a separate dQ kernel recomputes S and dP
  atomic,    // fused, adds in hardware order (cuda-flash; needs deterministic = false)
};

// cuda-flash's dK/dV tile.
enum class DkdvTileChoice {
  rule,     // the largest tile that fits the device's shared memory
  small,    // d's small tile (or its smallest, where d has none that small)
  smaller,  // d's smaller tile (or its smallest)
};

struct PlanOverride {
  int forward_splits = 0;                           // cuda-hopper: 0 = rule; 1..16 exactly
  int dkdv_group_pairs = -1;                        // cuda-hopper: -1 = rule; 0 = key-tile major
  DqPath dq_path = DqPath::rule;                    // cuda-hopper (fused, separate), cuda-flash
  DkdvTileChoice dkdv_tile = DkdvTileChoice::rule;  // cuda-flash

  bool any() const {
    return forward_splits != 0 || dkdv_group_pairs != -1 || dq_path != DqPath::rule ||
           dkdv_tile != DkdvTileChoice::rule;
  }
};

// The override in force on this thread (all fields "rule" when none is).
const PlanOverride& plan_override();

// Sets the override for this thread until destroyed (restores the previous).
class ScopedPlanOverride {
 public:
  explicit ScopedPlanOverride(const PlanOverride& force);
  ~ScopedPlanOverride();
  ScopedPlanOverride(const ScopedPlanOverride&) = delete;
  ScopedPlanOverride& operator=(const ScopedPlanOverride&) = delete;

 private:
  PlanOverride previous_;
};

// "splits=3,dq=separate,dkdv_group=0,dkdv_tile=small" (any subset, comma
// separated; "" forces nothing). Throws gqattn::Error naming the bad item.
PlanOverride parse_plan_override(const std::string& text);
// The inverse, for records: "" when nothing is forced.
std::string to_string(const PlanOverride& force);

}  // namespace gqattn::detail
