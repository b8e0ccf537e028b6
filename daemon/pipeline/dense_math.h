// Dense arithmetic of the pipeline: local sums of the workers' buffers into an accumulator and
// the averaged write-back, with float16/bfloat16 accumulated in float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "daemon/common/tensor_meta.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

// The accumulation type of `dtype`: float32 for the 16-bit floats (uint8 is never reduced).
transport::ElementType AccumulatorType(DType dtype);
// True when `dtype` is its own accumulator (the buffer can be reduced in place).
bool AccumulatesInPlace(DType dtype);

// acc[i] = sum over inputs (in order) of inputs[j][i], converted to the accumulator type.
void SumInto(void* acc, std::span<const void* const> inputs, size_t count, DType dtype);
// out[i] = acc[i] / divisor, converted to `dtype` (divisor 1: a plain conversion). Integer
// accumulators are only ever divided by 1.
void WriteBack(const void* acc, size_t count, double divisor, void* out, DType dtype);
// In place: data[i] /= divisor, for a buffer already of the accumulator type.
void DivideInPlace(void* data, size_t count, double divisor, DType dtype);

}  // namespace sparsync::pipeline
