// Fused CPU kernels for RMSNorm and LayerNorm, forward and backward, with the reference's precision policy:
// statistics and normalization in float32 (float64 for float64 input), the normalized value rounded to the
// input dtype, then the gain (and bias) applied with one rounding to the output dtype, which is exactly what
// `xhat.type_as(x) * weight` does in torch.
//
// This file holds the ops; the row loops live in norms_kernel.h, compiled once per instruction set
// (norms_isa_*.cpp) and picked here at run time (loops()). Per row: one pass for each statistic, one for the
// output; the backward re-reads x with the saved per-row 1/rms (and mean) instead of saved intermediates.
// Rows run in parallel (at::parallel_for); the gain / bias gradients are reduced from per-thread partial sums.
//
// Registered as torch.ops.normlab:
//   norm(x, d, weight, bias, eps, center) -> y   over the last d elements of x, with its autograd here in C++
//                                                 (no Python autograd.Function per call; torch.compile traces
//                                                 it into norm_fwd / norm_bwd, which have fake kernels)
//   norm_fwd(x, weight, bias, eps, center) -> (y, rstd, mean)    x 2-d contiguous
//   norm_bwd(grad, x, weight, rstd, mean, center, has_bias) -> (dx, dweight, dbias)
//   norm_loops() -> str                           which instruction set's loops run (for meta.json)
// Built on first use by fused/__init__.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "norms_api.h"

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using normlab::RowLoops;

constexpr int64_t kGrain = 16;  // rows per parallel task at least
// float32 outputs this large (larger than the caches anyway) are written with streaming stores, which skip
// reading each destination line before overwriting it: a third less memory traffic where the norm is memory-bound
constexpr int64_t kStreamBytes = int64_t(32) << 20;

// The loops of the best instruction set that both this CPU and torch's kernel choice allow: torch's own
// capability (ATEN_CPU_CAPABILITY lowers it, so one environment variable emulates an AVX2 CPU for both).
const RowLoops& loops() {
  static const RowLoops chosen = [] {
    const std::string torch_isa = at::get_cpu_capability();  // "AVX512", "AVX2", "DEFAULT", ...
#if defined(__x86_64__) && defined(__GNUC__)
    const RowLoops avx512 = normlab::loops_avx512(), avx2 = normlab::loops_avx2();
    if (avx512.forward && torch_isa == "AVX512" && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
      return avx512;
    if (avx2.forward && (torch_isa == "AVX512" || torch_isa == "AVX2") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
      return avx2;
#endif
    return normlab::loops_base();
  }();
  return chosen;
}

// A gain or bias must hold exactly one value per normalized element: the loops read d of them.
void check_affine(const char* op, const std::optional<at::Tensor>& p, int64_t d) {
  if (p.has_value() && p->defined())
    TORCH_CHECK(p->numel() == d && p->device().is_cpu(), op, ": weight and bias must have ", d,
                " elements (one per normalized element) on the CPU, got ", p->numel());
}

at::ScalarType acc_type(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

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
  auto y = at::empty({rows, d}, x.options().dtype(at::promote_types(x.scalar_type(), w_type)));
  auto rstd = at::empty({rows}, x.options().dtype(acc_type(x)));
  auto mean = at::empty({rows}, x.options().dtype(acc_type(x)));
  const normlab::FwdCall call{x.const_data_ptr(), has_w ? w.const_data_ptr() : nullptr,
                              has_b ? b.const_data_ptr() : nullptr, y.mutable_data_ptr(), rstd.mutable_data_ptr(),
                              mean.mutable_data_ptr(), d, eps, x.scalar_type(), w_type, center,
                              y.scalar_type() == at::kFloat && y.nbytes() >= kStreamBytes};
  normlab::dispatch_norm(x.scalar_type(), w_type, [](auto...) {});  // unsupported dtypes: an error here
  const auto forward = loops().forward;
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) { forward(call, begin, end); });
  return {y, rstd, mean};
}

// sum over threads of the per-thread partial sums, in thread order, cast to the gain's dtype
template <typename A>
at::Tensor reduce_parts(const A* parts, int64_t threads, int64_t stride, int64_t d, const at::Tensor& like) {
  auto sum = at::empty({d}, like.options().dtype(std::is_same_v<A, double> ? at::kDouble : at::kFloat));
  A* out = static_cast<A*>(sum.mutable_data_ptr());
  std::copy(parts, parts + d, out);
  for (int64_t t = 1; t < threads; ++t)
    for (int64_t j = 0; j < d; ++j) out[j] += parts[t * stride + j];
  return sum.scalar_type() == like.scalar_type() ? sum : sum.to(like.scalar_type());
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
  const auto acc = acc_type(x);
  for (const at::Tensor* s : {&rstd, &mean})
    TORCH_CHECK(s->dim() == 1 && s->size(0) == rows && s->scalar_type() == acc && s->is_contiguous(),
                "norm_bwd: rstd and mean must be contiguous ", acc, " vectors of one entry per row (", rows, ")");
  check_affine("norm_bwd", weight, d);
  const bool has_w = weight.has_value() && weight->defined();
  const at::Tensor w = has_w ? weight->contiguous() : at::Tensor();
  const auto w_type = has_w ? w.scalar_type() : x.scalar_type();
  // the incoming gradient has the output dtype; read it as such
  const at::Tensor g = grad.to(at::promote_types(x.scalar_type(), w_type)).contiguous();
  normlab::dispatch_norm(x.scalar_type(), w_type, [](auto...) {});  // unsupported dtypes: an error here
  auto dx = at::empty_like(x);
  // per-thread partial sums of the gain and bias gradients (float, or double for double), each thread's
  // padded by 64 bytes so that two threads never write one cache line
  const int64_t threads = at::get_num_threads();
  const int64_t stride = (d + 15) / 16 * 16 + 16;
  const int64_t parts = has_w ? (has_bias ? 2 : 1) * threads * stride : 0;
  std::vector<double> storage(parts);  // zeroed; read as float for float32 / bfloat16 / half data
  void* dw_part = has_w ? storage.data() : nullptr;
  void* db_part = nullptr;
  if (has_w && has_bias)
    db_part = acc == at::kDouble ? static_cast<void*>(storage.data() + threads * stride)
                                 : static_cast<void*>(reinterpret_cast<float*>(storage.data()) + threads * stride);
  const normlab::BwdCall call{g.const_data_ptr(), x.const_data_ptr(), has_w ? w.const_data_ptr() : nullptr,
                              rstd.const_data_ptr(), mean.const_data_ptr(), dx.mutable_data_ptr(), d,
                              x.scalar_type(), w_type, center,
                              dx.scalar_type() == at::kFloat && dx.nbytes() >= kStreamBytes};
  const auto backward = loops().backward;
  const size_t acc_size = acc == at::kDouble ? sizeof(double) : sizeof(float);
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    const int64_t offset = at::get_thread_num() * stride * acc_size;
    backward(call, begin, end, dw_part ? static_cast<char*>(dw_part) + offset : nullptr,
             db_part ? static_cast<char*>(db_part) + offset : nullptr);
  });
  at::Tensor dw, db;
  if (acc == at::kDouble) {
    if (dw_part) dw = reduce_parts(static_cast<double*>(dw_part), threads, stride, d, w);
    if (db_part) db = reduce_parts(static_cast<double*>(db_part), threads, stride, d, w);
  } else {
    if (dw_part) dw = reduce_parts(static_cast<float*>(dw_part), threads, stride, d, w);
    if (db_part) db = reduce_parts(static_cast<float*>(db_part), threads, stride, d, w);
  }
  return {dx, dw, db};
}

std::string norm_loops() { return loops().isa; }

// The ops called through the dispatcher, so that under torch.compile's fake tensors their fake kernels run.
std::tuple<at::Tensor, at::Tensor, at::Tensor> call_fwd(const at::Tensor& x, const std::optional<at::Tensor>& w,
                                                        const std::optional<at::Tensor>& b, double eps, bool center) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("normlab::norm_fwd", "")
                             .typed<decltype(norm_fwd)>();
  return op.call(x, w, b, eps, center);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_bwd(const at::Tensor& g, const at::Tensor& x,
                                                        const std::optional<at::Tensor>& w, const at::Tensor& rstd,
                                                        const at::Tensor& mean, bool center, bool has_bias) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("normlab::norm_bwd", "")
                             .typed<decltype(norm_bwd)>();
  return op.call(g, x, w, rstd, mean, center, has_bias);
}

// norm without autograd (inference mode, or below autograd)
at::Tensor norm(const at::Tensor& x, int64_t d, const std::optional<at::Tensor>& weight,
                const std::optional<at::Tensor>& bias, double eps, bool center) {
  return std::get<0>(call_fwd(x.reshape({-1, d}).contiguous(), weight, bias, eps, center)).view(x.sizes());
}

// norm's autograd: saves the input (as the contiguous rows the kernel read) and the per-row statistics
struct NormFunction : public torch::autograd::Function<NormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t d,
                            const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                            double eps, bool center) {
    at::AutoDispatchBelowADInplaceOrView below;
    const at::Tensor rows = x.reshape({-1, d}).contiguous();
    auto [y, rstd, mean] = call_fwd(rows, weight, bias, eps, center);
    ctx->save_for_backward({rows, weight.value_or(at::Tensor()), rstd, mean});
    ctx->saved_data["center"] = center;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->saved_data["shape"] = x.sizes();
    return y.view(x.sizes());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const std::optional<at::Tensor> weight = saved[1].defined() ? std::optional<at::Tensor>(saved[1]) : std::nullopt;
    auto [dx, dw, db] = call_bwd(grads[0].reshape(rows.sizes()), rows, weight, saved[2], saved[3],
                                 ctx->saved_data["center"].toBool(), ctx->saved_data["has_bias"].toBool());
    return {dx.view(ctx->saved_data["shape"].toIntVector()), at::Tensor(), dw, db, at::Tensor(), at::Tensor()};
  }
};

at::Tensor norm_autograd(const at::Tensor& x, int64_t d, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, double eps, bool center) {
  return NormFunction::apply(x, d, weight, bias, eps, center);
}

}  // namespace

TORCH_LIBRARY(normlab, m) {
  m.def("norm(Tensor x, int d, Tensor? weight, Tensor? bias, float eps, bool center) -> Tensor");
  m.def("norm_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps, bool center) -> (Tensor, Tensor, Tensor)");
  m.def("norm_bwd(Tensor grad, Tensor x, Tensor? weight, Tensor rstd, Tensor mean, bool center, bool has_bias)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("norm_loops() -> str", norm_loops);
}

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("norm", norm);
  m.impl("norm_fwd", norm_fwd);
  m.impl("norm_bwd", norm_bwd);
}

TORCH_LIBRARY_IMPL(normlab, Autograd, m) { m.impl("norm", norm_autograd); }
