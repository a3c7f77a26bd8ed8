// The norms' row loops compiled with the build's own flags (see norms_api.h).
#define NORMLAB_ISA base
#include "norms_isa.h"

normlab::RowLoops normlab::loops_base() {
#if defined(NORMLAB_NATIVE)
  const char* name = "native (-march=native)";
#else
  const char* name = "portable baseline";
#endif
  return {name, &base::kernel::forward_rows, &base::kernel::backward_rows};
}
