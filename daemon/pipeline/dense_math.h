// Dense arithmetic of the pipeline: local sums of the workers' buffers into an accumulator and
// the averaged write-back, with float16/bfloat16 accumulated in float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

// The accumulation type of a wire dtype (sparsync_dtype): float32 for the 16-bit floats.
transport::ElementType AccumulatorType(uint32_t dtype);
// True when the wire dtype is its own accumulator (the buffer can be reduced in place).
bool AccumulatesInPlace(uint32_t dtype);

// acc[i] = sum over inputs (in order) of inputs[j][i], converted to the accumulator type.
void SumInto(void* acc, std::span<const void* const> inputs, size_t count, uint32_t dtype);
// out[i] = acc[i] / divisor, converted to `dtype` (divisor 1: a plain conversion). Integer
// accumulators are only ever divided by 1.
void WriteBack(const void* acc, size_t count, double divisor, void* out, uint32_t dtype);
// In place: data[i] /= divisor, for a buffer already of the accumulator type.
void DivideInPlace(void* data, size_t count, double divisor, uint32_t dtype);

}  // namespace sparsync::pipeline
