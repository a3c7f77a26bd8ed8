// Fused CPU kernels for RMSNorm and LayerNorm, forward and backward, with the reference's precision
// policy: statistics and normalization in float32 (float64 for float64 input), the normalized value
// rounded to the input dtype, then the gain (and bias) applied with one rounding to the output dtype,
// which is exactly what `xhat.type_as(x) * weight` does in torch.
//
// Per row: one pass for the statistics, one for the output. The backward re-reads x with the saved
// per-row 1/rms (and mean) instead of saved intermediates. Float32 outputs of 32 MiB and more (larger
// than the caches anyway) are written with streaming stores, which skip reading each destination line
// first: a third less memory traffic where the norm is memory-bound. Rows run in parallel (at::parallel_for);
// the gain / bias gradients are reduced from per-thread partial sums. Loops are written so that the
// compiler vectorizes them (restrict pointers, no branches inside, `omp simd` reductions).
//
// Registered as torch.ops.normlab.{norm_fwd, norm_bwd}; built on first use by model/kernels/__init__.py.

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using normlab::down;
using normlab::round_to;
using normlab::up;

constexpr int64_t kGrain = 16;  // rows per parallel task at least
constexpr int64_t kStreamBytes = int64_t(32) << 20;  // outputs this large bypass the caches (see common.h)

// In every supported dtype combination (see dispatch) the compute type of x, of the weight and of the
// output is the same: float, or double for double.
template <bool kCenter, typename x_t, typename w_t, typename o_t>
void forward_rows(const x_t* __restrict__ x, const w_t* __restrict__ w, const w_t* __restrict__ b,
                  o_t* __restrict__ y, at::opmath_type<x_t>* __restrict__ rstd, at::opmath_type<x_t>* __restrict__ means,
                  int64_t rows, int64_t d, double eps) {
  using acc_t = at::opmath_type<x_t>;
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    constexpr bool kFloat = std::is_same_v<x_t, float> && std::is_same_v<o_t, float>;
    const bool stream_rows = kFloat && w && !b && rows * d * sizeof(o_t) >= kStreamBytes;
    std::vector<float> buffer(stream_rows ? d : 0);
    float* __restrict__ tmp = buffer.data();
    for (int64_t r = begin; r < end; ++r) {
      const x_t* __restrict__ xr = x + r * d;
      o_t* __restrict__ yr = y + r * d;
      acc_t mean = 0;
      if constexpr (kCenter) {
        acc_t s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < d; ++j) s += up(xr[j]);
        mean = s / d;
      }
      acc_t ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < d; ++j) {
        const acc_t v = up(xr[j]) - mean;
        ss += v * v;
      }
      const acc_t rs = acc_t(1) / std::sqrt(ss / d + static_cast<acc_t>(eps));
      rstd[r] = rs;
      means[r] = mean;
      // xhat is rounded to the input dtype before the gain: the reference's .type_as(x)
      if (w && b) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          const acc_t t = up(down<o_t>(round_to<x_t>((up(xr[j]) - mean) * rs) * up(w[j])));
          yr[j] = down<o_t>(t + up(b[j]));
        }
      } else if (stream_rows) {  // float32 and large: through an L1 buffer, then streaming stores
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) tmp[j] = (up(xr[j]) - mean) * rs * up(w[j]);
        normlab::stream_floats(reinterpret_cast<float*>(yr), tmp, d);
      } else if (w) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) yr[j] = down<o_t>(round_to<x_t>((up(xr[j]) - mean) * rs) * up(w[j]));
      } else {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) yr[j] = down<o_t>((up(xr[j]) - mean) * rs);
      }
    }
    if (stream_rows) normlab::stream_fence();
  });
}

template <bool kCenter, typename x_t, typename w_t, typename g_t>
void backward_rows(const g_t* __restrict__ g, const x_t* __restrict__ x, const w_t* __restrict__ w,
                   const at::opmath_type<x_t>* __restrict__ rstd, const at::opmath_type<x_t>* __restrict__ means,
                   x_t* __restrict__ dx, at::opmath_type<x_t>* dw_part, at::opmath_type<x_t>* db_part,
                   int64_t rows, int64_t d, int64_t stride) {
  using acc_t = at::opmath_type<x_t>;
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    const int64_t t = at::get_thread_num();
    acc_t* __restrict__ dw = dw_part ? dw_part + t * stride : nullptr;
    acc_t* __restrict__ db = db_part ? db_part + t * stride : nullptr;
    const bool stream_rows = std::is_same_v<x_t, float> && w && rows * d * sizeof(x_t) >= kStreamBytes;
    std::vector<float> buffer(stream_rows ? d : 0);
    float* __restrict__ tmp = buffer.data();
    // bfloat16 / half with a gain: the row converted to float once, into L1 buffers the later loops read
    constexpr bool k16 = !std::is_same_v<x_t, acc_t>;
    std::vector<acc_t> row16(k16 && w ? 2 * d : 0);
    acc_t* __restrict__ xh = row16.data();
    acc_t* __restrict__ gf = xh + (k16 && w ? d : 0);
    for (int64_t r = begin; r < end; ++r) {
      const x_t* __restrict__ xr = x + r * d;
      const g_t* __restrict__ gr = g + r * d;
      x_t* __restrict__ dxr = dx + r * d;
      const acc_t rs = rstd[r], mean = kCenter ? means[r] : acc_t(0);  // RMSNorm: x - 0 folds away
      // dx = rs * (g*w - c0 - xhat * c1), c0 = mean(g*w) (LayerNorm only), c1 = mean(g*w * xhat).
      // First pass: the two sums, and the gain gradient (the gain saw xhat rounded to the input dtype).
      acc_t c0 = 0, c1 = 0;
      if (dw && std::is_same_v<x_t, acc_t>) {  // float / double: sums and gain gradient in one pass
#pragma omp simd reduction(+ : c0, c1)
        for (int64_t j = 0; j < d; ++j) {
          const acc_t xh = (up(xr[j]) - mean) * rs;
          const acc_t gj = up(gr[j]);
          if constexpr (kCenter) c0 += gj * up(w[j]);
          c1 += gj * up(w[j]) * xh;
          dw[j] += gj * xh;
        }
      } else if (dw) {  // bfloat16 / half: one converting pass, then float loops (the fused loop would not
                        // vectorize with GCC 12); the same operations in the same order as the float path
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          xh[j] = (up(xr[j]) - mean) * rs;
          gf[j] = up(gr[j]);
        }
#pragma omp simd reduction(+ : c0, c1)
        for (int64_t j = 0; j < d; ++j) {
          const acc_t gw = gf[j] * up(w[j]);
          if constexpr (kCenter) c0 += gw;
          c1 += gw * xh[j];
        }
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) dw[j] += gf[j] * round_to<x_t>(xh[j]);
      } else {
#pragma omp simd reduction(+ : c0, c1)
        for (int64_t j = 0; j < d; ++j) {
          const acc_t gj = up(gr[j]);
          if constexpr (kCenter) c0 += gj;
          c1 += gj * (up(xr[j]) - mean) * rs;
        }
      }
      c0 = kCenter ? c0 / d : acc_t(0);
      c1 /= d;
      // second pass: dx (the row is still in L1)
      if (stream_rows) {  // float32 and large: through an L1 buffer, then streaming stores
#pragma omp simd
        for (int64_t j = 0; j < d; ++j)
          tmp[j] = rs * (up(gr[j]) * up(w[j]) - c0 - (up(xr[j]) - mean) * rs * c1);
        normlab::stream_floats(reinterpret_cast<float*>(dxr), tmp, d);
      } else if (k16 && w && dw) {  // from the float buffers of the first pass
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) dxr[j] = down<x_t>(rs * (gf[j] * up(w[j]) - c0 - xh[j] * c1));
      } else if (w) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j)
          dxr[j] = down<x_t>(rs * (up(gr[j]) * up(w[j]) - c0 - (up(xr[j]) - mean) * rs * c1));
      } else {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) dxr[j] = down<x_t>(rs * (up(gr[j]) - c0 - (up(xr[j]) - mean) * rs * c1));
      }
      if (db) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) db[j] += up(gr[j]);
      }
    }
    if (stream_rows) normlab::stream_fence();
  });
}

// Calls f(x_t{}, w_t{}, o_t{}) for the supported dtype combinations: weight in x's dtype or float32,
// output dtype = promote(x, weight). Other combinations are refused (the Python side falls back).
template <typename F>
void dispatch(at::ScalarType x, at::ScalarType w, const F& f) {
  using at::BFloat16;
  using at::Half;
  if (x == at::kFloat && w == at::kFloat) return f(float{}, float{}, float{});
  if (x == at::kDouble && w == at::kDouble) return f(double{}, double{}, double{});
  if (x == at::kBFloat16 && w == at::kBFloat16) return f(BFloat16{}, BFloat16{}, BFloat16{});
  if (x == at::kBFloat16 && w == at::kFloat) return f(BFloat16{}, float{}, float{});
  if (x == at::kHalf && w == at::kHalf) return f(Half{}, Half{}, Half{});
  if (x == at::kHalf && w == at::kFloat) return f(Half{}, float{}, float{});
  TORCH_CHECK(false, "normlab norm kernel: unsupported dtypes x=", x, " weight=", w);
}

// A gain or bias must hold exactly one value per normalized element: the loops read d of them.
void check_affine(const char* op, const std::optional<at::Tensor>& p, int64_t d) {
  if (p.has_value() && p->defined())
    TORCH_CHECK(p->numel() == d && p->device().is_cpu(), op, ": weight and bias must have ", d,
                " elements (one per normalized element) on the CPU, got ", p->numel());
}

// x: (rows, d) contiguous. Returns (y, rstd, mean): y in promote(x, weight) dtype, the per-row
// statistics in x's compute dtype (float32, or float64 for float64 input).
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_fwd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, double eps,
                                                        bool center) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "norm_fwd: x must be 2-d contiguous CPU");
  const int64_t rows = x.size(0), d = x.size(1);
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = has_w && bias.has_value() && bias->defined();
  check_affine("norm_fwd", weight, d);
  check_affine("norm_fwd", bias, d);
  const at::Tensor w = has_w ? weight->contiguous() : at::Tensor();
  const at::Tensor b = has_b ? bias->to(w.scalar_type()).contiguous() : at::Tensor();
  const auto w_type = has_w ? w.scalar_type() : x.scalar_type();
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto y = at::empty({rows, d}, x.options().dtype(at::promote_types(x.scalar_type(), w_type)));
  auto rstd = at::empty({rows}, x.options().dtype(acc_type));
  auto mean = at::empty({rows}, x.options().dtype(acc_type));
  dispatch(x.scalar_type(), w_type, [&](auto x0, auto w0, auto o0) {
    using x_t = decltype(x0);
    using w_t = decltype(w0);
    using o_t = decltype(o0);
    using acc_t = at::opmath_type<x_t>;
    // the centring is a template parameter, so RMSNorm's loops carry no mean at all
    auto run = [&](auto center_tag) {
      forward_rows<decltype(center_tag)::value, x_t, w_t, o_t>(
          x.data_ptr<x_t>(), has_w ? w.data_ptr<w_t>() : nullptr, has_b ? b.data_ptr<w_t>() : nullptr,
          y.data_ptr<o_t>(), rstd.data_ptr<acc_t>(), mean.data_ptr<acc_t>(), rows, d, eps);
    };
    center ? run(std::true_type{}) : run(std::false_type{});
  });
  return {y, rstd, mean};
}

// Returns (dx, dweight, dbias); dweight / dbias are undefined (None) when the norm has none.
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_bwd(const at::Tensor& grad, const at::Tensor& x,
                                                        const std::optional<at::Tensor>& weight,
                                                        const at::Tensor& rstd, const at::Tensor& mean,
                                                        bool center, bool has_bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "norm_bwd: x must be 2-d contiguous CPU");
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.device().is_cpu(), "norm_bwd: grad must have x's shape ", x.sizes(),
              ", got ", grad.sizes());
  const int64_t rows = x.size(0), d = x.size(1);
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  for (const at::Tensor* s : {&rstd, &mean})
    TORCH_CHECK(s->dim() == 1 && s->size(0) == rows && s->scalar_type() == acc && s->is_contiguous(),
                "norm_bwd: rstd and mean must be contiguous ", acc, " vectors of one entry per row (", rows, ")");
  check_affine("norm_bwd", weight, d);
  const bool has_w = weight.has_value() && weight->defined();
  const at::Tensor w = has_w ? weight->contiguous() : at::Tensor();
  const auto w_type = has_w ? w.scalar_type() : x.scalar_type();
  // the incoming gradient has the output dtype; read it as such
  const at::Tensor g = grad.to(at::promote_types(x.scalar_type(), w_type)).contiguous();
  auto dx = at::empty_like(x);
  const int64_t threads = at::get_num_threads();
  const auto acc_options = x.options().dtype(rstd.scalar_type());
  // per-thread partial sums, each row padded to its own 4 KiB + 64 B so threads and rows never alias
  const int64_t stride = ((d + 1023) / 1024) * 1024 + 16;
  auto dw_part = has_w ? at::zeros({threads, stride}, acc_options) : at::Tensor();
  auto db_part = has_w && has_bias ? at::zeros({threads, stride}, acc_options) : at::Tensor();
  dispatch(x.scalar_type(), w_type, [&](auto x0, auto w0, auto o0) {
    using x_t = decltype(x0);
    using w_t = decltype(w0);
    using o_t = decltype(o0);
    using acc_t = at::opmath_type<x_t>;
    auto run = [&](auto center_tag) {
      backward_rows<decltype(center_tag)::value, x_t, w_t, o_t>(
          g.data_ptr<o_t>(), x.data_ptr<x_t>(), has_w ? w.data_ptr<w_t>() : nullptr, rstd.data_ptr<acc_t>(),
          mean.data_ptr<acc_t>(), dx.data_ptr<x_t>(), has_w ? dw_part.data_ptr<acc_t>() : nullptr,
          db_part.defined() ? db_part.data_ptr<acc_t>() : nullptr, rows, d, stride);
    };
    center ? run(std::true_type{}) : run(std::false_type{});
  });
  at::Tensor dw = has_w ? dw_part.narrow(1, 0, d).sum(0).to(w.scalar_type()) : at::Tensor();
  at::Tensor db = db_part.defined() ? db_part.narrow(1, 0, d).sum(0).to(w.scalar_type()) : at::Tensor();
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY(normlab, m) {
  m.def("norm_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps, bool center) -> (Tensor, Tensor, Tensor)");
  m.def("norm_bwd(Tensor grad, Tensor x, Tensor? weight, Tensor rstd, Tensor mean, bool center, bool has_bias)"
        " -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("norm_fwd", norm_fwd);
  m.impl("norm_bwd", norm_bwd);
}
