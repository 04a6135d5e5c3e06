// cpu-flash's passes (docs/backends/cpu-flash.md): the FlashAttention
// algorithm on the host, query blocks by key blocks with an online softmax,
// never a Tq x Tk matrix (the forward's memory is O(block) per thread, the
// backward's fused pass O(Tk), capped). Checked against the f64 oracle, for
// determinism and for fully written outputs by tests/cpu/test_cpu_flash.cpp.
#pragma once

#include "api/backend.hpp"

namespace gqattn::cpu_flash {

void forward(const detail::ForwardArgs& args);
void backward(const detail::BackwardArgs& args);
// Varlen batches, sequence by sequence from args.host_offsets (varlen.cpp).
void varlen_forward(const detail::ForwardArgs& args);
void varlen_backward(const detail::BackwardArgs& args);

}  // namespace gqattn::cpu_flash
