// Shared by the normlab CPU kernels: dtype conversions to and from the compute type (float32, or float64
// for float64 data) written so that GCC vectorizes them inside `omp simd` loops.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// dst[0:n] = src[0:n] with non-temporal (streaming) stores where the CPU has them: for outputs much larger
// than the caches, this skips reading every destination line into the cache before overwriting it (a third
// of a norm's memory traffic). Call stream_fence() before other threads may read dst.
inline void stream_floats(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if defined(__AVX__)
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 31u); ++i) dst[i] = src[i];
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#elif defined(__SSE2__)
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15u); ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
  for (; i < n; ++i) dst[i] = src[i];
}

inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace normlab
