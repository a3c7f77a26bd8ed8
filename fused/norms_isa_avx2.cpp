// The norms' row loops for AVX2 + FMA, in the portable build only (see norms_api.h).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(NORMLAB_NATIVE)
#include "norms_api.h"  // every header before the target pragma: only the loops get the AVX2 target
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#define NORMLAB_VEC_BYTES 32  // the pragma does not define __AVX2__ / __AVX512F__
#define NORMLAB_ISA avx2
#include "norms_isa.h"
#pragma GCC pop_options

normlab::RowLoops normlab::loops_avx2() { return {"portable AVX2", &avx2::kernel::forward_rows, &avx2::kernel::backward_rows}; }
#else
#include "norms_api.h"
normlab::RowLoops normlab::loops_avx2() { return {"avx2", nullptr, nullptr}; }
#endif
