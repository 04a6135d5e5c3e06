// Element types: sizes, names and host-side conversion of 16-bit floats.
// Conversions round to nearest even, keep NaN a NaN, and saturate to inf as
// the hardware conversion instructions do.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gqattn/types.hpp"

namespace gqattn {

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);

// Reads element `index` of a buffer of `dtype` as float; writes likewise.
float load_as_float(const void* data, DType dtype, std::size_t index);
void store_from_float(void* data, DType dtype, std::size_t index, float value);

}  // namespace gqattn
