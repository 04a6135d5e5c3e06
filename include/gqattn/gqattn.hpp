// gqattn: exact attention with grouped-query heads, causal and sliding-window
// masks and logit soft-capping, forward and backward, on the CPU and NVIDIA GPUs.
#pragma once

#include "gqattn/attention.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"
#include "gqattn/types.hpp"
#include "gqattn/version.hpp"
