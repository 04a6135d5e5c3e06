// The sequence offsets of a varlen batch (Problem::varlen): their shape
// rules, the host copy and its check, and the batch-of-one views of the
// packed tensors the backends receive (api/backend.hpp). Each failed rule
// throws gqattn::Error naming the argument and the rule. Checked by
// tests/cpu/test_varlen_validation.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "api/backend.hpp"
#include "gqattn/types.hpp"

namespace gqattn::detail {

// Pointers, lengths (B + 1, and B for seqused_k) and device, without
// reading the values.
void validate_offsets_shape(const Problem& problem, const VarlenOffsets& offsets, Device device);

// One int32 vector's pointer, element count and device.
void validate_int32_vector(const char* name, const OffsetsRef& offsets, int64_t size,
                           Device device);

// One int32 vector copied to the host (a synchronisation with `stream` for
// device memory).
std::vector<int32_t> copy_to_host(const OffsetsRef& offsets, void* stream);

// The values, copied to the host (a synchronisation with `stream` for
// device memory).
HostOffsets read_offsets(const VarlenOffsets& offsets, void* stream);

// The values' rules: cu_seqlens start at 0, never decrease and end at the
// totals; no sequence is longer than the problem's Tq (max_seqlen_q) or Tk
// (max_seqlen_k); seqused_k[b] is in [0, keys of sequence b].
void check_offsets(const Problem& problem, const HostOffsets& offsets, int64_t total_q,
                   int64_t total_k);

// A packed [total, heads, d] (or lse's [H, total]) tensor as a batch of one:
// [1, total, heads, d] (or [1, H, total]) with batch stride 0.
TensorRef batch_of_one(const TensorRef& packed);

// The offsets as rank-1 tensors of 4-byte elements, for the memory rule.
TensorRef offsets_tensor(const OffsetsRef& offsets);

}  // namespace gqattn::detail
