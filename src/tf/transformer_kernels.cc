// OpKernels of the transformer ops: input checks (transformer_problem.h, as the shape functions),
// output allocation and a launch of the compiled kernels on TensorFlow's CUDA stream through the
// family's C (src/ops/transformer.h).  The lookup tables, `scale` and `autoregress_at_key` arrive in
// host memory; each kernel uploads a table once and keeps the copy (device_tables.h).  The CPU
// kernels check their inputs, then say that the ops run on GPUs (see runtime_glue.h).
#include <string>
#include <utility>
#include <vector>

#include "device_tables.h"
#include "runtime_glue.h"
#include "transformer.h"
#include "transformer_problem.h"

namespace blocksparse {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

BstOp OpOf(const std::string& type) {
  if (type == "BlocksparseTransformerNT") return BstOp::kNT;
  if (type == "BlocksparseTransformerXN") return BstOp::kXN;
  return type == "BlocksparseTransformerSoftmax" ? BstOp::kSoftmax : BstOp::kSoftmaxGrad;
}

Dims DimsOf(const TensorShape& shape) {
  Dims d;
  for (int i = 0; i < shape.dims(); ++i) d.sizes.push_back(shape.dim_size(i));
  return d;
}

template <bool kGpu>
class TransformerOp : public OpKernel {
 public:
  explicit TransformerOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadTransformerAttrs(ctx, OpOf(type_string()), &a_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t batch = -1, features = -1;
    OP_REQUIRES_OK(ctx, CheckInputs(a_, [ctx](int i) { return DimsOf(ctx->input(i).shape()); }, &batch, &features));
    const bool softmax = a_.op == BstOp::kSoftmax, grad = a_.op == BstOp::kSoftmaxGrad;
    const int32_t ar_key = softmax ? ctx->input(2).scalar<int32_t>()() : 0;
    OP_REQUIRES(ctx, !softmax || !a_.autoregress || ar_key >= 0,
                tensorflow::errors::InvalidArgument("autoregress_at_key must be >= 0; got ", ar_key));
    OP_REQUIRES(ctx, kGpu, GpuOnly(type_string()));
    const Tensor& first = ctx->input(0);
    const TensorShape shape = a_.op == BstOp::kXN
                                  ? TensorShape({batch, a_.OutBlocks() * a_.block_size, features})
                                  : first.shape();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    if (batch == 0) return;
    bsk_transformer_call call = {};
    call.product = a_.op == BstOp::kNT   ? BSK_BST_NT
                   : a_.op == BstOp::kXN ? (a_.trans ? BSK_BST_TN : BSK_BST_NN)
                   : softmax             ? BSK_BST_SOFTMAX
                                         : BSK_BST_SOFTMAX_GRAD;
    call.dtype = DtypeOf(first.dtype()), call.block_size = static_cast<int32_t>(a_.block_size);
    call.masked = a_.masked, call.autoregress = a_.autoregress, call.ar_key = ar_key;
    call.batch = batch, call.heads = a_.heads, call.lut_heads = a_.lut_heads, call.blocks = a_.blocks;
    call.q_blocks = a_.q_blocks, call.k_blocks = a_.k_blocks, call.features = features < 0 ? 0 : features;
    if (softmax || grad) call.scale = ctx->input(softmax ? 1 : 2).scalar<float>()();
    call.a = Address(first), call.b = softmax ? 0 : Address(ctx->input(1)), call.out = Address(*out);
    // the tables the product reads: (input, field)
    std::vector<std::pair<int, uint64_t*>> tables;
    switch (a_.op) {
      case BstOp::kNT: tables = {{2, &call.coords}}; break;
      case BstOp::kXN:
        tables = {{2, &call.coords}, {3, a_.trans ? &call.col_offsets : &call.row_offsets}, {4, &call.col_blocks}};
        break;
      case BstOp::kSoftmax:
        tables = {{3, &call.row_offsets}};
        if (a_.masked || a_.autoregress) tables.push_back({4, &call.coords});
        if (a_.masked) tables.insert(tables.end(), {{5, &call.mask_index}, {6, &call.mask_bits}});
        break;
      case BstOp::kSoftmaxGrad: tables = {{3, &call.row_offsets}}; break;
    }
    void* stream = Stream(ctx);
    std::vector<Tensor> keep(tables.size());  // the device copies, held for the call
    for (size_t i = 0; i < tables.size(); ++i) {
      OP_REQUIRES_OK(ctx, tables_.Get(ctx, ctx->input(tables[i].first), stream, &keep[i]));
      *tables[i].second = Address(keep[i]);
    }
    char message[1024] = {0};
    OP_REQUIRES_OK(ctx, FromRuntime(bsk_transformer_run(&call, stream, message, sizeof(message)), message));
  }

 private:
  TransformerAttrs a_;
  DeviceTables tables_;
};

using tensorflow::DEVICE_CPU;
using tensorflow::DEVICE_GPU;

// Every table, the scale and autoregress_at_key stay in host memory: the kernels read the scalars
// and upload their tables once (DeviceTables).
REGISTER_KERNEL_BUILDER(Name("BlocksparseTransformerNT").Device(DEVICE_GPU).HostMemory("coords"),
                        TransformerOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseTransformerXN")
                            .Device(DEVICE_GPU)
                            .HostMemory("coords")
                            .HostMemory("offsets")
                            .HostMemory("block_ids"),
                        TransformerOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseTransformerSoftmax")
                            .Device(DEVICE_GPU)
                            .HostMemory("scale")
                            .HostMemory("autoregress_at_key")
                            .HostMemory("row_offsets")
                            .HostMemory("coords")
                            .HostMemory("mask_index")
                            .HostMemory("mask_bits"),
                        TransformerOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseTransformerSoftmaxGrad")
                            .Device(DEVICE_GPU)
                            .HostMemory("scale")
                            .HostMemory("row_offsets"),
                        TransformerOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseTransformerNT").Device(DEVICE_CPU), TransformerOp<false>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseTransformerXN").Device(DEVICE_CPU), TransformerOp<false>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseTransformerSoftmax").Device(DEVICE_CPU), TransformerOp<false>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseTransformerSoftmaxGrad").Device(DEVICE_CPU), TransformerOp<false>);

}  // namespace
}  // namespace blocksparse
