// blocksparse's eager PyTorch linear as one C++ autograd node: y = x @ W (+ bias) and its two
// gradients, each product a prepared launch of the kernel library (bsk_launch), no Python on the
// call's way once planned -- in particular none in the backward, which autograd runs on its CUDA
// worker thread.
//
// Python (blocksparse/torch/_native.py) prepares a *record* per product and call shape: the spec,
// grid and packed bsk_arg array of an AotLaunch, the argument words that take the call's tensor
// pointers, the output's shape and dtype, whether it is zero-filled first (float32 atomics) and
// cast after, or the scratch its split reduction finishes in the kernel with.  Records are registered once and named by an integer; the op takes three of them.
// Each record carries the addresses of its kernel library's bsk_launch and bsk_memset32, so this
// file links against nothing but torch.  The other native ops built into the same library (the
// implicit-GEMM convolution, conv.cpp) launch records through the two functions of records.h.
//
// A layer whose block size the kernels do not take runs on its layout refined into theirs: packed
// (the records' kernels read and write the weight's parts where they lie: factor 1 here), or
// passing the factor of its refinement, when the op re-blocks the weight and the gradient itself.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "records.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using LaunchFn = int (*)(int, const unsigned *, const void *, int, void *, char *, size_t);
using MemsetFn = int (*)(uint64_t, uint32_t, size_t, void *, char *, size_t);

struct Record {
  LaunchFn launch = nullptr;
  MemsetFn memset32 = nullptr;
  int64_t spec = -1;
  unsigned grid[3] = {1, 1, 1};
  std::vector<uint64_t> words;                // the packed bsk_arg array
  int64_t nargs = 0;
  std::vector<std::pair<int64_t, int64_t>> slots;  // (word, operand: 0 input, 1 weight / dy, 2 out, 3 bias)
  std::vector<int64_t> out_shape;
  at::ScalarType out_dtype = at::kFloat;
  bool zero = false;
  std::optional<at::ScalarType> cast_to;
  bool pretranspose = false;                  // bprop: the weight's blocks transposed first
  int64_t pack = 1;                           // the layout's packing (Layout.packing): blocks in the weight
  bool fused_bias = false;                    // fprop: the kernel adds the bias (operand 3)
  bool transpose_inputs = false;              // updat of (F, N) activations: run on (N, F) copies
  int64_t ws_elements = 0, counter_elements = 0;  // split reductions finished in the kernel: the
                                                  // zeroed scratch (operands 4 and 5) they need
};

blocksparse_native::Registry<Record> registry("launch record");

const Record &record(int64_t id) { return registry.get(id); }

void *current_stream(const at::Tensor &t) {
  if (!t.is_cuda()) return nullptr;  // CPU tensors: the tests' stand-in runtime
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle();
}

// The zeroed scratch of split reductions finished in the kernel (blocksparse/ops/matmul/ticket.py):
// a float32 workspace and int32 ticket counters per device and stream, grown on demand and never
// freed (no GPU work at exit; an outgrown one is kept too, since a CUDA graph captured with it may
// replay it).  Every launch leaves them zero, so no call fills them; calls on one stream run in
// order and share them.
std::pair<at::Tensor, at::Tensor> scratch(const at::Tensor &like, void *stream, int64_t ws, int64_t counters) {
  static std::mutex lock;
  static auto *buffers = new std::map<std::pair<int64_t, void *>, std::pair<at::Tensor, at::Tensor>>();
  static auto *outgrown = new std::vector<at::Tensor>();
  std::lock_guard<std::mutex> guard(lock);
  auto &pair = (*buffers)[{like.is_cuda() ? int64_t(like.get_device()) : int64_t(-1), stream}];
  if (!pair.first.defined() || pair.first.numel() < ws) {
    if (pair.first.defined()) outgrown->push_back(pair.first);
    pair.first = at::zeros({std::max<int64_t>(ws, 1 << 16)}, like.options().dtype(at::kFloat));
  }
  if (!pair.second.defined() || pair.second.numel() < counters) {
    if (pair.second.defined()) outgrown->push_back(pair.second);
    pair.second = at::zeros({std::max<int64_t>(counters, 1 << 12)}, like.options().dtype(at::kInt));
  }
  return pair;
}

// Every block of the weight transposed where it lies: with packing p > 1, each of the p x p parts of
// every stored block (blocksparse/torch/_matmul/launch.py transpose_blocks).
at::Tensor transpose_blocks(const at::Tensor &w, int64_t pack) {
  if (pack == 1) return w.transpose(1, 2).contiguous();
  const int64_t bs = w.size(1) / pack;
  return w.view({-1, pack, bs, pack, bs}).transpose(2, 4).contiguous().view(w.sizes());
}

// One product: allocate, (zero-fill,) launch, (cast,) (add the bias per output feature: in the
// kernel where the record says, else in the same pass as the cast where there is one).
at::Tensor run(const Record &r, at::Tensor a, at::Tensor b, const std::optional<at::Tensor> &bias = {}) {
  const c10::DeviceGuard guard(a.device());  // the default stream launches in the current device's context
  if (r.pretranspose) b = transpose_blocks(b, r.pack);
  if (r.transpose_inputs) {
    a = a.t().contiguous();
    b = b.t().contiguous();
  }
  at::Tensor out = at::empty(r.out_shape, a.options().dtype(r.out_dtype));
  at::Tensor fused;  // the bias as the kernel reads it: the activations' dtype, dense
  if (r.fused_bias) {
    TORCH_CHECK(bias && bias->defined(), "blocksparse: this launch adds a bias; none was given");
    TORCH_CHECK(bias->device() == a.device(), "bias must be on the input's device ", a.device(), "; got ",
                bias->device());
    fused = bias->scalar_type() == a.scalar_type() && bias->is_contiguous() ? *bias
                                                                             : bias->to(a.scalar_type()).contiguous();
  }
  void *stream = current_stream(a);
  std::pair<at::Tensor, at::Tensor> tickets;
  if (r.ws_elements > 0) tickets = scratch(a, stream, r.ws_elements, r.counter_elements);
  const at::Tensor *operands[6] = {&a, &b, &out, &fused, &tickets.first, &tickets.second};
  std::vector<uint64_t> words(r.words);  // a copy per call: records are shared between threads
  for (const auto &slot : r.slots)
    words[slot.first] = reinterpret_cast<uint64_t>(operands[slot.second]->data_ptr());
  char message[1024] = {0};
  if (r.zero && out.numel()) {
    int status = r.memset32(reinterpret_cast<uint64_t>(out.data_ptr()), 0,
                           static_cast<size_t>(out.numel()) * out.element_size() / 4, stream, message,
                           sizeof message);
    TORCH_CHECK(status == 0, "blocksparse: zero fill failed: ", message);
  }
  int status = r.launch(static_cast<int>(r.spec), r.grid, words.data(), static_cast<int>(r.nargs), stream, message,
                         sizeof message);
  TORCH_CHECK(status == 0, "blocksparse: kernel launch failed: ", message);
  if (!bias || r.fused_bias) return r.cast_to ? out.to(*r.cast_to) : out;
  if (r.cast_to) {  // the float32 sums plus the bias, rounded once to the output dtype
    at::Tensor y = at::empty(r.out_shape, a.options().dtype(*r.cast_to));
    return at::add_out(y, out, *bias);
  }
  return out.add_(bias->scalar_type() == out.scalar_type() ? *bias : bias->to(out.scalar_type()));
}

// A layer whose blocks are larger than the kernels' runs on its layout refined by `factor` r into
// the kernels' block size s, numbered coarse block by coarse block: fine block b*r*r + i*r + j is
// part (i, j) of coarse block b.  The fine weight is one transposing copy of the coarse one, and
// its gradient one back.  The copies move whole rows of s elements, so they run on the tensors
// viewed as 8-byte words where a row is made of them: a quarter of the elements (16-bit) for the
// strided copy kernel, which is bound by its per-element index arithmetic (4 copies took 10% of a
// step of the large pixelfly MLP on the H200 as elements, 3% as words).  Small weights keep elements:
// there the two extra views cost more host time than the copy's GPU time they save.
constexpr int64_t kWordCopyMinElements = int64_t(1) << 20;

int64_t word_elements(const at::Tensor &t, int64_t s) {
  if (t.numel() < kWordCopyMinElements) return 1;
  const int64_t e = t.element_size();
  const bool whole = (s * e) % 8 == 0 && (t.storage_offset() * e) % 8 == 0;
  return e < 8 && 8 % e == 0 && whole ? 8 / e : 1;
}

// A broadcast scalar (every stride 0: the gradient of a sum() or a mean()) is made dense from its one
// element repeated as 8-byte words, for the same reason: as elements, 32 M bfloat16 took the strided
// copy kernel 41 us on the H200 (2.5% of a step of the large pixelfly MLP).
at::Tensor dense_broadcast(const at::Tensor &t) {
  const int64_t unit = 8 / t.element_size();
  at::Tensor word = t.as_strided({unit}, {0}).contiguous().view(at::kLong);  // the element, unit times
  return word.expand({t.numel() / unit}).contiguous().view(t.scalar_type()).view(t.sizes());
}

bool broadcast_scalar(const at::Tensor &t) {
  for (int64_t stride : t.strides())
    if (stride != 0) return false;
  return t.numel() > 0;
}

bool broadcast_words(const at::Tensor &t) {
  const int64_t e = t.element_size();
  return broadcast_scalar(t) && t.numel() >= kWordCopyMinElements && e < 8 && 8 % e == 0 && t.numel() % (8 / e) == 0;
}

at::Tensor aligned(const at::Tensor &t) {
  // the records were planned for dense row-major operands on 16-byte boundaries
  if (t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0) return t;
  if (broadcast_words(t)) return dense_broadcast(t);
  return t.clone(at::MemoryFormat::Contiguous);
}

at::Tensor reblock(const at::Tensor &t, int64_t blocks, int64_t r, int64_t s, bool to_fine) {
  const at::Tensor dense = t.contiguous();
  const int64_t unit = word_elements(dense, s), sw = s / unit;
  at::Tensor words = unit > 1 ? dense.view(at::kLong) : dense;
  at::Tensor out = to_fine ? words.reshape({blocks, r, s, r, sw}).transpose(2, 3).contiguous().view({blocks * r * r, s, sw})
                           : words.view({blocks, r, r, s, sw}).transpose(2, 3).contiguous().view({blocks, r * s, r * sw});
  return unit > 1 ? out.view(t.scalar_type()) : out;
}

at::Tensor refine(const at::Tensor &w, int64_t r) {
  return reblock(w, w.size(0), r, w.size(1) / r, true);
}

at::Tensor coarsen(const at::Tensor &dw_fine, int64_t r) {
  return reblock(dw_fine, dw_fine.size(0) / (r * r), r, dw_fine.size(1), false);
}

// The bias gradient: dy's column sums.  16-bit dy on a GPU: a row of ones times dy through cuBLAS
// (float32 accumulation, the same result as at::sum's; 1.3-1.8x faster than its column reduction at
// 8192 tokens on the H200: bench/results/raw/colsum-h200.json); float32 keeps at::sum (no TF32).
// The ones rows are made once per device and dtype (grown for more tokens) and kept for the process,
// like the plans' tables: the calls that warm a CUDA graph up make them before its capture.
//
// A broadcast scalar's columns each sum to the token count times it: one multiply, no pass over the
// tokens (the float32 product, rounded once, as the sums of the dense copy give it).
at::Tensor column_sums(const at::Tensor &dy) {
  if (dy.dim() == 2 && broadcast_scalar(dy)) {
    at::Tensor sum = dy.as_strided({1}, {0}).to(at::kFloat).mul(static_cast<double>(dy.size(0)));
    return sum.to(dy.scalar_type()).expand({dy.size(1)}).contiguous();
  }
  if (!dy.is_cuda() || dy.dim() != 2 || dy.size(0) == 0 ||
      (dy.scalar_type() != at::kBFloat16 && dy.scalar_type() != at::kHalf))
    return dy.sum(0);
  static std::mutex lock;
  static auto *rows = new std::map<std::pair<int, int>, at::Tensor>();  // never freed: no GPU work at exit
  const int64_t n = dy.size(0);
  at::Tensor ones;
  {
    std::lock_guard<std::mutex> guard(lock);
    at::Tensor &row = (*rows)[{static_cast<int>(dy.get_device()), static_cast<int>(dy.scalar_type())}];
    if (!row.defined() || row.size(1) < n) row = at::ones({1, std::max<int64_t>(n, 8192)}, dy.options());
    ones = row;
  }
  return at::mm(ones.narrow(1, 0, n), dy).view({dy.size(1)});
}

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x_in, const at::Tensor &w,
                            const std::optional<at::Tensor> &bias, int64_t fprop, int64_t bprop, int64_t updat,
                            int64_t factor) {
    at::Tensor x = aligned(x_in);
    at::Tensor wk = factor > 1 ? refine(w, factor) : aligned(w);
    ctx->save_for_backward({x, wk});
    ctx->saved_data["bprop"] = bprop;
    ctx->saved_data["updat"] = updat;
    ctx->saved_data["bias_dtype"] = bias ? static_cast<int64_t>(bias->scalar_type()) : int64_t(-1);
    ctx->saved_data["factor"] = factor;
    return run(record(fprop), x, wk, bias);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    at::Tensor dy = aligned(grads[0]);
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = run(record(ctx->saved_data["bprop"].toInt()), dy, w);
    if (ctx->needs_input_grad(1)) {
      dw = run(record(ctx->saved_data["updat"].toInt()), x, dy);
      int64_t factor = ctx->saved_data["factor"].toInt();
      if (factor > 1) dw = coarsen(dw, factor);
    }
    int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    if (bias_dtype >= 0 && ctx->needs_input_grad(2)) {
      db = column_sums(broadcast_scalar(grads[0]) ? grads[0] : dy);
      if (db.scalar_type() != static_cast<at::ScalarType>(bias_dtype)) db = db.to(static_cast<at::ScalarType>(bias_dtype));
    }
    return {dx, dw, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor linear(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &bias, int64_t fprop,
                  int64_t bprop, int64_t updat, int64_t factor) {
  TORCH_CHECK(factor >= 1, "factor must be >= 1; got ", factor);
  if (factor > 1)
    TORCH_CHECK(w.dim() == 3 && w.size(1) == w.size(2) && w.size(1) % factor == 0,
                "w must have shape (blocks, bs, bs) with bs a multiple of factor ", factor, "; got ", w.sizes());
  return LinearFunction::apply(x, w, bias, fprop, bprop, updat, factor);
}

// The layers' eager fast path: per layer, the record ids of the call kinds Python planned, looked up
// here by everything a plan depends on -- so that a planned call runs no Python beyond one op call.
// Python stores an entry after planning a call (`fast_store`) and drops a layer's entries when its
// choices change (`fast_clear`); a call whose kind has no entry returns an undefined tensor (None in
// Python), and Python plans it.
struct CallKind {
  int64_t tokens = 0, in_features = 0;
  at::ScalarType x_dtype = at::kFloat, w_dtype = at::kFloat;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  int cast = -1;      // autocast's dtype for the device, -1 when off
  bool grad = false;  // a backward will be asked for
  bool bias = false;  // a bias is given
  bool tf32 = false;
  std::string backend, native;  // BLOCKSPARSE_BACKEND, BLOCKSPARSE_TORCH_NATIVE ("\1" when unset)

  bool operator==(const CallKind &o) const {
    return tokens == o.tokens && in_features == o.in_features && x_dtype == o.x_dtype && w_dtype == o.w_dtype &&
           device == o.device && cast == o.cast && grad == o.grad && bias == o.bias && tf32 == o.tf32 &&
           backend == o.backend &&
           native == o.native;
  }
};

struct FastEntry {
  CallKind kind;
  std::vector<int64_t> w_shape;
  int64_t out_features = 0, ids[3] = {-1, -1, -1}, factor = 1;
};

std::mutex fast_lock;
std::vector<std::vector<FastEntry>> fast_layers;  // by layer id; a layer holds a few entries

std::string env(const char *name) {
  const char *v = std::getenv(name);
  return v ? std::string(v) : std::string("\1");
}

// The kind of the call (x, w, bias), or false where no fast path applies (not a 1-D+ floating x).
bool call_kind(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &bias, CallKind &k) {
  if (!x.defined() || !w.defined() || x.dim() < 1 || !x.is_floating_point()) return false;
  k.in_features = x.size(-1);
  if (k.in_features <= 0) return false;
  k.tokens = x.dim() == 2 ? x.size(0) : x.numel() / k.in_features;
  k.x_dtype = x.scalar_type();
  k.w_dtype = w.scalar_type();
  k.device = x.device();
  const auto type = k.device.type();
  k.cast = at::autocast::is_autocast_enabled(type) ? static_cast<int>(at::autocast::get_autocast_dtype(type)) : -1;
  k.grad = at::GradMode::is_enabled() &&
           (x.requires_grad() || w.requires_grad() || (bias && bias->defined() && bias->requires_grad()));
  k.bias = bias && bias->defined();
  k.tf32 = at::globalContext().allowTF32CuBLAS();
  k.backend = env("BLOCKSPARSE_BACKEND");
  k.native = env("BLOCKSPARSE_TORCH_NATIVE");
  return true;
}

// y = x @ W (+ bias) for x of shape (..., in_features) where the layer's call kind was stored, else
// an undefined tensor.
at::Tensor fast(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &bias, int64_t layer) {
  CallKind k;
  if (!call_kind(x, w, bias, k) || w.device() != x.device()) return {};
  int64_t ids[3], factor, out_features;
  {
    std::lock_guard<std::mutex> guard(fast_lock);
    if (layer < 0 || layer >= static_cast<int64_t>(fast_layers.size())) return {};
    const FastEntry *hit = nullptr;
    for (const auto &entry : fast_layers[layer])
      if (entry.kind == k) hit = &entry;
    if (!hit || w.sizes() != at::IntArrayRef(hit->w_shape) || k.tokens == 0) return {};
    std::copy(hit->ids, hit->ids + 3, ids);
    factor = hit->factor;
    out_features = hit->out_features;
  }
  at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, k.in_features});
  at::Tensor wk = w;
  if (k.cast >= 0) {
    const auto cast = static_cast<at::ScalarType>(k.cast);
    x2 = x2.to(cast);
    wk = w.to(cast);
  }
  at::Tensor y = LinearFunction::apply(x2, wk, bias, ids[0], ids[1], ids[2], factor);
  if (x.dim() == 2) return y;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(out_features);
  return y.view(shape);
}

// A new layer id (its entries empty).
int64_t fast_layer() {
  std::lock_guard<std::mutex> guard(fast_lock);
  fast_layers.emplace_back();
  return static_cast<int64_t>(fast_layers.size()) - 1;
}

// Remember that calls like (x, w, bias) run the records ids[0..2] with this refinement factor; x of
// shape (..., in_features) gives out_features.
void fast_store(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &bias, int64_t layer,
                int64_t fprop, int64_t bprop, int64_t updat, int64_t factor, int64_t out_features) {
  FastEntry e;
  TORCH_CHECK(call_kind(x, w, bias, e.kind), "fast_store: x must be a floating tensor of shape (..., in_features)");
  e.w_shape.assign(w.sizes().begin(), w.sizes().end());
  e.out_features = out_features;
  e.ids[0] = fprop;
  e.ids[1] = bprop;
  e.ids[2] = updat;
  e.factor = factor;
  std::lock_guard<std::mutex> guard(fast_lock);
  TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(fast_layers.size()), "fast_store: unknown layer ", layer);
  for (auto &entry : fast_layers[layer])
    if (entry.kind == e.kind) {
      entry = e;
      return;
    }
  fast_layers[layer].push_back(std::move(e));
}

// Forget a layer's entries (its implementation override changed).
void fast_clear(int64_t layer) {
  std::lock_guard<std::mutex> guard(fast_lock);
  if (layer >= 0 && layer < static_cast<int64_t>(fast_layers.size())) fast_layers[layer].clear();
}

int64_t add_record(int64_t launch, int64_t memset32, int64_t spec, at::IntArrayRef grid, const at::Tensor &words, int64_t nargs,
                   at::IntArrayRef slots, at::IntArrayRef out_shape, at::ScalarType out_dtype, bool zero,
                   std::optional<at::ScalarType> cast_to, bool pretranspose, bool fused_bias,
                   bool transpose_inputs, int64_t ws_elements, int64_t counter_elements, int64_t pack) {
  TORCH_CHECK(grid.size() == 3, "grid must have 3 dimensions");
  TORCH_CHECK(words.scalar_type() == at::kLong && words.dim() == 1 && words.is_contiguous() && !words.is_cuda(),
              "words must be a contiguous 1-D int64 CPU tensor");
  TORCH_CHECK(slots.size() % 2 == 0, "slots must hold (word, operand) pairs");
  TORCH_CHECK(launch && memset32, "launch and memset32 must be the addresses of bsk_launch and bsk_memset32");
  TORCH_CHECK(pack >= 1, "pack must be >= 1; got ", pack);
  Record r;
  r.launch = reinterpret_cast<LaunchFn>(launch);
  r.memset32 = reinterpret_cast<MemsetFn>(memset32);
  r.spec = spec;
  for (int i = 0; i < 3; ++i) r.grid[i] = static_cast<unsigned>(grid[i]);
  const int64_t *data = words.data_ptr<int64_t>();
  r.words.assign(reinterpret_cast<const uint64_t *>(data), reinterpret_cast<const uint64_t *>(data) + words.numel());
  r.nargs = nargs;
  TORCH_CHECK(ws_elements >= 0 && counter_elements >= 0 && (ws_elements > 0) == (counter_elements > 0),
              "ws_elements and counter_elements must both be positive (tickets) or both 0; got ", ws_elements,
              " and ", counter_elements);
  for (size_t i = 0; i < slots.size(); i += 2) {
    const int64_t operand = slots[i + 1];
    const bool known = operand == 0 || operand == 1 || operand == 2 || (operand == 3 && fused_bias) ||
                       (operand >= 4 && operand <= 5 && ws_elements > 0);
    TORCH_CHECK(slots[i] >= 0 && slots[i] < words.numel() && known, "slot (", slots[i], ", ", operand,
                ") is out of range");
    r.slots.emplace_back(slots[i], operand);
  }
  r.out_shape.assign(out_shape.begin(), out_shape.end());
  r.out_dtype = out_dtype;
  r.zero = zero;
  r.cast_to = cast_to;
  r.pretranspose = pretranspose;
  r.pack = pack;
  r.fused_bias = fused_bias;
  r.transpose_inputs = transpose_inputs;
  r.ws_elements = ws_elements;
  r.counter_elements = counter_elements;
  return registry.add(std::move(r));
}

}  // namespace

namespace blocksparse_native {

at::Tensor launch(int64_t id, const at::Tensor &a, const at::Tensor &b) { return run(record(id), a, b); }

at::Tensor aligned(const at::Tensor &t) { return ::aligned(t); }

}  // namespace blocksparse_native

TORCH_LIBRARY(blocksparse_native, m) {
  m.def("linear(Tensor x, Tensor w, Tensor? bias, int fprop, int bprop, int updat, int factor=1) -> Tensor");
  m.impl("linear", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(linear));
  m.def("add_record(int launch, int memset32, int spec, int[] grid, Tensor words, int nargs, int[] slots, int[] out_shape, "
        "ScalarType out_dtype, bool zero, ScalarType? cast_to, bool pretranspose, bool fused_bias=False, "
        "bool transpose_inputs=False, int ws_elements=0, int counter_elements=0, int pack=1) -> int",
        add_record);
  m.def("fast(Tensor x, Tensor w, Tensor? bias, int layer) -> Tensor");
  m.impl("fast", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(fast));
  m.def("fast_layer() -> int", fast_layer);
  m.def("fast_store(Tensor x, Tensor w, Tensor? bias, int layer, int fprop, int bprop, int updat, int factor, "
        "int out_features) -> ()", fast_store);
  m.def("fast_clear(int layer) -> ()", fast_clear);
}
