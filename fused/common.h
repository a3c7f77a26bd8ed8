// Shared by the normlab CPU kernels: dtype conversions to and from the compute type (float32, or float64
// for float64 data) written so that GCC vectorizes them inside `omp simd` loops, a vectorizable exp, the
// one-dtype dispatch and streaming stores.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__GLIBC__) && defined(__x86_64__) && defined(NORMLAB_LIBMVEC)
// glibc's vector math library (libmvec) has SIMD versions of expf (8 lanes with AVX2, 16 with AVX-512,
// at most 4 ulp from the exact value); declaring them lets `omp simd` loops call them.
#pragma omp declare simd notinbranch
extern "C" float expf(float);
#endif

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

// exp in the compute type: float goes through expf, which vectorizes with libmvec (see above)
template <typename acc_t>
inline acc_t exp_(acc_t v) {
  if constexpr (std::is_same_v<acc_t, float>) return expf(v);
  else return std::exp(v);
}

// Calls f(T{}) for the floating dtypes the elementwise kernels support.
template <typename F>
void dispatch_floating(at::ScalarType t, const char* kernel, const F& f) {
  if (t == at::kFloat) return f(float{});
  if (t == at::kDouble) return f(double{});
  if (t == at::kBFloat16) return f(at::BFloat16{});
  if (t == at::kHalf) return f(at::Half{});
  TORCH_CHECK(false, "normlab ", kernel, " kernel: unsupported dtype ", t);
}

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
