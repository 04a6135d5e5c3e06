// spin_ahead: a GPU spin queued in front of a timed call, so that the call's
// CUDA events time the GPU alone. Without it the start event is recorded on
// an idle stream (every timed call follows a synchronisation) and fires at
// once, and the host's time to launch the call (argument checks, workspace,
// the launches) is inside the measured window: 0.1-0.5 ms for a PyTorch
// forward call and 0.3-1.3 ms for a backward in bursts, more after an idle
// pause, against gqattn's 0.01-0.07 (2026-12-04, forty-eighth to fiftieth
// runs, docs/performance.md). The spin keeps the GPU busy while the host
// queues start event, call and stop event behind it.
// Checked by bench/side_by_side.py's runs: gqattn_bench reports, per pass,
// how many timed calls the host took longer to queue than the spin lasted
// ("fwd_spin_short" / "bwd_spin_short"; those calls include host time).
#pragma once

#include <cuda_runtime_api.h>

namespace gqattn_bench {

// One thread spins on the GPU's global timer for `microseconds` (a one-
// thread kernel draws next to nothing: the GPU stays as rested as idle).
cudaError_t spin_ahead(cudaStream_t stream, int microseconds);

}  // namespace gqattn_bench
