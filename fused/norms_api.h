// What norms_cpu.cpp (the ops) and the per-instruction-set row loops (norms_isa_*.cpp, norms_kernel.h) share:
// one call's arguments, the dtype switch, and the entry points of each compiled instruction set.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>  // before any target pragma: the loops of each instruction set use its intrinsics
#endif

namespace normlab {

struct FwdCall {  // x (rows, d) contiguous; y, rstd, mean written for rows [begin, end)
  const void* x;
  const void* w;  // null: no gain
  const void* b;  // null: no bias
  void* y;
  void* rstd;
  void* mean;
  int64_t d;
  double eps;
  c10::ScalarType x_type, w_type;
  bool center;
  bool stream;  // float32 output larger than the caches: written with streaming stores
};

struct BwdCall {  // g in the output dtype; dx in x's; the gain gradients go to per-thread buffers
  const void* g;
  const void* x;
  const void* w;
  const void* rstd;
  const void* mean;
  void* dx;
  int64_t d;
  c10::ScalarType x_type, w_type;
  bool center;
  bool stream;  // float32 dx larger than the caches: written with streaming stores
};

// Calls f(x_t{}, w_t{}, o_t{}) for the supported dtype combinations: weight in x's dtype or float32, output
// dtype = promote(x, weight). Other combinations are refused (the Python side falls back before that).
template <typename F>
void dispatch_norm(c10::ScalarType x, c10::ScalarType w, const F& f) {
  using c10::BFloat16;
  using c10::Half;
  using c10::ScalarType;
  if (x == ScalarType::Float && w == ScalarType::Float) return f(float{}, float{}, float{});
  if (x == ScalarType::Double && w == ScalarType::Double) return f(double{}, double{}, double{});
  if (x == ScalarType::BFloat16 && w == ScalarType::BFloat16) return f(BFloat16{}, BFloat16{}, BFloat16{});
  if (x == ScalarType::BFloat16 && w == ScalarType::Float) return f(BFloat16{}, float{}, float{});
  if (x == ScalarType::Half && w == ScalarType::Half) return f(Half{}, Half{}, Half{});
  if (x == ScalarType::Half && w == ScalarType::Float) return f(Half{}, float{}, float{});
  TORCH_CHECK(false, "normlab norm kernel: unsupported dtypes x=", x, " weight=", w);
}

struct RowLoops {  // one instruction set's loops
  const char* isa;
  void (*forward)(const FwdCall&, int64_t begin, int64_t end);
  void (*backward)(const BwdCall&, int64_t begin, int64_t end, void* dw, void* db);
};

// Defined by norms_isa_*.cpp: `base` is compiled with the build's flags (-march=native in a native build, the
// x86-64 baseline in the portable one); on x86-64 the portable build also compiles `avx2` (AVX2 + FMA) and
// `avx512` (AVX-512 F/BW/VL/DQ), which norms_cpu.cpp picks at run time as torch picks its own kernels.
// Where one is not compiled, its loops are null.
RowLoops loops_base();
RowLoops loops_avx2();
RowLoops loops_avx512();

}  // namespace normlab
