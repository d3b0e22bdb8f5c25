// OpKernels of the norms and LSTM ops: input checks, output (and workspace) allocation and a launch
// of the compiled kernels on TensorFlow's CUDA stream, through the families' C (src/ops/norms.h)
// on the kernel runtime, in the kernel library this library links against.  The CPU kernels
// check their inputs, then say that the ops run on GPUs (see runtime_glue.h).
#include <string>

#include "norms.h"
#include "norms_attrs.h"
#include "runtime_glue.h"

namespace blocksparse {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// "(64,)", "(8, 32)": shapes written as the frontends and the shape functions write them.
std::string Tuple(const TensorShape& shape) {
  std::string out = "(";
  for (int i = 0; i < shape.dims(); ++i) absl::StrAppend(&out, i ? ", " : "", shape.dim_size(i));
  return absl::StrCat(out, shape.dims() == 1 ? ",)" : ")");
}

// `t` must have shape `want`: `what` names it ("(C,)" or "the shape of x").
absl::Status CheckShape(const Tensor& t, const char* name, const TensorShape& want, const std::string& what) {
  if (t.shape() == want) return absl::OkStatus();
  const std::string expected = what.rfind("the shape", 0) == 0 ? absl::StrCat(what, " ", Tuple(want))
                                                               : absl::StrCat("shape ", what, " = ", Tuple(want));
  return tensorflow::errors::InvalidArgument(name, " must have ", expected, "; got shape ", Tuple(t.shape()));
}

absl::Status Allocate(OpKernelContext* ctx, int index, const TensorShape& shape, Tensor** out) {
  return ctx->allocate_output(index, shape, out);
}

// A device buffer of `bytes` (at least one word, so that its address is never null).
absl::Status Workspace(OpKernelContext* ctx, size_t bytes, Tensor* out) {
  return ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({static_cast<int64_t>((bytes + 3) / 4 + 1)}), out);
}

template <bool kGpu>
class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadLayerNormAttrs(ctx, &a_));
    backward_ = type_string() == "BlocksparseLayerNormGrad";
  }

  void Compute(OpKernelContext* ctx) override {
    const int first = backward_ ? 1 : 0;  // the grad takes dy first
    const Tensor& x = ctx->input(first);
    OP_REQUIRES(ctx, x.dims() == 2,
                tensorflow::errors::InvalidArgument("x must have shape ", a_.Shape(), "; got shape ",
                                                    x.shape().DebugString()));
    const int64_t c = x.dim_size(a_.FeatureDim()), n = x.dim_size(a_.TokenDim());
    OP_REQUIRES_OK(ctx, a_.CheckFeatures("x", c));
    const Tensor &g = ctx->input(first + 1), &b = ctx->input(first + 2);
    OP_REQUIRES_OK(ctx, CheckShape(g, "g", TensorShape({c}), "(C,)"));
    OP_REQUIRES_OK(ctx, CheckShape(b, "b", TensorShape({c}), "(C,)"));
    const TensorShape stats({a_.segments, n});
    if (backward_) {
      OP_REQUIRES_OK(ctx, CheckShape(ctx->input(0), "dy", x.shape(), "the shape of x"));
      OP_REQUIRES_OK(ctx, CheckShape(ctx->input(4), "mean", stats, "(segments, N)"));
      OP_REQUIRES_OK(ctx, CheckShape(ctx->input(5), "rstd", stats, "(segments, N)"));
    }
    OP_REQUIRES(ctx, kGpu, GpuOnly(type_string()));
    bsk_layer_norm_call call = {};
    call.dtype = DtypeOf(x.dtype()), call.axis = static_cast<int32_t>(a_.axis);
    call.relu = a_.relu, call.segments = static_cast<int32_t>(a_.segments);
    call.n_tokens = n, call.features = c, call.epsilon = a_.epsilon;
    call.x = Address(x), call.g = Address(g), call.b = Address(b);
    Tensor *out0 = nullptr, *out1 = nullptr, *out2 = nullptr;
    OP_REQUIRES_OK(ctx, Allocate(ctx, 0, x.shape(), &out0));
    OP_REQUIRES_OK(ctx, Allocate(ctx, 1, backward_ ? TensorShape({c}) : stats, &out1));
    OP_REQUIRES_OK(ctx, Allocate(ctx, 2, backward_ ? TensorShape({c}) : stats, &out2));
    char message[1024] = {0};
    Tensor workspace;
    if (backward_) {
      call.dy = Address(ctx->input(0)), call.mean = Address(ctx->input(4)), call.rstd = Address(ctx->input(5));
      call.dx = Address(*out0), call.dg = Address(*out1), call.db = Address(*out2);
      size_t bytes = 0;
      OP_REQUIRES_OK(ctx, FromRuntime(bsk_layer_norm_workspace(&call, Stream(ctx), &bytes, message,
                                                               sizeof(message)), message));
      OP_REQUIRES_OK(ctx, Workspace(ctx, bytes, &workspace));
      call.workspace = Address(workspace);
    } else {
      call.y = Address(*out0), call.mean = Address(*out1), call.rstd = Address(*out2);
    }
    OP_REQUIRES_OK(ctx, FromRuntime(bsk_layer_norm_run(&call, backward_, Stream(ctx), message, sizeof(message)),
                                    message));
  }

 private:
  LayerNormAttrs a_;
  bool backward_ = false;
};

template <bool kGpu>
class LstmGatesOp : public OpKernel {
 public:
  explicit LstmGatesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadLstmAttrs(ctx, &a_));
    backward_ = type_string() == "BlocksparseLstmGatesGrad";
  }

  void Compute(OpKernelContext* ctx) override {
    const int gates = static_cast<int>(a_.num_gates);
    const Tensor& c = ctx->input(0);
    OP_REQUIRES(ctx, c.dims() == 2,
                tensorflow::errors::InvalidArgument("c must have shape (N, K); got shape ", c.shape().DebugString()));
    const int64_t n = c.dim_size(0), k = c.dim_size(1);
    const TensorShape gate_shape({n, gates == 1 ? 4 * k : k});
    for (int g = 0; g < gates; ++g)
      OP_REQUIRES_OK(ctx, CheckShape(ctx->input(1 + g), "gates", gate_shape, gates == 1 ? "(N, 4K)" : "(N, K)"));
    const Tensor& bias = ctx->input(1 + gates);
    OP_REQUIRES_OK(ctx, CheckShape(bias, "bias", TensorShape({a_.has_bias ? 4 * k : 0}),
                                   a_.has_bias ? "(4K,)" : "(0,) (no bias)"));
    if (backward_) {
      OP_REQUIRES_OK(ctx, CheckShape(ctx->input(2 + gates), "dc_next", c.shape(), "the shape of c"));
      OP_REQUIRES_OK(ctx, CheckShape(ctx->input(3 + gates), "dh_next", c.shape(), "the shape of c"));
    }
    OP_REQUIRES(ctx, kGpu, GpuOnly(type_string()));
    bsk_lstm_gates_call call = {};
    call.dtype = DtypeOf(c.dtype()), call.merged = gates == 1;
    call.n_tokens = n, call.features = k, call.forget_bias = a_.forget_bias;
    call.c = Address(c), call.bias = a_.has_bias ? Address(bias) : 0;
    uint64_t* in[4] = {&call.i, &call.j, &call.f, &call.o};
    for (int g = 0; g < gates; ++g) *in[g] = Address(ctx->input(1 + g));
    char message[1024] = {0};
    Tensor workspace;
    if (!backward_) {
      Tensor *c_next = nullptr, *h_next = nullptr;
      OP_REQUIRES_OK(ctx, Allocate(ctx, 0, c.shape(), &c_next));
      OP_REQUIRES_OK(ctx, Allocate(ctx, 1, c.shape(), &h_next));
      call.c_next = Address(*c_next), call.h_next = Address(*h_next);
    } else {
      Tensor *dc = nullptr, *dbias = nullptr;
      OP_REQUIRES_OK(ctx, Allocate(ctx, 0, c.shape(), &dc));
      uint64_t* out[4] = {&call.di, &call.dj, &call.df, &call.d_o};
      for (int g = 0; g < gates; ++g) {
        Tensor* d = nullptr;
        OP_REQUIRES_OK(ctx, Allocate(ctx, 1 + g, gate_shape, &d));
        *out[g] = Address(*d);
      }
      OP_REQUIRES_OK(ctx, Allocate(ctx, 1 + gates, bias.shape(), &dbias));
      call.dc_next = Address(ctx->input(2 + gates)), call.dh_next = Address(ctx->input(3 + gates));
      call.dc = Address(*dc), call.dbias = a_.has_bias ? Address(*dbias) : 0;
      size_t bytes = 0;
      OP_REQUIRES_OK(ctx, FromRuntime(bsk_lstm_gates_workspace(&call, Stream(ctx), &bytes, message,
                                                               sizeof(message)), message));
      OP_REQUIRES_OK(ctx, Workspace(ctx, bytes, &workspace));
      call.workspace = Address(workspace);
    }
    OP_REQUIRES_OK(ctx, FromRuntime(bsk_lstm_gates_run(&call, backward_, Stream(ctx), message, sizeof(message)),
                                    message));
  }

 private:
  LstmAttrs a_;
  bool backward_ = false;
};

using tensorflow::DEVICE_CPU;
using tensorflow::DEVICE_GPU;

REGISTER_KERNEL_BUILDER(Name("BlocksparseLayerNorm").Device(DEVICE_GPU), LayerNormOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseLayerNormGrad").Device(DEVICE_GPU), LayerNormOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseLstmGates").Device(DEVICE_GPU), LstmGatesOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseLstmGatesGrad").Device(DEVICE_GPU), LstmGatesOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseLayerNorm").Device(DEVICE_CPU), LayerNormOp<false>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseLayerNormGrad").Device(DEVICE_CPU), LayerNormOp<false>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseLstmGates").Device(DEVICE_CPU), LstmGatesOp<false>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseLstmGatesGrad").Device(DEVICE_CPU), LstmGatesOp<false>);

}  // namespace
}  // namespace blocksparse
