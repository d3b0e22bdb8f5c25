// blocksparse's eager PyTorch layer norm and fused LSTM gates, each as one C++ autograd node: a
// forward and a backward that are each one call of the kernel library's entry point of the op
// (bsk_layer_norm_run / bsk_lstm_gates_run of src/ops/: spec selection, grid, the backward's
// partial sums of the parameters' gradients), no Python on the way -- in particular none in the
// backward, which autograd runs on its CUDA worker thread.
//
// Python (blocksparse/torch/_native.py) registers a library's entry points of an op once as an
// *entry*; the op takes its id.  An op serves the calls the library's specs serve: dense 2-D
// activations on 16-byte boundaries (float16, bfloat16, float32), parameters of any float dtype
// (float32 ones and -- layer norm -- ones of the activations' 16-bit dtype are read as they are,
// others through float32 copies, their gradients cast back; layer norm's may be absent), no
// autocast, both directions' specs present.  Any other call gets an undefined tensor / an empty list (None / [] in Python) and
// Python serves it; errors are Python's to raise.  A backward that builds a graph (create_graph,
// for double backward) runs the reference formulas in ATen ops, which autograd differentiates again.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "records.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

// bsk_layer_norm_call of src/ops/norms.h, member for member (the CPU tests' stand-in runtime is
// compiled against that header and checks every field).
struct LayerNormCall {
  int32_t dtype, axis, relu, segments;
  int64_t n_tokens, features;
  float epsilon;
  uint64_t x, g, b, y, mean, rstd;
  uint64_t dy, dx, dg, db, workspace;
  int32_t params;  // g and b: 0 float32, 1 x's 16-bit dtype
};

static_assert(offsetof(LayerNormCall, params) == 128 && sizeof(LayerNormCall) == 136,
              "LayerNormCall must be laid out as bsk_layer_norm_call");

struct LstmGatesCall {  // bsk_lstm_gates_call of src/ops/norms.h, member for member
  int32_t dtype, merged;
  int64_t n_tokens, features;
  float forget_bias;
  uint64_t c, i, j, f, o, bias, c_next, h_next;
  uint64_t dc_next, dh_next, dc, di, dj, df, d_o, dbias, workspace;
  int32_t params;  // bias and dbias: 0 float32, 1 c's 16-bit dtype
};

static_assert(offsetof(LstmGatesCall, params) == 168 && sizeof(LstmGatesCall) == 176,
              "LstmGatesCall must be laid out as bsk_lstm_gates_call");

// A family's four entry points in the kernel library: bsk_<op>_run, _workspace, _select and
// bsk_device_at, for calls of type Call.
template <typename Call>
struct Entry {
  int (*run)(const Call *, int, void *, char *, size_t) = nullptr;
  int (*workspace)(const Call *, void *, size_t *, char *, size_t) = nullptr;
  int (*select)(const Call *, int, int) = nullptr;
  int (*device)(void *, uint64_t, int *, int *, char *, size_t) = nullptr;
};

blocksparse_native::Registry<Entry<LayerNormCall>> entries("layer_norm entry");
blocksparse_native::Registry<Entry<LstmGatesCall>> gate_entries("lstm_gates entry");

template <typename Call>
int64_t add_entry(blocksparse_native::Registry<Entry<Call>> &registry, int64_t run, int64_t workspace, int64_t select,
                  int64_t device) {
  TORCH_CHECK(run && workspace && select && device, "an entry takes the addresses of the family's run, "
              "workspace and select functions and of bsk_device_at");
  Entry<Call> e;
  e.run = reinterpret_cast<decltype(e.run)>(run);
  e.workspace = reinterpret_cast<decltype(e.workspace)>(workspace);
  e.select = reinterpret_cast<decltype(e.select)>(select);
  e.device = reinterpret_cast<decltype(e.device)>(device);
  return registry.add(e);
}

void *current_stream(const at::Tensor &t) {
  if (!t.is_cuda()) return nullptr;  // CPU tensors: the tests' stand-in runtime
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle();
}

uint64_t address(const at::Tensor &t) { return reinterpret_cast<uint64_t>(t.data_ptr()); }

int dtype_code(at::ScalarType t) {  // BSK_FP16, BSK_BF16, BSK_FP32 (src/ops/dtypes.h); -1: none
  switch (t) {
    case at::kHalf: return 0;
    case at::kBFloat16: return 1;
    case at::kFloat: return 2;
    default: return -1;
  }
}

bool dense_aligned(const at::Tensor &t) { return t.is_contiguous() && address(t) % 16 == 0; }

// A parameter as the kernels read it: float32, dense, on a 16-byte boundary.
at::Tensor float32(const at::Tensor &p) {
  at::Tensor f = p.scalar_type() == at::kFloat ? p : p.to(at::kFloat);
  return dense_aligned(f) ? f : f.clone(at::MemoryFormat::Contiguous);
}

// The compute capability (10 * major + minor) of x's GPU as the library reads it, 0 where it cannot;
// read once per device (CPU tensors, the tests' stand-in: every call).
template <typename Call>
int device_arch(const Entry<Call> &e, const at::Tensor &x) {
  static std::atomic<int> archs[64];
  const int index = x.is_cuda() ? x.get_device() : -1;
  if (index >= 0 && index < 64 && archs[index].load() > 0) return archs[index].load();
  int arch = 0, sms = 0;
  char message[256] = {0};
  if (e.device(current_stream(x), address(x), &arch, &sms, message, sizeof message)) return 0;
  if (index >= 0 && index < 64) archs[index].store(arch);
  return arch;
}

// The call's fields, or false where the library cannot serve it (Python then does).
bool describe(const Entry<LayerNormCall> &e, const at::Tensor &x, const at::Tensor &g, const at::Tensor &b,
              int64_t &axis, double epsilon, bool relu, int64_t segments, LayerNormCall &call) {
  if (axis == -1 || axis == -2) axis += 2;  // counted from the end, as Python's checks take it
  if (!x.defined() || !g.defined() || !b.defined() || x.dim() != 2 || (axis != 0 && axis != 1)) return false;
  const int code = dtype_code(x.scalar_type());
  const int64_t c = x.size(axis), n = x.size(1 - axis);
  if (code < 0 || !dense_aligned(x) || c < 1 || segments < 1 || c % segments || !(epsilon > 0) ||
      !std::isfinite(epsilon))
    return false;
  for (const at::Tensor *p : {&g, &b})
    if (p->dim() != 1 || p->numel() != c || !p->is_floating_point() || p->device() != x.device()) return false;
  // 16-bit parameters of x's dtype are read as they are (no float32 copies)
  const bool params = code != 2 && g.scalar_type() == x.scalar_type() && b.scalar_type() == x.scalar_type() &&
                      dense_aligned(g) && dense_aligned(b);
  if (at::autocast::is_autocast_enabled(x.device().type())) return false;  // Python casts x first
  std::memset(&call, 0, sizeof call);
  call.dtype = code, call.axis = static_cast<int32_t>(axis), call.relu = relu;
  call.segments = static_cast<int32_t>(segments), call.n_tokens = n, call.features = c;
  call.epsilon = static_cast<float>(epsilon);
  call.params = params;
  const int arch = device_arch(e, x);
  return arch > 0 && e.select(&call, 0, arch) >= 0 && e.select(&call, 1, arch) >= 0;
}

template <typename Call>
void run(const Entry<Call> &e, const Call &call, int backward, void *stream, const char *op) {
  char message[1024] = {0};
  const int status = e.run(&call, backward, stream, message, sizeof message);
  TORCH_CHECK(status == 0, "blocksparse: ", op, " ", backward ? "backward" : "forward", " failed: ", message);
}

// The workspace of a backward call, allocated like `like` (float32 words, a few spare).
template <typename Call>
at::Tensor workspace(const Entry<Call> &e, const Call &call, void *stream, const at::Tensor &like, const char *op) {
  size_t bytes = 0;
  char message[1024] = {0};
  TORCH_CHECK(e.workspace(&call, stream, &bytes, message, sizeof message) == 0, "blocksparse: ", op,
              " backward failed: ", message);
  return at::empty({static_cast<int64_t>(bytes / 4 + 4)}, like.options().dtype(at::kFloat));
}

// The reference formulas (float32 accumulation, float64 stays float64) of the gradients, in ATen
// ops that autograd differentiates again; the statistics recomputed from x.  Activations grouped as
// (N, segments, features per segment).
at::Tensor grouped(const at::Tensor &t, int64_t axis, int64_t segments, at::ScalarType acc) {
  if (axis == 1) return t.reshape({t.size(0), segments, t.size(1) / segments}).to(acc);
  return t.reshape({segments, t.size(0) / segments, t.size(1)}).permute({2, 0, 1}).to(acc);
}

at::Tensor ungrouped(const at::Tensor &t, int64_t axis, at::ScalarType dtype) {
  const int64_t n = t.size(0), c = t.size(1) * t.size(2);
  if (axis == 1) return t.reshape({n, c}).to(dtype);
  return t.permute({1, 2, 0}).reshape({c, n}).to(dtype).contiguous();
}

torch::autograd::variable_list reference_grads(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &g,
                                               const at::Tensor &b, int64_t axis, double epsilon, bool relu,
                                               int64_t segments) {
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xs = grouped(x, axis, segments, acc);
  const at::Tensor xc = xs - xs.mean(-1, true);
  const at::Tensor rstd = at::rsqrt((xc * xc).mean(-1, true) + epsilon);
  const at::Tensor xhat = xc * rstd;
  const at::Tensor gs = g.reshape({segments, -1}).to(acc), bs = b.reshape({segments, -1}).to(acc);
  at::Tensor dys = grouped(dy, axis, segments, acc);
  if (relu) dys = dys * (xhat * gs + bs > 0);
  const at::Tensor dxhat = dys * gs;
  const at::Tensor dx = (dxhat - xhat * (xhat * dxhat).mean(-1, true) - dxhat.mean(-1, true)) * rstd;
  return {ungrouped(dx, axis, x.scalar_type()), (dys * xhat).sum(0).reshape(-1).to(g.scalar_type()),
          dys.sum(0).reshape(-1).to(b.scalar_type())};
}

// The gradients (dx, dg, db) through the library's backward: `saved` holds x, g, b, the float32 (or,
// with `params`, x's 16-bit dtype) g and b the kernels read, mean and rstd.
torch::autograd::variable_list kernel_grads(const Entry<LayerNormCall> &e, const at::Tensor &dy_in,
                                            const torch::autograd::variable_list &saved, int64_t axis, bool relu,
                                            int64_t segments, bool params) {
  const at::Tensor &x = saved[0], &g = saved[1], &b = saved[2];
  const int64_t c = x.size(axis);
  if (x.numel() == 0)  // no tokens: nothing to launch
    return {at::empty(x.sizes(), x.options()), at::zeros({c}, g.options()), at::zeros({c}, b.options())};
  const c10::DeviceGuard guard(x.device());
  at::Tensor dy = dy_in.scalar_type() == x.scalar_type() ? dy_in : dy_in.to(x.scalar_type());
  if (!dense_aligned(dy)) dy = blocksparse_native::aligned(dy);
  LayerNormCall call;
  std::memset(&call, 0, sizeof call);
  call.dtype = dtype_code(x.scalar_type()), call.axis = static_cast<int32_t>(axis), call.relu = relu;
  call.segments = static_cast<int32_t>(segments), call.n_tokens = x.size(1 - axis), call.features = c;
  call.params = params;
  const auto param_dtype = params ? x.scalar_type() : at::kFloat;  // the library writes dg, db so
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dg = at::empty({c}, x.options().dtype(param_dtype));
  at::Tensor db = at::empty({c}, x.options().dtype(param_dtype));
  call.x = address(x), call.g = address(saved[3]), call.b = address(saved[4]);
  call.mean = address(saved[5]), call.rstd = address(saved[6]);
  call.dy = address(dy), call.dx = address(dx), call.dg = address(dg), call.db = address(db);
  void *stream = current_stream(x);
  const at::Tensor scratch = workspace(e, call, stream, x, "layer_norm");
  call.workspace = address(scratch);
  run(e, call, 1, stream, "layer_norm");
  return {dx, g.scalar_type() == param_dtype ? dg : dg.to(g.scalar_type()),
          b.scalar_type() == param_dtype ? db : db.to(b.scalar_type())};
}

// The forward through the library: y, mean, rstd and the g and b the kernels read.
std::array<at::Tensor, 5> forward_kernels(const Entry<LayerNormCall> &e, LayerNormCall call, const at::Tensor &x,
                                          const at::Tensor &g, const at::Tensor &b) {
  const c10::DeviceGuard guard(x.device());  // the default stream launches in the current device's context
  const at::Tensor g32 = call.params ? g : float32(g), b32 = call.params ? b : float32(b);
  at::Tensor y = at::empty(x.sizes(), x.options());
  const auto stats = x.options().dtype(at::kFloat);
  at::Tensor mean = at::empty({call.segments, call.n_tokens}, stats);
  at::Tensor rstd = at::empty({call.segments, call.n_tokens}, stats);
  call.x = address(x), call.g = address(g32), call.b = address(b32);
  call.y = address(y), call.mean = address(mean), call.rstd = address(rstd);
  if (call.n_tokens) run(e, call, 0, current_stream(x), "layer_norm");
  return {y, mean, rstd, g32, b32};
}

struct LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x, const at::Tensor &g,
                            const at::Tensor &b, int64_t entry, LayerNormCall call, double epsilon) {
    auto [y, mean, rstd, g32, b32] = forward_kernels(entries.get(entry), call, x, g, b);
    ctx->save_for_backward({x, g, b, g32, b32, mean, rstd});
    ctx->saved_data["entry"] = entry;
    ctx->saved_data["axis"] = static_cast<int64_t>(call.axis);
    ctx->saved_data["relu"] = static_cast<bool>(call.relu);
    ctx->saved_data["segments"] = static_cast<int64_t>(call.segments);
    ctx->saved_data["params"] = static_cast<bool>(call.params);
    ctx->saved_data["epsilon"] = epsilon;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor &dy_in = grads[0];
    torch::autograd::variable_list out(6);
    if (!dy_in.defined()) return out;
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &g = saved[1], &b = saved[2];
    const int64_t axis = ctx->saved_data["axis"].toInt(), segments = ctx->saved_data["segments"].toInt();
    const bool relu = ctx->saved_data["relu"].toBool();
    // create_graph: formulas autograd can differentiate again
    const auto d = at::GradMode::is_enabled()
                       ? reference_grads(dy_in, x, g, b, axis, ctx->saved_data["epsilon"].toDouble(), relu, segments)
                       : kernel_grads(entries.get(ctx->saved_data["entry"].toInt()), dy_in, saved, axis, relu,
                                      segments, ctx->saved_data["params"].toBool());
    for (int i = 0; i < 3; ++i)
      if (ctx->needs_input_grad(i)) out[i] = d[i];
    return out;
  }
};

// y of the call, or an undefined tensor where the library does not serve it.
// An absent gain or bias is a row of ones or zeros of x's dtype (read as they are, their gradients
// dropped): made per call, so that nothing outlives a CUDA graph's capture.
at::Tensor layer_norm(const at::Tensor &x, const std::optional<at::Tensor> &g_in,
                      const std::optional<at::Tensor> &b_in, int64_t axis, double epsilon, bool relu, int64_t segments,
                      int64_t entry) {
  const int64_t a = axis < 0 ? axis + 2 : axis;
  if (!x.defined() || x.dim() != 2 || (a != 0 && a != 1)) return {};
  const bool has_g = g_in && g_in->defined(), has_b = b_in && b_in->defined();
  const at::Tensor g = has_g ? *g_in : at::ones({x.size(a)}, x.options());
  const at::Tensor b = has_b ? *b_in : at::zeros({x.size(a)}, x.options());
  LayerNormCall call;
  const Entry<LayerNormCall> &e = entries.get(entry);
  if (!describe(e, x, g, b, axis, epsilon, relu, segments, call)) return {};
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || g.requires_grad() || b.requires_grad()))
    return forward_kernels(e, call, x, g, b)[0];  // no gradient: no autograd node
  return LayerNormFunction::apply(x, g, b, entry, call, epsilon);
}

// ---- the fused LSTM gates ---------------------------------------------------------------------

// The call's fields (its bias a placeholder), or false where the library cannot serve it.  `gates`:
// the merged (N, 4K) tensor, or i, j, f, o.
bool describe_gates(const Entry<LstmGatesCall> &e, const at::Tensor &c, const std::vector<at::Tensor> &gates,
                    const std::optional<at::Tensor> &bias, double forget_bias, LstmGatesCall &call) {
  if (!c.defined() || c.dim() != 2) return false;
  const int code = dtype_code(c.scalar_type());
  const int64_t n = c.size(0), k = c.size(1), width = gates.size() == 1 ? 4 * k : k;
  if (code < 0 || !dense_aligned(c) || k < 1 || !std::isfinite(forget_bias)) return false;
  for (const at::Tensor &t : gates)
    if (!t.defined() || t.dim() != 2 || t.size(0) != n || t.size(1) != width || t.scalar_type() != c.scalar_type() ||
        t.device() != c.device() || !dense_aligned(t))
      return false;
  const bool has_bias = bias && bias->defined();
  if (has_bias && (bias->dim() != 1 || bias->numel() != 4 * k || !bias->is_floating_point() ||
                   bias->device() != c.device()))
    return false;
  if (at::autocast::is_autocast_enabled(c.device().type())) return false;  // Python casts first
  std::memset(&call, 0, sizeof call);
  call.dtype = code, call.merged = gates.size() == 1, call.n_tokens = n, call.features = k;
  call.forget_bias = static_cast<float>(forget_bias);
  call.bias = has_bias;  // selection asks only whether there is one
  // a 16-bit bias of c's dtype is read as it is (no float32 copy), dbias written in it
  call.params = has_bias && code != 2 && bias->scalar_type() == c.scalar_type() && dense_aligned(*bias);
  const int arch = device_arch(e, c);
  return arch > 0 && e.select(&call, 0, arch) >= 0 && e.select(&call, 1, arch) >= 0;
}

// The reference formulas of the gradients (dc, the gates' gradients, dbias) in ATen ops that
// autograd differentiates again (float32 arithmetic; float64 stays float64).
torch::autograd::variable_list reference_gate_grads(const at::Tensor &c, const std::vector<at::Tensor> &gates,
                                                    const at::Tensor &bias, const at::Tensor &dc_next,
                                                    const at::Tensor &dh_next, double forget_bias) {
  const at::ScalarType acc = c.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t k = c.size(1);
  std::vector<at::Tensor> pre = gates.size() == 1 ? gates[0].split(k, 1) : gates;
  for (int g = 0; g < 4; ++g) {
    pre[g] = pre[g].to(acc);
    if (bias.defined()) pre[g] = pre[g] + bias.narrow(0, g * k, k).to(acc);
  }
  const at::Tensor i = at::sigmoid(pre[0]), j = at::tanh(pre[1]), f = at::sigmoid(pre[2] + forget_bias);
  const at::Tensor o = at::sigmoid(pre[3]), cs = c.to(acc);
  const at::Tensor t = at::tanh(f * cs + i * j), dh = dh_next.to(acc);
  const at::Tensor dcn = dc_next.to(acc) + dh * o * (1 - t * t);
  std::vector<at::Tensor> d = {dcn * j * i * (1 - i), dcn * i * (1 - j * j), dcn * cs * f * (1 - f),
                               dh * t * o * (1 - o)};
  const at::ScalarType dtype = gates[0].scalar_type();
  torch::autograd::variable_list out = {(dcn * f).to(dtype)};
  if (gates.size() == 1) {
    out.push_back(at::cat(d, 1).to(dtype));
  } else {
    for (const at::Tensor &g : d) out.push_back(g.to(dtype));
  }
  if (bias.defined()) {
    std::vector<at::Tensor> sums;
    for (const at::Tensor &g : d) sums.push_back(g.sum(0));
    out.push_back(at::cat(sums).to(bias.scalar_type()));
  }
  return out;
}

std::vector<at::Tensor> defined(std::initializer_list<at::Tensor> ts) {
  std::vector<at::Tensor> out;
  for (const at::Tensor &t : ts)
    if (t.defined()) out.push_back(t);
  return out;
}

// The forward through the library: c_next, h_next and the bias the kernels read (the bias itself,
// or its float32 copy).  `gates`: the merged gates and three undefined tensors, or i, j, f, o.
std::array<at::Tensor, 3> gates_forward(const Entry<LstmGatesCall> &e, LstmGatesCall call, const at::Tensor &c,
                                        const std::array<at::Tensor, 4> &gates, const at::Tensor &bias) {
  const c10::DeviceGuard guard(c.device());
  const at::Tensor bias32 = !bias.defined() ? at::Tensor() : call.params ? bias : float32(bias);
  at::Tensor c_next = at::empty(c.sizes(), c.options()), h_next = at::empty(c.sizes(), c.options());
  call.c = address(c), call.i = address(gates[0]), call.bias = bias.defined() ? address(bias32) : 0;
  if (!call.merged) call.j = address(gates[1]), call.f = address(gates[2]), call.o = address(gates[3]);
  call.c_next = address(c_next), call.h_next = address(h_next);
  if (call.n_tokens) run(e, call, 0, current_stream(c), "lstm_gates");
  return {c_next, h_next, bias32};
}

struct LstmGatesFunction : public torch::autograd::Function<LstmGatesFunction> {
  // i is the merged (N, 4K) gates where j, f and o are absent (optional: autograd's records of
  // the inputs take no undefined tensors)
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, const at::Tensor &c,
                                                const at::Tensor &i, const std::optional<at::Tensor> &j_in,
                                                const std::optional<at::Tensor> &f_in,
                                                const std::optional<at::Tensor> &o_in,
                                                const std::optional<at::Tensor> &bias_in, int64_t entry,
                                                LstmGatesCall call) {
    const at::Tensor none, &j = j_in ? *j_in : none, &f = f_in ? *f_in : none, &o = o_in ? *o_in : none;
    const at::Tensor &bias = bias_in ? *bias_in : none;
    auto [c_next, h_next, bias32] = gates_forward(gate_entries.get(entry), call, c, {i, j, f, o}, bias);
    ctx->save_for_backward({c, i, j, f, o, bias, bias32});
    ctx->saved_data["entry"] = entry;
    ctx->saved_data["forget_bias"] = static_cast<double>(call.forget_bias);
    ctx->saved_data["params"] = static_cast<int64_t>(call.params);
    return {c_next, h_next};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &c = saved[0], &bias = saved[5];
    const bool merged = !saved[2].defined();
    const std::vector<at::Tensor> gates = merged ? std::vector<at::Tensor>{saved[1]}
                                                 : std::vector<at::Tensor>{saved[1], saved[2], saved[3], saved[4]};
    const double forget_bias = ctx->saved_data["forget_bias"].toDouble();
    // autograd materialises an unused output's gradient as zeros
    const at::Tensor dc_next = grads[0].to(c.scalar_type()), dh_next = grads[1].to(c.scalar_type());
    torch::autograd::variable_list d;  // dc, the gates' gradients, dbias (with a bias)
    if (at::GradMode::is_enabled()) {  // create_graph: formulas autograd can differentiate again
      d = reference_gate_grads(c, gates, bias, dc_next, dh_next, forget_bias);
    } else {
      const Entry<LstmGatesCall> &e = gate_entries.get(ctx->saved_data["entry"].toInt());
      const c10::DeviceGuard guard(c.device());
      const int64_t k = c.size(1);
      d.push_back(at::empty(c.sizes(), c.options()));
      for (const at::Tensor &t : gates) d.push_back(at::empty(t.sizes(), t.options()));
      const int32_t params = static_cast<int32_t>(ctx->saved_data["params"].toInt());
      const auto dbias_dtype = params ? bias.scalar_type() : at::kFloat;  // as the library writes it
      at::Tensor dbias = bias.defined() ? at::empty({4 * k}, c.options().dtype(dbias_dtype)) : at::Tensor();
      if (c.size(0) == 0) {
        if (bias.defined()) dbias.zero_();
      } else {
        const at::Tensor dcn = blocksparse_native::aligned(dc_next), dhn = blocksparse_native::aligned(dh_next);
        LstmGatesCall call;
        std::memset(&call, 0, sizeof call);
        call.dtype = dtype_code(c.scalar_type()), call.merged = merged, call.n_tokens = c.size(0), call.features = k;
        call.forget_bias = static_cast<float>(forget_bias), call.params = params;
        call.c = address(c), call.bias = bias.defined() ? address(saved[6]) : 0;
        uint64_t *in[4] = {&call.i, &call.j, &call.f, &call.o}, *out[4] = {&call.di, &call.dj, &call.df, &call.d_o};
        for (size_t g = 0; g < gates.size(); ++g) *in[g] = address(gates[g]), *out[g] = address(d[1 + g]);
        call.dc_next = address(dcn), call.dh_next = address(dhn), call.dc = address(d[0]);
        call.dbias = bias.defined() ? address(dbias) : 0;
        void *stream = current_stream(c);
        const at::Tensor scratch = workspace(e, call, stream, c, "lstm_gates");
        call.workspace = address(scratch);
        run(e, call, 1, stream, "lstm_gates");
      }
      if (bias.defined()) d.push_back(dbias.scalar_type() == bias.scalar_type() ? dbias : dbias.to(bias.scalar_type()));
    }
    // one gradient per forward argument; needs_input_grad counts the tensors given: c, the gates
    // (one or four), the bias
    torch::autograd::variable_list out(8);
    const size_t n_gates = gates.size();
    for (size_t slot = 0; slot < 1 + n_gates; ++slot)  // c, then i (or the merged gates), j, f, o
      if (ctx->needs_input_grad(slot)) out[slot] = d[slot];
    if (bias.defined() && ctx->needs_input_grad(1 + n_gates)) out[5] = d[1 + n_gates];
    return out;
  }
};

// (c_next, h_next) of the call, or an empty list where the library does not serve it.
std::vector<at::Tensor> lstm_gates(const at::Tensor &c, const at::Tensor &i, const std::optional<at::Tensor> &j,
                                   const std::optional<at::Tensor> &f, const std::optional<at::Tensor> &o,
                                   const std::optional<at::Tensor> &bias, double forget_bias, int64_t entry) {
  const bool four = j && j->defined();
  if (four && !(f && f->defined() && o && o->defined())) return {};
  const std::vector<at::Tensor> gates = four ? std::vector<at::Tensor>{i, *j, *f, *o} : std::vector<at::Tensor>{i};
  LstmGatesCall call;
  const Entry<LstmGatesCall> &e = gate_entries.get(entry);
  if (!describe_gates(e, c, gates, bias, forget_bias, call)) return {};
  bool grad = c.requires_grad() || (bias && bias->defined() && bias->requires_grad());
  for (const at::Tensor &t : gates) grad = grad || t.requires_grad();
  if (!at::GradMode::is_enabled() || !grad) {  // no gradient: no autograd node
    const at::Tensor undefined, &b = bias ? *bias : undefined;
    auto out = four ? gates_forward(e, call, c, {i, *j, *f, *o}, b)
                    : gates_forward(e, call, c, {i, undefined, undefined, undefined}, b);
    return {out[0], out[1]};
  }
  const std::optional<at::Tensor> none;
  const std::optional<at::Tensor> b = bias && bias->defined() ? bias : none;
  return LstmGatesFunction::apply(c, i, four ? j : none, four ? f : none, four ? o : none, b, entry, call);
}

int64_t norms_entry(int64_t run, int64_t workspace, int64_t select, int64_t device) {
  return add_entry(entries, run, workspace, select, device);
}

int64_t lstm_gates_entry(int64_t run, int64_t workspace, int64_t select, int64_t device) {
  return add_entry(gate_entries, run, workspace, select, device);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(blocksparse_native, m) {
  m.def("layer_norm(Tensor x, Tensor? g, Tensor? b, int axis, float epsilon, bool relu, int segments, int entry) "
        "-> Tensor");
  m.impl("layer_norm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(layer_norm));
  m.def("norms_entry(int run, int workspace, int select, int device) -> int", norms_entry);
  m.def("lstm_gates(Tensor c, Tensor i, Tensor? j, Tensor? f, Tensor? o, Tensor? bias, float forget_bias, "
        "int entry) -> Tensor[]");
  m.impl("lstm_gates", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(lstm_gates));
  m.def("lstm_gates_entry(int run, int workspace, int select, int device) -> int", lstm_gates_entry);
}
