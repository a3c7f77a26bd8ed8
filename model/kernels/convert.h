// Shared by the normlab CPU kernels: dtype conversions to and from the compute type (float32, or float64
// for float64 data) written so that GCC vectorizes them inside `omp simd` loops.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <cstdint>
#include <cstring>

namespace normlab {

// Conversions to and from the compute type that the compiler can vectorize: c10's bfloat16 ones are
// opaque calls inside `omp simd` loops, which made bfloat16 rows several times slower than float32.
template <typename T>
inline at::opmath_type<T> up(T v) { return static_cast<at::opmath_type<T>>(v); }
inline float up(at::BFloat16 v) {
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
template <typename T>
inline T down(at::opmath_type<T> v) { return static_cast<T>(v); }
template <>
inline at::BFloat16 down<at::BFloat16>(float f) {  // round to nearest even, as c10 does; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return at::BFloat16(static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded),
                      at::BFloat16::from_bits());
}
template <typename T>
inline at::opmath_type<T> round_to(at::opmath_type<T> v) { return up(down<T>(v)); }  // v as T would hold it

}  // namespace normlab
