// Fused softmax cross-entropy for CPU, forward and backward: loss_r = logsumexp(x_r) - x_r[t_r].
//
// F.cross_entropy runs log_softmax (writes a (rows, vocab) tensor), nll_loss, and in the backward a
// (rows, vocab) one-hot gradient plus the log_softmax backward: five passes over the logits' size. Here the
// forward reads each row twice (max, then sum of exp) and keeps only the per-row logsumexp; the backward
// reads the row once and writes softmax(x) - onehot(t), scaled by the incoming gradient, straight into
// the logits' gradient. Compute in float32 (float64 for float64 logits), as F.cross_entropy on
// `logits.float()`; the gradient is rounded once to the logits' dtype.
//
// Registered as torch.ops.normlab.{cross_entropy_fwd, cross_entropy_bwd}; loaded by model/kernels/__init__.py.

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <tuple>

namespace {

using normlab::down;
using normlab::exp_;
using normlab::up;

constexpr int64_t kGrain = 4;  // rows per parallel task at least (a row is a whole vocabulary)

template <typename x_t>
void forward_rows(const x_t* __restrict__ x, const int64_t* __restrict__ target,
                  at::opmath_type<x_t>* __restrict__ loss, at::opmath_type<x_t>* __restrict__ lse, int64_t rows,
                  int64_t vocab, int64_t ignore_index) {
  using acc_t = at::opmath_type<x_t>;
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const x_t* __restrict__ xr = x + r * vocab;
      acc_t m = -std::numeric_limits<acc_t>::infinity();
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < vocab; ++j) m = std::max(m, up(xr[j]));
      acc_t s = 0;  // a NaN anywhere in the row makes s (and the loss) NaN, as in torch
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < vocab; ++j) s += exp_(up(xr[j]) - m);
      const acc_t l = m + std::log(s);
      lse[r] = l;
      loss[r] = target[r] == ignore_index ? acc_t(0) : l - up(xr[target[r]]);
    }
  });
}

// dx_r = scale * (softmax(x_r) - onehot(t_r)); rows whose target is ignore_index get 0.
template <typename x_t>
void backward_rows(const x_t* __restrict__ x, const int64_t* __restrict__ target,
                   const at::opmath_type<x_t>* __restrict__ lse, x_t* __restrict__ dx, at::opmath_type<x_t> scale,
                   int64_t rows, int64_t vocab, int64_t ignore_index) {
  using acc_t = at::opmath_type<x_t>;
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const x_t* __restrict__ xr = x + r * vocab;
      x_t* __restrict__ dxr = dx + r * vocab;
      const int64_t t = target[r];
      if (t == ignore_index) {
        std::fill(dxr, dxr + vocab, down<x_t>(acc_t(0)));
        continue;
      }
      const acc_t l = lse[r];
#pragma omp simd
      for (int64_t j = 0; j < vocab; ++j) dxr[j] = down<x_t>(exp_(up(xr[j]) - l) * scale);
      dxr[t] = down<x_t>((exp_(up(xr[t]) - l) - acc_t(1)) * scale);
    }
  });
}

void check_shapes(const at::Tensor& logits, const at::Tensor& target) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.device().is_cpu(),
              "cross_entropy: logits must be 2-d contiguous CPU");
  TORCH_CHECK(target.dim() == 1 && target.size(0) == logits.size(0) && target.scalar_type() == at::kLong &&
                  target.is_contiguous(),
              "cross_entropy: targets must be 1-d int64 with one entry per row of logits");
}

// Before the parallel loops (they cannot throw), in both entry points: each can be called directly, and the
// scan costs 1/V of the pass over the logits.
void check_targets(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index) {
  const int64_t* t = target.data_ptr<int64_t>();
  for (int64_t r = 0; r < target.size(0); ++r)
    TORCH_CHECK_INDEX(t[r] == ignore_index || (t[r] >= 0 && t[r] < logits.size(1)), "Target ", t[r],
                      " is out of bounds.");
}

// Returns (per-row loss, per-row logsumexp), both in the compute dtype; ignored rows have loss 0.
std::tuple<at::Tensor, at::Tensor> cross_entropy_fwd(const at::Tensor& logits, const at::Tensor& target,
                                                     int64_t ignore_index) {
  check_shapes(logits, target);
  check_targets(logits, target, ignore_index);
  const auto acc_type = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto loss = at::empty({logits.size(0)}, logits.options().dtype(acc_type));
  auto lse = at::empty({logits.size(0)}, logits.options().dtype(acc_type));
  normlab::dispatch_floating(logits.scalar_type(), "cross_entropy", [&](auto x0) {
    using x_t = decltype(x0);
    using acc_t = at::opmath_type<x_t>;
    forward_rows<x_t>(logits.data_ptr<x_t>(), target.data_ptr<int64_t>(), loss.data_ptr<acc_t>(),
                      lse.data_ptr<acc_t>(), logits.size(0), logits.size(1), ignore_index);
  });
  return {loss, lse};
}

// grad_scale: the gradient of each non-ignored row's loss (a 0-d tensor, e.g. grad_output / count).
at::Tensor cross_entropy_bwd(const at::Tensor& grad_scale, const at::Tensor& logits, const at::Tensor& target,
                             const at::Tensor& lse, int64_t ignore_index) {
  check_shapes(logits, target);
  const auto acc = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(lse.dim() == 1 && lse.size(0) == logits.size(0) && lse.scalar_type() == acc && lse.is_contiguous(),
              "cross_entropy_bwd: lse must be a contiguous ", acc, " vector of one entry per row of logits");
  TORCH_CHECK(grad_scale.numel() == 1, "cross_entropy_bwd: grad_scale must hold one value");
  check_targets(logits, target, ignore_index);
  auto dx = at::empty_like(logits);
  normlab::dispatch_floating(logits.scalar_type(), "cross_entropy", [&](auto x0) {
    using x_t = decltype(x0);
    using acc_t = at::opmath_type<x_t>;
    const acc_t scale = grad_scale.item<double>();
    backward_rows<x_t>(logits.data_ptr<x_t>(), target.data_ptr<int64_t>(), lse.data_ptr<acc_t>(),
                       dx.data_ptr<x_t>(), scale, logits.size(0), logits.size(1), ignore_index);
  });
  return dx;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  m.def("cross_entropy_fwd(Tensor logits, Tensor target, int ignore_index) -> (Tensor, Tensor)");
  m.def("cross_entropy_bwd(Tensor grad_scale, Tensor logits, Tensor target, Tensor lse, int ignore_index) -> Tensor");
}

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("cross_entropy_fwd", cross_entropy_fwd);
  m.impl("cross_entropy_bwd", cross_entropy_bwd);
}
