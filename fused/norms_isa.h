// The body of every norms_isa_*.cpp: all headers first, then, under the including file's `#pragma GCC target`
// (if any), the row loops of norms_kernel.h in a namespace of that instruction set's own (NORMLAB_ISA), so
// the copies compiled for different instruction sets never share a symbol.

#include "norms_api.h"

namespace normlab::NORMLAB_ISA {
#include "norms_kernel.h"
}  // namespace normlab::NORMLAB_ISA
