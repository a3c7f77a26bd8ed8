// Fused SwiGLU activation for CPU: h = silu(a) * b = a * sigmoid(a) * b, forward and backward.
//
// Eager torch runs silu (writes silu(a)), then the product, and in the backward two products and
// silu_backward: five passes over tensors of the hidden size, and silu(a) saved for the backward. Here
// the forward is one pass and the backward one pass (da and db together), recomputing sigmoid(a); only
// a and b are saved. Compute in float32 (float64 for float64), one rounding to the input dtype.
//
// Registered as torch.ops.normlab.{swiglu_fwd, swiglu_bwd}; loaded by model/kernels/__init__.py.

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common.h"

#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace {

using normlab::down;
using normlab::up;

constexpr int64_t kGrain = 8192;  // elements per parallel task at least

template <typename acc_t>
inline acc_t sigmoid(acc_t v) { return acc_t(1) / (acc_t(1) + normlab::exp_(-v)); }

// The loops index local __restrict__ pointers: through the lambda's captured references GCC would
// not vectorize them.
template <typename T>
void forward(const T* a_, const T* b_, T* h_, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    const T* __restrict__ a = a_ + begin;
    const T* __restrict__ b = b_ + begin;
    T* __restrict__ h = h_ + begin;
#pragma omp simd
    for (int64_t i = 0; i < end - begin; ++i) {
      const auto x = up(a[i]);
      h[i] = down<T>(x * sigmoid(x) * up(b[i]));
    }
  });
}

// d/da [a s(a) b] = b s (1 + a (1 - s)),  d/db = a s(a)
template <typename T>
void backward(const T* g_, const T* a_, const T* b_, T* da_, T* db_, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    const T* __restrict__ g = g_ + begin;
    const T* __restrict__ a = a_ + begin;
    const T* __restrict__ b = b_ + begin;
    T* __restrict__ da = da_ + begin;
    T* __restrict__ db = db_ + begin;
#pragma omp simd
    for (int64_t i = 0; i < end - begin; ++i) {
      const auto x = up(a[i]), gi = up(g[i]);
      const auto s = sigmoid(x);
      da[i] = down<T>(gi * up(b[i]) * s * (1 + x * (1 - s)));
      db[i] = down<T>(gi * x * s);
    }
  });
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && a.is_contiguous() &&
                  b.is_contiguous() && a.device().is_cpu() && b.device().is_cpu(),
              "swiglu: ", what, " must be contiguous CPU tensors of one shape and dtype");
}

at::Tensor swiglu_fwd(const at::Tensor& a, const at::Tensor& b) {
  check_same(a, b, "a and b");
  auto h = at::empty_like(a);
  normlab::dispatch_floating(a.scalar_type(), "swiglu", [&](auto t0) {
    using T = decltype(t0);
    forward<T>(a.data_ptr<T>(), b.data_ptr<T>(), h.data_ptr<T>(), a.numel());
  });
  return h;
}

std::tuple<at::Tensor, at::Tensor> swiglu_bwd(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b) {
  check_same(a, b, "a and b");
  const at::Tensor g = grad.to(a.scalar_type()).contiguous();
  check_same(g, a, "grad and a");
  auto da = at::empty_like(a);
  auto db = at::empty_like(b);
  normlab::dispatch_floating(a.scalar_type(), "swiglu", [&](auto t0) {
    using T = decltype(t0);
    backward<T>(g.data_ptr<T>(), a.data_ptr<T>(), b.data_ptr<T>(), da.data_ptr<T>(), db.data_ptr<T>(), a.numel());
  });
  return {da, db};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  m.def("swiglu_fwd(Tensor a, Tensor b) -> Tensor");
  m.def("swiglu_bwd(Tensor grad, Tensor a, Tensor b) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("swiglu_fwd", swiglu_fwd);
  m.impl("swiglu_bwd", swiglu_bwd);
}
