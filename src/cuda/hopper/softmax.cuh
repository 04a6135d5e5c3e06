// cuda-hopper: the forward's online softmax is cuda-flash's
// (flash::OnlineSoftmax<1, kLazyLog2>, one m16 tile of rows g and g + 8 per
// thread, lazy rescaling's threshold per head dimension),
// used in two halves by the overlapped main loop of consumer.cuh:
// scores_to_p() turns a score tile into P and returns the per-row rescale
// factors without touching O (which a P V wgmma may still be accumulating),
// rescale() applies them once that wgmma has retired; with kLazyRescale
// (tile_sizes.hpp) only on the tiles where scores_to_p says so, and above
// threshold 0 finalize_compensated() ends the row.
// ScoreMode::softcap_without_row_max (flash/score_mode.hpp) uses
// start_unshifted() and update_unshifted(). Checked against the f64 oracle
// by tests/gpu/test_hopper_forward.cpp.
#pragma once

#include "cuda/flash/softmax.cuh"

namespace gqattn::hopper {

// kLazyLog2: ForwardTile::kLazyRescaleLog2 (tile_sizes.hpp).
template <int kLazyLog2>
using RowSoftmax = flash::OnlineSoftmax<1, kLazyLog2>;
constexpr int kSoftmaxRows = RowSoftmax<0>::kRows;  // rows g and g + 8

}  // namespace gqattn::hopper
