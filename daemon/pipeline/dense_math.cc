#include "daemon/pipeline/dense_math.h"

#include <cstring>

#include "kernels/dtype.h"

namespace sparsync::pipeline {

using kernels::BFloat16ToFloat;
using kernels::FloatToBFloat16;
using kernels::FloatToHalf;
using kernels::HalfToFloat;

transport::ElementType AccumulatorType(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return transport::ElementType::kFloat64;
    case DType::kInt32: return transport::ElementType::kInt32;
    case DType::kInt64: return transport::ElementType::kInt64;
    default: return transport::ElementType::kFloat32;
  }
}

bool AccumulatesInPlace(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kInt32 ||
         dtype == DType::kInt64;
}

namespace {

template <typename Acc, typename In, typename Convert>
void Sum(Acc* acc, std::span<const void* const> inputs, size_t count, Convert convert) {
  const In* first = static_cast<const In*>(inputs[0]);
  for (size_t i = 0; i < count; ++i) acc[i] = convert(first[i]);
  for (size_t j = 1; j < inputs.size(); ++j) {
    const In* in = static_cast<const In*>(inputs[j]);
    for (size_t i = 0; i < count; ++i) acc[i] += convert(in[i]);
  }
}

template <typename Acc, typename Out, typename Convert>
void Write(const Acc* acc, size_t count, double divisor, Out* out, Convert convert) {
  if (divisor == 1.0) {
    for (size_t i = 0; i < count; ++i) out[i] = convert(acc[i]);
  } else {
    const Acc d = static_cast<Acc>(divisor);
    for (size_t i = 0; i < count; ++i) out[i] = convert(acc[i] / d);
  }
}

template <typename T>
T Same(T v) { return v; }

}  // namespace

void SumInto(void* acc, std::span<const void* const> inputs, size_t count, DType dtype) {
  if (inputs.empty() || count == 0) return;
  switch (dtype) {
    case DType::kFloat32: Sum<float, float>(static_cast<float*>(acc), inputs, count, Same<float>); break;
    case DType::kFloat64: Sum<double, double>(static_cast<double*>(acc), inputs, count, Same<double>); break;
    case DType::kInt32: Sum<int32_t, int32_t>(static_cast<int32_t*>(acc), inputs, count, Same<int32_t>); break;
    case DType::kInt64: Sum<int64_t, int64_t>(static_cast<int64_t*>(acc), inputs, count, Same<int64_t>); break;
    case DType::kFloat16: Sum<float, uint16_t>(static_cast<float*>(acc), inputs, count, HalfToFloat); break;
    case DType::kBFloat16: Sum<float, uint16_t>(static_cast<float*>(acc), inputs, count, BFloat16ToFloat); break;
    case DType::kUInt8: break;  // never reduced (the intake refuses it)
  }
}

void WriteBack(const void* acc, size_t count, double divisor, void* out, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: Write(static_cast<const float*>(acc), count, divisor, static_cast<float*>(out), Same<float>); break;
    case DType::kFloat64: Write(static_cast<const double*>(acc), count, divisor, static_cast<double*>(out), Same<double>); break;
    case DType::kInt32: Write(static_cast<const int32_t*>(acc), count, 1.0, static_cast<int32_t*>(out), Same<int32_t>); break;
    case DType::kInt64: Write(static_cast<const int64_t*>(acc), count, 1.0, static_cast<int64_t*>(out), Same<int64_t>); break;
    case DType::kFloat16: Write(static_cast<const float*>(acc), count, divisor, static_cast<uint16_t*>(out), FloatToHalf); break;
    case DType::kBFloat16: Write(static_cast<const float*>(acc), count, divisor, static_cast<uint16_t*>(out), FloatToBFloat16); break;
    case DType::kUInt8: break;  // never reduced (the intake refuses it)
  }
}

void DivideInPlace(void* data, size_t count, double divisor, DType dtype) {
  if (divisor == 1.0) return;
  if (dtype == DType::kFloat64) {
    double* d = static_cast<double*>(data);
    for (size_t i = 0; i < count; ++i) d[i] /= divisor;
  } else if (dtype == DType::kFloat32) {
    float* f = static_cast<float*>(data);
    const float div = static_cast<float>(divisor);
    for (size_t i = 0; i < count; ++i) f[i] /= div;
  }
}

}  // namespace sparsync::pipeline
