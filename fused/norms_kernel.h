// The row loops of the fused norms (RMSNorm and LayerNorm, forward and backward), written once with explicit
// vectors and compiled once per instruction set (norms_isa_*.cpp include this file inside a namespace of their
// own, under `#pragma GCC target`); norms_cpu.cpp picks one at run time and runs it on ranges of rows.
//
// Why explicit vectors (GCC vector extensions) rather than `omp simd` loops: GCC ends an `omp simd` reduction
// with one scalar add per lane, per row and per sum, which at the default model's rows of 128 cost as much as
// the row itself. Here every loop works on vectors of the instruction set's width (NORMLAB_VEC_BYTES: 64 for
// AVX-512, 32 for AVX2, 16 otherwise; GCC 12 expands wider ones element by element).
//
// How the loops are laid out, and why:
// - Every row sum runs on four independent vector accumulators (added in a fixed tree at the end): one
//   accumulator makes each add wait for the previous one (4 cycles), and GCC kept a lone accumulator in memory,
//   so each add also waited for a store to be forwarded; that made a row's sum the bottleneck of the forward.
// - 16-bit rows (bfloat16, half) are converted to float once per row, into float buffers in L1 that the later
//   passes read, and the gain (and bias) once per call; the first pass over a row does the conversion and its
//   sum together.
// - bfloat16 <-> float conversions use the instruction set's integer shifts and packs (AVX2, AVX-512); the
//   rounding is to nearest even with NaN kept a NaN, as c10 rounds.
// - float32 outputs of 32 MiB and more are written with streaming stores (larger than the caches anyway): they
//   skip reading each destination line before overwriting it, a third of a norm's memory traffic; the input
//   rows two ahead are prefetched meanwhile.
// - The backward's first pass computes both row sums and adds the row's share of the gain gradient (into the
//   thread's float buffer, in L1); its second pass writes dx.
//
// Precision policy (model/norms.py): statistics and normalization in float32 (float64 for float64 input),
// xhat rounded to the input dtype, then the gain (and bias) with one rounding to the output dtype.
//
// Included by norms_isa.h, inside a namespace per instruction set, after every header it needs (so that none
// of them is compiled under that instruction set's target).

namespace kernel {

// the vector width of the instruction set this copy is compiled for: GCC splits wider vectors element by element
#if !defined(NORMLAB_VEC_BYTES)
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define NORMLAB_VEC_BYTES 64
#elif defined(__AVX2__)
#define NORMLAB_VEC_BYTES 32
#else
#define NORMLAB_VEC_BYTES 16
#endif
#endif

// x86 intrinsics for what GCC's generic vectors do slowly (16-bit conversions, streaming stores): every copy
// with 32- or 64-byte vectors has AVX2 or AVX-512 F/BW (see above and norms_isa_*.cpp)
#if defined(__x86_64__) && defined(__GNUC__)
#define NORMLAB_X86 NORMLAB_VEC_BYTES
#else
#define NORMLAB_X86 0
#endif

template <typename A>
struct VecOf {
  typedef A type __attribute__((vector_size(NORMLAB_VEC_BYTES)));
};
template <typename A>
using Vec = typename VecOf<A>::type;
template <typename A>
constexpr int64_t kLanes = NORMLAB_VEC_BYTES / sizeof(A);

typedef float VF __attribute__((vector_size(NORMLAB_VEC_BYTES)));
typedef uint16_t U16s __attribute__((vector_size(NORMLAB_VEC_BYTES / 2)));  // one VF of 16-bit values
typedef uint32_t U32s __attribute__((vector_size(NORMLAB_VEC_BYTES)));
constexpr int64_t kF = NORMLAB_VEC_BYTES / 4;  // float lanes

template <typename To, typename From>
inline To bit_cast(const From& v) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}

template <typename T>
constexpr bool k16bit = std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;
template <typename x_t>
using acc_of = std::conditional_t<std::is_same_v<x_t, double>, double, float>;

// ---- plain vector loads and stores of the compute type ----
template <typename A>
inline Vec<A> vload(const A* p) {
  Vec<A> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename A>
inline void vstore(A* p, Vec<A> v) { std::memcpy(p, &v, sizeof v); }

// ---- float <-> bfloat16 bits, round to nearest even, NaN stays NaN (0x7FC0), as c10 ----
inline uint32_t bf16_bits(float f) {
  const uint32_t u = bit_cast<uint32_t>(f);
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}
inline U32s bf16_bits(VF f) {
  const U32s u = bit_cast<U32s>(f);
  const U32s rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? U32s{} + 0x7FC0u : rounded;
}

// ---- 16-bit vectors as float ----
inline VF load_f(const c10::BFloat16* p) {  // bfloat16 is the top half of a float
#if NORMLAB_X86 == 64
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
#elif NORMLAB_X86 == 32
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
#else
  U16s h;
  std::memcpy(&h, p, sizeof h);
  return bit_cast<VF>(__builtin_convertvector(h, U32s) << 16);
#endif
}
inline VF load_f(const c10::Half* p) {
#if NORMLAB_X86 == 64
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#elif NORMLAB_X86 == 32
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
  float f[kF];
  for (int i = 0; i < kF; ++i) f[i] = static_cast<float>(p[i]);
  return vload(f);
#endif
}
inline void store_f(c10::BFloat16* p, VF v) {
#if NORMLAB_X86 == 64
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(r));
#elif NORMLAB_X86 == 32
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);  // lanes 0-3, 4-7 together
  _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(packed));
#else
  const U16s h = __builtin_convertvector(bf16_bits(v), U16s);
  std::memcpy(p, &h, sizeof h);
#endif
}
inline void store_f(c10::Half* p, VF v) {
#if NORMLAB_X86 == 64
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
#elif NORMLAB_X86 == 32
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
#else
  for (int i = 0; i < kF; ++i) p[i] = static_cast<c10::Half>(v[i]);
#endif
}

// ---- any dtype, as its compute type: a vector at p, or the scalar at p ----
template <typename A>
inline Vec<A> load_v(const A* p) { return vload(p); }
inline VF load_v(const c10::BFloat16* p) { return load_f(p); }
inline VF load_v(const c10::Half* p) { return load_f(p); }
template <typename A>
inline A load_s(const A* p) { return *p; }
inline float load_s(const c10::BFloat16* p) { return bit_cast<float>(static_cast<uint32_t>(p->x) << 16); }
inline float load_s(const c10::Half* p) { return static_cast<float>(*p); }
template <typename A>
inline void store_v(A* p, Vec<A> v) { vstore(p, v); }
inline void store_v(c10::BFloat16* p, VF v) { store_f(p, v); }
inline void store_v(c10::Half* p, VF v) { store_f(p, v); }
template <typename A>
inline void store_s(A* p, A v) { *p = v; }
inline void store_s(c10::BFloat16* p, float v) { p->x = static_cast<uint16_t>(bf16_bits(v)); }
inline void store_s(c10::Half* p, float v) { *p = static_cast<c10::Half>(v); }

// a float vector stored with a non-temporal (streaming) store; p aligned to the vector
inline void stream_v(float* p, VF v) {
#if NORMLAB_X86 == 64
  _mm512_stream_ps(p, v);
#elif NORMLAB_X86 == 32
  _mm256_stream_ps(p, v);
#elif defined(__SSE2__)
  _mm_stream_ps(p, v);
#else
  vstore(p, v);
#endif
}
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// v as dtype T would hold it (the reference's .type_as(x) before the gain)
template <typename T, typename V>
inline V round_to(V v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if constexpr (std::is_same_v<V, float>) {
      return bit_cast<float>(bf16_bits(v) << 16);
    } else {  // the top half rounded to nearest even in place; a NaN stays itself
#if NORMLAB_X86 == 64
      const __m512i u = _mm512_castps_si512(v);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      const __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb),
                                         _mm512_set1_epi32(int(0xFFFF0000u)));
      return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
#elif NORMLAB_X86 == 32
      const __m256i u = _mm256_castps_si256(v);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb),
                                         _mm256_set1_epi32(int(0xFFFF0000u)));
      return _mm256_blendv_ps(_mm256_castsi256_ps(r), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
#else
      return bit_cast<VF>(bf16_bits(v) << 16);
#endif
    }
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    if constexpr (std::is_same_v<V, float>) {
      return static_cast<float>(static_cast<c10::Half>(v));
    } else {
#if NORMLAB_X86 == 64
      return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
#elif NORMLAB_X86 == 32
      return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
#else
      for (int i = 0; i < kF; ++i) v[i] = static_cast<float>(static_cast<c10::Half>(v[i]));
      return v;
#endif
    }
  } else {
    return v;
  }
}

// the lanes of a vector added in a fixed tree, halves first (through an array: the vector itself stays in a
// register in the loop before)
template <typename A>
inline A hsum(Vec<A> v) {
  constexpr int n = kLanes<A>;
  A a[n];
  std::memcpy(a, &v, sizeof a);
  for (int w = n / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}

// Four vector sums at once, in a fixed order: block k of a row goes to accumulator k % 4 (while four blocks
// remain, then the rest to the first), the accumulators are added as (0 + 1) + (2 + 3), then the lanes.
template <typename A, int kSums>
struct Sums {
  Vec<A> acc[kSums][4] = {};
  A tail[kSums] = {};
  A total(int s) const { return hsum<A>((acc[s][0] + acc[s][1]) + (acc[s][2] + acc[s][3])) + tail[s]; }
};

// f(vector tag, j, k) for every block j with accumulator k (a compile-time constant: the accumulators stay in
// registers), then f(scalar tag, j) on every tail element.
struct VecTag {};
struct ScalarTag {};
template <typename A, typename F>
inline void row_blocks(int64_t d, const F& f) {
  constexpr int64_t L = kLanes<A>;
  int64_t j = 0;
  using K0 = std::integral_constant<int, 0>;
  for (; j + 4 * L <= d; j += 4 * L) {
    f(VecTag{}, j, K0{});
    f(VecTag{}, j + L, std::integral_constant<int, 1>{});
    f(VecTag{}, j + 2 * L, std::integral_constant<int, 2>{});
    f(VecTag{}, j + 3 * L, std::integral_constant<int, 3>{});
  }
  for (; j + L <= d; j += L) f(VecTag{}, j, K0{});
  for (; j < d; ++j) f(ScalarTag{}, j, K0{});
}

// the sums of f over a row: f(tag, j) returns a vector (VecTag) or a scalar (ScalarTag) per sum, as an array
template <typename A, int kSums, typename F>
inline Sums<A, kSums> row_sums(int64_t d, const F& f) {
  Sums<A, kSums> s;
  row_blocks<A>(d, [&](auto t, int64_t j, auto k) {
    const auto v = f(t, j);
    for (int i = 0; i < kSums; ++i) {
      if constexpr (std::is_same_v<decltype(t), VecTag>) s.acc[i][decltype(k)::value] += v[i];
      else s.tail[i] += v[i];
    }
  });
  return s;
}

template <typename V, int n>
struct Arr {
  V v[n];
  const V& operator[](int i) const { return v[i]; }
};

// A row of dtype T as the compute type A: T's own memory, or (16-bit T) a float copy the caller fills.
// Converts a whole vector of dtype T (a plain load for the compute type).
template <typename A, typename T, typename Tag>
inline auto ld(Tag, const T* p) {
  if constexpr (std::is_same_v<Tag, VecTag>) return load_v(p);
  else return load_s(p);
}
template <typename T, typename Tag, typename V>
inline void st(Tag, T* p, V v) {
  if constexpr (std::is_same_v<Tag, VecTag>) store_v(p, v);
  else store_s(p, v);
}

// n values of dtype T as the compute type A, into dst (a no-op pointer pass-through for T == A)
template <typename A, typename T>
inline const A* as_acc(const T* src, A* dst, int64_t n) {
  if constexpr (std::is_same_v<T, A>) {
    return src;
  } else {
    row_blocks<A>(n, [&](auto t, int64_t j, auto) { st<A>(t, dst + j, ld<A>(t, src + j)); });
    return dst;
  }
}

// Rows much larger than the caches (where outputs are streamed): while the last pass over a row runs from L1,
// its input rows `prefetch_rows` ahead (at least 4 KiB ahead) are prefetched, so that memory stays busy
// between one row's first pass and the next's (the hardware's stream prefetchers stop with the reads).
inline int64_t prefetch_rows(int64_t row_bytes) { return std::max<int64_t>(2, 4096 / std::max<int64_t>(row_bytes, 1)); }

// Forward over rows [begin, end): y = round_to<x_t>((x - mean) * rstd) * w (+ b), rstd / mean per row.
template <bool kCenter, typename x_t, typename w_t, typename o_t>
void forward(const x_t* x, const w_t* w_in, const w_t* b_in, o_t* y, acc_of<x_t>* rstd, acc_of<x_t>* means,
             int64_t d, double eps, int64_t begin, int64_t end, bool stream) {
  using A = acc_of<x_t>;
  constexpr bool k16 = k16bit<x_t>;
  // float buffers: the gain, the bias (converted once), and a 16-bit row as float
  std::vector<A> buffer((k16bit<w_t> ? 2 * d : 0) + (k16 ? d : 0));
  const A* w = w_in ? as_acc<A>(w_in, buffer.data(), d) : nullptr;
  const A* b = b_in ? as_acc<A>(b_in, buffer.data() + d, d) : nullptr;
  A* xf = buffer.data() + (k16bit<w_t> ? 2 * d : 0);
  stream = stream && std::is_same_v<o_t, float>;
  const int64_t ahead = prefetch_rows(d * sizeof(x_t));
  for (int64_t r = begin; r < end; ++r) {
    const x_t* xr = x + r * d;
    o_t* yr = y + r * d;
    A mean = 0, ss = 0;
    const A* xa;
    // first pass: the 16-bit row to float, with its sum (LayerNorm) or sum of squares (RMSNorm)
    if constexpr (k16) {
      const auto s = row_sums<A, 1>(d, [&](auto t, int64_t j) {
        const auto v = ld<A>(t, xr + j);
        st<A>(t, xf + j, v);
        return Arr<decltype(v), 1>{{kCenter ? v : v * v}};
      });
      (kCenter ? mean : ss) = s.total(0);
      xa = xf;
    } else {
      const auto s = row_sums<A, 1>(d, [&](auto t, int64_t j) {
        const auto v = ld<A>(t, xr + j);
        return Arr<decltype(v), 1>{{kCenter ? v : v * v}};
      });
      (kCenter ? mean : ss) = s.total(0);
      xa = xr;
    }
    if constexpr (kCenter) {
      mean /= d;
      ss = row_sums<A, 1>(d, [&](auto t, int64_t j) {
             const auto v = ld<A>(t, xa + j) - mean;
             return Arr<decltype(v), 1>{{v * v}};
           }).total(0);
    }
    const A rs = A(1) / std::sqrt(ss / d + static_cast<A>(eps));
    rstd[r] = rs;
    means[r] = mean;
    const int64_t pf = stream && r + ahead < end ? ahead * d : 0;
    auto out = [&](auto t, int64_t j) {
      if (pf && (j * sizeof(x_t)) % 64 == 0) __builtin_prefetch(xr + pf + j);
      auto v = (ld<A>(t, xa + j) - mean) * rs;
      if (w) v = round_to<x_t>(v) * ld<A>(t, w + j);
      if (b) v = round_to<o_t>(v) + ld<A>(t, b + j);
      return v;
    };
    if constexpr (std::is_same_v<o_t, float>) {
      if (stream && reinterpret_cast<uintptr_t>(yr) % NORMLAB_VEC_BYTES == 0) {
        row_blocks<A>(d, [&](auto t, int64_t j, auto) {
          if constexpr (std::is_same_v<decltype(t), VecTag>) stream_v(yr + j, out(t, j));
          else yr[j] = out(t, j);
        });
        continue;
      }
    }
    row_blocks<A>(d, [&](auto t, int64_t j, auto) { st<o_t>(t, yr + j, out(t, j)); });
  }
  if (stream) stream_fence();
}

// Backward over rows [begin, end): dx = rstd * (g*w - c0 - xhat * c1), c0 = mean(g*w) (LayerNorm only),
// c1 = mean(g*w * xhat); dw += g * round_to<x_t>(xhat) and db += g into this thread's float buffers.
template <bool kCenter, typename x_t, typename w_t, typename g_t>
void backward(const g_t* g, const x_t* x, const w_t* w_in, const acc_of<x_t>* rstd, const acc_of<x_t>* means,
              x_t* dx, acc_of<x_t>* dw, acc_of<x_t>* db, int64_t d, int64_t begin, int64_t end, bool stream) {
  using A = acc_of<x_t>;
  constexpr bool k16 = k16bit<x_t> || k16bit<g_t>;
  std::vector<A> buffer((k16bit<w_t> ? d : 0) + (k16 ? 2 * d : 0));
  const A* w = w_in ? as_acc<A>(w_in, buffer.data(), d) : nullptr;
  A* gwf = buffer.data() + (k16bit<w_t> ? d : 0);  // 16-bit rows: g*w and xhat in float
  A* xhf = gwf + d;
  stream = stream && std::is_same_v<x_t, float>;
  const int64_t ahead = prefetch_rows(d * sizeof(x_t));
  for (int64_t r = begin; r < end; ++r) {
    const x_t* xr = x + r * d;
    const g_t* gr = g + r * d;
    x_t* dxr = dx + r * d;
    const A rs = rstd[r], mean = kCenter ? means[r] : A(0);
    // first pass: c0, c1 and the gain / bias gradients (16-bit rows: g*w and xhat kept in float)
    const auto s = row_sums<A, 2>(d, [&](auto t, int64_t j) {
      const auto gj = ld<A>(t, gr + j);
      const auto xh = (ld<A>(t, xr + j) - mean) * rs;
      const auto gw = w ? gj * ld<A>(t, w + j) : gj;
      if (dw) st<A>(t, dw + j, ld<A>(t, dw + j) + gj * round_to<x_t>(xh));
      if (db) st<A>(t, db + j, ld<A>(t, db + j) + gj);
      if constexpr (k16) {
        st<A>(t, gwf + j, gw);
        st<A>(t, xhf + j, xh);
      }
      return Arr<decltype(gj), 2>{{gw, gw * xh}};  // RMSNorm: the first sum is never read
    });
    const A c0 = kCenter ? s.total(0) / d : A(0);
    const A c1 = s.total(1) / d;
    // second pass: dx
    const int64_t pf = stream && r + ahead < end ? ahead * d : 0;
    auto out = [&](auto t, int64_t j) {
      if (pf && (j * sizeof(x_t)) % 64 == 0) {
        __builtin_prefetch(xr + pf + j);
        __builtin_prefetch(gr + pf + j);
      }
      if constexpr (k16) {
        return rs * (ld<A>(t, gwf + j) - c0 - ld<A>(t, xhf + j) * c1);
      } else {
        const auto gj = ld<A>(t, gr + j);
        const auto gw = w ? gj * ld<A>(t, w + j) : gj;
        return rs * (gw - c0 - (ld<A>(t, xr + j) - mean) * rs * c1);
      }
    };
    if constexpr (std::is_same_v<x_t, float>) {
      if (stream && reinterpret_cast<uintptr_t>(dxr) % NORMLAB_VEC_BYTES == 0) {
        row_blocks<A>(d, [&](auto t, int64_t j, auto) {
          if constexpr (std::is_same_v<decltype(t), VecTag>) stream_v(dxr + j, out(t, j));
          else dxr[j] = out(t, j);
        });
        continue;
      }
    }
    row_blocks<A>(d, [&](auto t, int64_t j, auto) { st<x_t>(t, dxr + j, out(t, j)); });
  }
  if (stream) stream_fence();
}

// The entry points for norms_cpu.cpp: the dtype and centring switch, then the loops above.
inline void forward_rows(const normlab::FwdCall& c, int64_t begin, int64_t end) {
  normlab::dispatch_norm(c.x_type, c.w_type, [&](auto x0, auto w0, auto o0) {
    using x_t = decltype(x0);
    using w_t = decltype(w0);
    using o_t = decltype(o0);
    auto run = [&](auto center) {
      kernel::forward<decltype(center)::value>(
          static_cast<const x_t*>(c.x), static_cast<const w_t*>(c.w), static_cast<const w_t*>(c.b),
          static_cast<o_t*>(c.y), static_cast<acc_of<x_t>*>(c.rstd), static_cast<acc_of<x_t>*>(c.mean), c.d, c.eps,
          begin, end, c.stream);
    };
    c.center ? run(std::true_type{}) : run(std::false_type{});
  });
}

inline void backward_rows(const normlab::BwdCall& c, int64_t begin, int64_t end, void* dw, void* db) {
  normlab::dispatch_norm(c.x_type, c.w_type, [&](auto x0, auto w0, auto o0) {
    using x_t = decltype(x0);
    using w_t = decltype(w0);
    using o_t = decltype(o0);
    using A = acc_of<x_t>;
    auto run = [&](auto center) {
      kernel::backward<decltype(center)::value>(
          static_cast<const o_t*>(c.g), static_cast<const x_t*>(c.x), static_cast<const w_t*>(c.w),
          static_cast<const A*>(c.rstd), static_cast<const A*>(c.mean), static_cast<x_t*>(c.dx), static_cast<A*>(dw),
          static_cast<A*>(db), c.d, begin, end, c.stream);
    };
    c.center ? run(std::true_type{}) : run(std::false_type{});
  });
}

}  // namespace kernel
