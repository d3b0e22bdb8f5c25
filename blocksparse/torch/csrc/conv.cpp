// blocksparse's eager implicit-GEMM convolution (blocksparse/torch/_conv/implicit.py) as one C++
// autograd node: the output and the input gradient each one prepared launch of the kernel library
// (records of linear.cpp, launched through records.h), the filter gradient the dense masked
// convolution's (cuDNN's convolution_backward, gathered back to the blocks) -- no Python in the
// backward, which autograd runs on its CUDA worker thread.
//
// Python registers a *conv record* per op and call shape (add_conv): the two launch records (the
// forward, reading the input channels-last; the transposed launch, reading the output gradient
// channels-last, or -1 where the input gradient is the dense convolution's, strided layers), the input's shape and dtype, and the geometry of the filter gradient (strides,
// symmetric pads, dilations, the zeros after the input and the output gradient's pad / crop that
// make the dense convolution's frame, the dense filter's shape).  A call passes the flat filter and
// the op's three index tables (the packed filters' gathers and the dense filter's positions).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include "records.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

struct ConvRecord {
  int64_t fprop = -1, bprop = -1;            // launch records: the output, the input gradient
  std::vector<int64_t> x_shape;              // (N, C) + DHW
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> strides, pads, dilations;
  std::vector<int64_t> x_pad, dy_pad;        // constant_pad_nd widths (last axis first); empty: none
  std::vector<int64_t> w_shape;              // the dense filter, (K, C) + TRS
};

blocksparse_native::Registry<ConvRecord> convs("conv record");

// The launch of record `id` reading `a` ((N, channels) + spatial) channels-last, with the packed
// filter `w`: its (N, written) + spatial output with channels-last strides, as cuDNN returns them.
at::Tensor launch_last(int64_t id, const at::Tensor &a, const at::Tensor &w) {
  return blocksparse_native::launch(id, blocksparse_native::aligned(a.movedim(1, -1)), w).movedim(-1, 1);
}

// `t` as a tensor of its own on the same memory (no copy): an autograd function's output that is a
// view refuses in-place ops (relu_, +=), which PyTorch's own convolutions take.
at::Tensor owned(const at::Tensor &t) {
  if (!t.is_view()) return t;
  return at::empty({0}, t.options()).set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
}

// The dense gradients (dense_grads of _conv/dense.py): one convolution_backward on the padded input
// and output gradient for the filter's gradient and, where `need_x` (strided layers, c.bprop < 0),
// the input's; the dense filter built for the latter, else only allocated (the filter's gradient
// reads no filter values).  The filter gradient gathered back to the flat filter, the input
// gradient cropped to the input.
std::pair<at::Tensor, at::Tensor> dense_grads(const ConvRecord &c, const at::Tensor &dy, const at::Tensor &x,
                                              const at::Tensor &flat, const at::Tensor &dense_index, bool need_x,
                                              bool need_flat) {
  const at::Tensor xp = c.x_pad.empty() ? x : at::constant_pad_nd(x, c.x_pad, 0);
  const at::Tensor dyp = c.dy_pad.empty() ? dy : at::constant_pad_nd(dy, c.dy_pad, 0);
  const at::Tensor w = need_x ? at::zeros({c10::multiply_integers(c.w_shape)}, flat.options())
                                    .scatter_(0, dense_index, flat)
                                    .view(c.w_shape)
                              : at::empty(c.w_shape, flat.options());
  const std::vector<int64_t> output_padding(c.strides.size(), 0);
  auto grads = at::convolution_backward(dyp, xp, w, std::nullopt, c.strides, c.pads, c.dilations, false,
                                        output_padding, 1, {need_x, need_flat, false});
  at::Tensor dx, dflat;
  if (need_x) {
    dx = std::get<0>(grads);
    if (!c.x_pad.empty()) {
      std::vector<int64_t> crop(c.x_pad.size());
      std::transform(c.x_pad.begin(), c.x_pad.end(), crop.begin(), [](int64_t v) { return -v; });
      dx = at::constant_pad_nd(dx, crop, 0);
    }
  }
  if (need_flat) dflat = std::get<1>(grads).reshape(-1).index_select(0, dense_index);
  return {dx, dflat};
}

template <typename Pointer, typename T, typename... Args>
Pointer make_node(Args &&...args) {  // autograd's nodes are shared_ptr (older torch) or intrusive_ptr
  if constexpr (std::is_same_v<Pointer, std::shared_ptr<torch::autograd::Node>>)
    return std::make_shared<T>(std::forward<Args>(args)...);
  else
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
}

// The backward's results as Python's @once_differentiable leaves them: computed without a graph and,
// where autograd records one (create_graph), given a node that fails only when a second backward
// reaches it -- the launches have no derivative, so a partial one would be silently wrong.
torch::autograd::variable_list once_differentiable(torch::autograd::variable_list grads) {
  if (!at::GradMode::is_enabled()) return grads;
  using Pointer = decltype(std::declval<torch::autograd::Edge>().function);
  auto error = make_node<Pointer, torch::autograd::Error>(
      "blocksparse: trying to differentiate the implicit convolution's backward (it is once differentiable)");
  for (auto &g : grads)
    if (g.defined()) {
      g = g.detach();
      torch::autograd::create_gradient_edge(g, error);
    }
  return grads;
}

struct ImplicitConvFunction : public torch::autograd::Function<ImplicitConvFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x, const at::Tensor &flat,
                            const at::Tensor &weight_index, const at::Tensor &grad_index,
                            const at::Tensor &dense_index, int64_t conv) {
    const ConvRecord &c = convs.get(conv);
    TORCH_CHECK(x.sizes() == at::IntArrayRef(c.x_shape) && x.scalar_type() == c.dtype &&
                    flat.scalar_type() == c.dtype,
                "blocksparse: conv record ", conv, " was made for inputs of shape ", at::IntArrayRef(c.x_shape),
                " and dtype ", c.dtype, "; got ", x.sizes(), " ", x.scalar_type(), " and a ", flat.scalar_type(),
                " filter");
    ctx->save_for_backward({x, flat, grad_index, dense_index});
    ctx->saved_data["conv"] = conv;
    return owned(launch_last(c.fprop, x, flat.index_select(0, weight_index)));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &flat = saved[1], &grad_index = saved[2], &dense_index = saved[3];
    const ConvRecord &c = convs.get(ctx->saved_data["conv"].toInt());
    const at::Tensor &dy = grads[0];
    at::Tensor dx, dflat;
    {
      const at::NoGradGuard no_grad;
      const bool need_x = ctx->needs_input_grad(0), need_flat = ctx->needs_input_grad(1);
      const bool dense_x = need_x && c.bprop < 0;  // strided layers: the dense input gradient
      if (need_x && !dense_x) dx = launch_last(c.bprop, dy, flat.index_select(0, grad_index));
      if (dense_x || need_flat) {
        auto dense = dense_grads(c, dy, x, flat, dense_index, dense_x, need_flat);
        if (dense_x) dx = dense.first;
        dflat = dense.second;
      }
    }
    return once_differentiable({dx, dflat, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()});
  }
};

at::Tensor conv_implicit(const at::Tensor &x, const at::Tensor &flat, const at::Tensor &weight_index,
                         const at::Tensor &grad_index, const at::Tensor &dense_index, int64_t conv) {
  return ImplicitConvFunction::apply(x, flat, weight_index, grad_index, dense_index, conv);
}

int64_t add_conv(int64_t fprop, int64_t bprop, at::IntArrayRef x_shape, at::ScalarType dtype, at::IntArrayRef strides,
                 at::IntArrayRef pads, at::IntArrayRef dilations, at::IntArrayRef x_pad, at::IntArrayRef dy_pad,
                 at::IntArrayRef w_shape) {
  const size_t ndim = x_shape.size() - 2;
  TORCH_CHECK(x_shape.size() >= 3 && x_shape.size() <= 5, "x_shape must be (N, C) + 1 to 3 spatial sizes; got ",
              x_shape);
  TORCH_CHECK(strides.size() == ndim && pads.size() == ndim && dilations.size() == ndim &&
                  w_shape.size() == ndim + 2,
              "strides, pads, dilations must have ", ndim, " entries and w_shape ", ndim + 2);
  TORCH_CHECK(x_pad.size() % 2 == 0 && x_pad.size() <= 2 * ndim && dy_pad.size() % 2 == 0 &&
                  dy_pad.size() <= 2 * ndim,
              "x_pad and dy_pad must hold (before, after) pairs of at most ", ndim, " axes");
  TORCH_CHECK(fprop >= 0 && bprop >= -1, "fprop must be a launch record id and bprop one or -1 (the dense "
              "input gradient)");
  ConvRecord c;
  c.fprop = fprop;
  c.bprop = bprop;
  c.x_shape.assign(x_shape.begin(), x_shape.end());
  c.dtype = dtype;
  c.strides.assign(strides.begin(), strides.end());
  c.pads.assign(pads.begin(), pads.end());
  c.dilations.assign(dilations.begin(), dilations.end());
  c.x_pad.assign(x_pad.begin(), x_pad.end());
  c.dy_pad.assign(dy_pad.begin(), dy_pad.end());
  c.w_shape.assign(w_shape.begin(), w_shape.end());
  return convs.add(std::move(c));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(blocksparse_native, m) {
  m.def("conv_implicit(Tensor x, Tensor flat, Tensor weight_index, Tensor grad_index, Tensor dense_index, "
        "int conv) -> Tensor");
  m.impl("conv_implicit", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(conv_implicit));
  m.def("add_conv(int fprop, int bprop, int[] x_shape, ScalarType dtype, int[] strides, int[] pads, "
        "int[] dilations, int[] x_pad, int[] dy_pad, int[] w_shape) -> int",
        add_conv);
}
