// The norms' row loops for AVX-512 (F, BW, VL, DQ), in the portable build only (see norms_api.h).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(NORMLAB_NATIVE)
#include "norms_api.h"  // every header before the target pragma: only the loops get the AVX-512 target
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2")
#define NORMLAB_VEC_BYTES 64  // the pragma does not define __AVX2__ / __AVX512F__
#define NORMLAB_ISA avx512
#include "norms_isa.h"
#pragma GCC pop_options

normlab::RowLoops normlab::loops_avx512() {
  return {"portable AVX-512", &avx512::kernel::forward_rows, &avx512::kernel::backward_rows};
}
#else
#include "norms_api.h"
normlab::RowLoops normlab::loops_avx512() { return {"avx512", nullptr, nullptr}; }
#endif
