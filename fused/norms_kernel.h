// The row loops of the fused norms (RMSNorm and LayerNorm, forward and backward), written once with explicit
// vectors and compiled once per instruction set (norms_isa_*.cpp include this file inside a namespace of their
// own, under `#pragma GCC target`); norms_cpu.cpp picks one at run time and runs it on ranges of rows.
//
// Why explicit vectors (GCC vector extensions) rather than `omp simd` loops: GCC ends an `omp simd` reduction
// with one scalar add per lane (32 for bfloat16 rows), per row and per sum, which at the default model's rows
// of 128 cost as much as the row itself; and its fused dw += g * xhat loop ran 4x slower than the same loop
// without the store. Here every loop works on vectors of the instruction set's width (NORMLAB_VEC_BYTES: 64
// for AVX-512, 32 for AVX2, 16 otherwise; GCC 12 expands wider ones element by element), sums into one vector
// accumulator and adds its lanes in a fixed tree; the gain gradient is accumulated over blocks of rows, so its
// per-thread buffer is read and written once per block instead of once per row.
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

template <typename A>
struct VecOf {
  typedef A type __attribute__((vector_size(NORMLAB_VEC_BYTES)));
};
template <typename A>
using Vec = typename VecOf<A>::type;
template <typename A>
constexpr int64_t kLanes = NORMLAB_VEC_BYTES / sizeof(A);

typedef uint16_t U16s __attribute__((vector_size(NORMLAB_VEC_BYTES / 2)));  // one Vec<float> of bfloat16
typedef uint32_t U32s __attribute__((vector_size(NORMLAB_VEC_BYTES)));

struct VecTag {};
struct ScalarTag {};

template <typename To, typename From>
inline To bit_cast(const From& v) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}

// ---- loads: n elements of a dtype as its compute type (float, or double for double) ----
template <typename A>
inline Vec<A> load(VecTag, const A* p) {
  Vec<A> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline Vec<float> load(VecTag, const c10::BFloat16* p) {  // bfloat16 is the top half of a float
  U16s h;
  std::memcpy(&h, p, sizeof h);
  return bit_cast<Vec<float>>(__builtin_convertvector(h, U32s) << 16);
}
inline Vec<float> load(VecTag, const c10::Half* p) {
  float f[kLanes<float>];
  for (int i = 0; i < kLanes<float>; ++i) f[i] = static_cast<float>(p[i]);
  return load(VecTag{}, f);
}
template <typename A>
inline A load(ScalarTag, const A* p) { return *p; }
inline float load(ScalarTag, const c10::BFloat16* p) { return bit_cast<float>(static_cast<uint32_t>(p->x) << 16); }
inline float load(ScalarTag, const c10::Half* p) { return static_cast<float>(*p); }

// ---- rounding a float to bfloat16 bits: to nearest even, as c10 does; NaN stays NaN ----
inline U32s bf16_bits(Vec<float> f) {
  const U32s u = bit_cast<U32s>(f);
  const U32s rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? U32s{} + 0x7FC0u : rounded;
}
inline uint32_t bf16_bits(float f) {
  const uint32_t u = bit_cast<uint32_t>(f);
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// ---- stores: compute type -> dtype, one rounding ----
template <typename A>
inline void store(VecTag, A* p, Vec<A> v) { std::memcpy(p, &v, sizeof v); }
inline void store(VecTag, c10::BFloat16* p, Vec<float> v) {
  const U16s h = __builtin_convertvector(bf16_bits(v), U16s);
  std::memcpy(p, &h, sizeof h);
}
inline void store(VecTag, c10::Half* p, Vec<float> v) {
  for (int i = 0; i < kLanes<float>; ++i) p[i] = static_cast<c10::Half>(v[i]);
}
template <typename A>
inline void store(ScalarTag, A* p, A v) { *p = v; }
inline void store(ScalarTag, c10::BFloat16* p, float v) {
  p->x = static_cast<uint16_t>(bf16_bits(v));
}
inline void store(ScalarTag, c10::Half* p, float v) { *p = static_cast<c10::Half>(v); }

// v as dtype T would hold it (the reference's .type_as(x) before the gain)
template <typename T, typename V>
inline V round_to(V v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if constexpr (std::is_same_v<V, float>) return bit_cast<float>(bf16_bits(v) << 16);
    else return bit_cast<Vec<float>>(bf16_bits(v) << 16);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    if constexpr (std::is_same_v<V, float>) return static_cast<float>(static_cast<c10::Half>(v));
    else {
      for (int i = 0; i < kLanes<float>; ++i) v[i] = static_cast<float>(static_cast<c10::Half>(v[i]));
      return v;
    }
  } else {
    return v;
  }
}

// the lanes of a vector added in a fixed tree, halves first
template <typename V>
inline auto hsum(V v) {
  constexpr int n = sizeof(V) / sizeof(v[0]);
  if constexpr (n == 1) {
    return v[0];
  } else if constexpr (n == 2) {
    return v[0] + v[1];
  } else {
    typedef std::remove_cvref_t<decltype(v[0])> E;
    typedef E HalfVec __attribute__((vector_size(sizeof(V) / 2)));
    HalfVec lo, hi;
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    return hsum(lo + hi);
  }
}

// sum over j of f(tag, j), f called on vector blocks then on the scalar tail
template <typename A, typename F>
inline A row_sum(int64_t d, const F& f) {
  Vec<A> acc{};
  int64_t j = 0;
  for (; j + kLanes<A> <= d; j += kLanes<A>) acc += f(VecTag{}, j);
  A tail = 0;
  for (; j < d; ++j) tail += f(ScalarTag{}, j);
  return hsum(acc) + tail;
}

// f(tag, j) for every block, then every element of the tail
template <typename A, typename F>
inline void row_each(int64_t d, const F& f) {
  int64_t j = 0;
  for (; j + kLanes<A> <= d; j += kLanes<A>) f(VecTag{}, j);
  for (; j < d; ++j) f(ScalarTag{}, j);
}

template <typename x_t>
using acc_of = std::conditional_t<std::is_same_v<x_t, double>, double, float>;

// Forward over rows [begin, end): y = round_to<x_t>((x - mean) * rstd) * w (+ b), rstd / mean per row.
template <bool kCenter, typename x_t, typename w_t, typename o_t>
void forward(const x_t* x, const w_t* w, const w_t* b, o_t* y, acc_of<x_t>* rstd, acc_of<x_t>* means, int64_t d,
             double eps, int64_t begin, int64_t end) {
  using A = acc_of<x_t>;
  for (int64_t r = begin; r < end; ++r) {
    const x_t* xr = x + r * d;
    o_t* yr = y + r * d;
    A mean = 0;
    if constexpr (kCenter) mean = row_sum<A>(d, [&](auto t, int64_t j) { return load(t, xr + j); }) / d;
    const A ss = row_sum<A>(d, [&](auto t, int64_t j) {
      const auto v = load(t, xr + j) - mean;
      return v * v;
    });
    const A rs = A(1) / std::sqrt(ss / d + static_cast<A>(eps));
    rstd[r] = rs;
    means[r] = mean;
    row_each<A>(d, [&](auto t, int64_t j) {
      auto v = (load(t, xr + j) - mean) * rs;
      if (w) v = round_to<x_t>(v) * load(t, w + j);
      if (b) v = round_to<o_t>(v) + load(t, b + j);
      store(t, yr + j, v);
    });
  }
}

// Backward over rows [begin, end): dx = rstd * (g*w - c0 - xhat * c1), c0 = mean(g*w) (LayerNorm only),
// c1 = mean(g*w * xhat); dw += g * round_to<x_t>(xhat) and db += g into this thread's float buffers.
template <bool kCenter, typename x_t, typename w_t, typename g_t>
void backward(const g_t* g, const x_t* x, const w_t* w, const acc_of<x_t>* rstd, const acc_of<x_t>* means, x_t* dx,
              acc_of<x_t>* dw, acc_of<x_t>* db, int64_t d, int64_t begin, int64_t end) {
  using A = acc_of<x_t>;
  constexpr int64_t kBlock = 4;  // rows per update of the gain-gradient buffers (their rows stay in L1)
  for (int64_t r0 = begin; r0 < end; r0 += kBlock) {
    const int64_t r1 = std::min(end, r0 + kBlock);
    for (int64_t r = r0; r < r1; ++r) {
      const x_t* xr = x + r * d;
      const g_t* gr = g + r * d;
      const A rs = rstd[r], mean = kCenter ? means[r] : A(0);
      auto gw = [&](auto t, int64_t j) { return w ? load(t, gr + j) * load(t, w + j) : load(t, gr + j); };
      const A c0 = kCenter ? row_sum<A>(d, gw) / d : A(0);
      const A c1 = row_sum<A>(d, [&](auto t, int64_t j) { return gw(t, j) * ((load(t, xr + j) - mean) * rs); }) / d;
      row_each<A>(d, [&](auto t, int64_t j) {
        store(t, dx + r * d + j, rs * (gw(t, j) - c0 - (load(t, xr + j) - mean) * rs * c1));
      });
    }
    if (dw) {
      row_each<A>(d, [&](auto t, int64_t j) {
        auto a = load(t, dw + j);
        for (int64_t r = r0; r < r1; ++r)
          a += load(t, g + r * d + j) * round_to<x_t>((load(t, x + r * d + j) - (kCenter ? means[r] : A(0))) * rstd[r]);
        store(t, dw + j, a);
      });
    }
    if (db) {
      row_each<A>(d, [&](auto t, int64_t j) {
        auto a = load(t, db + j);
        for (int64_t r = r0; r < r1; ++r) a += load(t, g + r * d + j);
        store(t, db + j, a);
      });
    }
  }
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
          begin, end);
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
          static_cast<A*>(db), c.d, begin, end);
    };
    c.center ? run(std::true_type{}) : run(std::false_type{});
  });
}

}  // namespace kernel
