// OpKernels of the three ops: input checks, output allocation and a launch of the compiled
// kernels on TensorFlow's CUDA stream, through the matmul family's C (src/ops/matmul.h) on the
// kernel runtime (src/runtime/bsk.h), both in the kernel library this library links against.
//
// The lookup tables arrive in host memory (the GPU kernels declare them HostMemory: no per-step
// copy to the device) and each kernel uploads a table once and keeps the copy (device_tables.h).
//
// The CPU kernels only check their inputs and then report that the op runs on GPUs:
// blocksparse's dispatcher (blocksparse/_tf/dispatch.py) takes the reference path on the CPU, so
// they serve the checks (tested on CPU-only machines) and a clear error for a misplaced op.
#include "device_tables.h"
#include "matmul.h"
#include "problem.h"
#include "runtime_glue.h"

#ifndef BLOCKSPARSE_TF_VERSION
#error "BLOCKSPARSE_TF_VERSION (the TensorFlow version built against) must be defined"
#endif

// Read from the file (not through the dynamic loader) by blocksparse/_tf/loader.py, which loads
// the library only into the TensorFlow it was built for.
extern "C" __attribute__((used, visibility("default"))) const char blocksparse_tf_build[] =
    "blocksparse-tf-version=" BLOCKSPARSE_TF_VERSION "\n";

namespace blocksparse {
namespace {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

absl::Status CheckActivations(const Tensor& t, const char* name, const char* features,
                              int64_t size, const Problem& p) {
  if (t.dims() != 2)
    return tensorflow::errors::InvalidArgument(name, " must have rank 2, shape ",
                                               p.ActivationShape(features), "; got shape ",
                                               t.shape().DebugString());
  if (t.dim_size(p.axis == 1 ? 1 : 0) != size)
    return tensorflow::errors::InvalidArgument(
        name, " must have shape ", p.ActivationShape(features), " with ", features, " = ", size,
        " for axis = ", p.axis, "; got shape ", t.shape().DebugString());
  return absl::OkStatus();
}

absl::Status CheckWeight(const Tensor& w, const Problem& p) {
  if (w.shape() != TensorShape({p.blocks, p.block_size, p.block_size}))
    return tensorflow::errors::InvalidArgument(
        "w must have shape (blocks, block_size, block_size) = (", p.blocks, ", ", p.block_size,
        ", ", p.block_size, "); got shape ", w.shape().DebugString());
  return absl::OkStatus();
}

absl::Status CheckTable(const Tensor& t, const char* name, int64_t width) {
  if (t.dims() != 2)
    return tensorflow::errors::InvalidArgument(name, " must have rank 2; got shape ",
                                               t.shape().DebugString());
  return CheckTableWidth(name, t.dim_size(0), t.dim_size(1), width);
}

// Shared by the three kernels: the attrs, and running a call on the op's device.
template <bool kGpu>
class BlocksparseOp : public OpKernel {
 public:
  explicit BlocksparseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadProblem(ctx, &p_));
  }

 protected:
  bsk_matmul_call Call(int product, DataType dtype, int64_t n_tokens, const Tensor& table,
                int64_t group) const {
    bsk_matmul_call call = {};
    call.product = product;
    call.dtype = DtypeOf(dtype);
    call.block_size = static_cast<int32_t>(p_.block_size);
    call.axis = static_cast<int32_t>(p_.axis);
    call.group = static_cast<int32_t>(group);
    call.n_tokens = n_tokens;
    call.c_blocks = p_.c_blocks;
    call.k_blocks = p_.k_blocks;
    call.blocks = p_.blocks;
    call.table_rows = table.dim_size(0);
    return call;
  }

  // The device address of `host`'s copy on this kernel's GPU (uploaded on first use); `keep`
  // holds the copy for the call.
  absl::Status DeviceTable(OpKernelContext* ctx, const Tensor& host, Tensor* keep, uint64_t* address) {
    TF_RETURN_IF_ERROR(tables_.Get(ctx, host, Stream(ctx), keep));
    *address = Address(*keep);
    return absl::OkStatus();
  }

  // Checks done: on the CPU, say where the op runs; on a GPU, launch on TensorFlow's stream.
  void Run(OpKernelContext* ctx, const bsk_matmul_call& call) {
    if (!kGpu) {
      ctx->SetStatus(GpuOnly(type_string()));
      return;
    }
    char message[1024] = {0};
    OP_REQUIRES_OK(ctx, FromRuntime(bsk_matmul_run(&call, Stream(ctx), message, sizeof(message)), message));
  }

  int64_t Tokens(const Tensor& t) const { return t.dim_size(p_.axis == 1 ? 0 : 1); }
  TensorShape ActivationShape(int64_t n, int64_t features) const {
    return p_.axis == 1 ? TensorShape({n, features}) : TensorShape({features, n});
  }

  Problem p_;
  DeviceTables tables_;
};

template <bool kGpu>
class MatmulOp : public BlocksparseOp<kGpu> {
 public:
  using BlocksparseOp<kGpu>::BlocksparseOp;

  void Compute(OpKernelContext* ctx) override {
    const Problem& p = this->p_;
    const Tensor &x = ctx->input(0), &w = ctx->input(1), &headers = ctx->input(2),
                 &entries = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckActivations(x, "x", "C", p.C(), p));
    OP_REQUIRES_OK(ctx, CheckWeight(w, p));
    OP_REQUIRES_OK(ctx, CheckTable(headers, "headers", 4));
    OP_REQUIRES_OK(ctx, CheckTable(entries, "entries", 0));
    OP_REQUIRES_OK(ctx, CheckTable(ctx->input(4), "dx_headers", 4));
    OP_REQUIRES_OK(ctx, CheckTable(ctx->input(5), "dx_entries", 0));
    OP_REQUIRES_OK(ctx, CheckTable(ctx->input(6), "dw_groups", -1));
    const int64_t n = this->Tokens(x);
    bsk_matmul_call call = this->Call(BSK_FPROP, x.dtype(), n, headers, entries.dim_size(1) - 1);
    Tensor* y = nullptr;
    if (kGpu) OP_REQUIRES_OK(ctx, ctx->allocate_output(0, this->ActivationShape(n, p.K()), &y));
    if (kGpu && n == 0) return;
    Tensor d_headers, d_entries;
    if (kGpu) {
      call.x = Address(x), call.w = Address(w), call.y = Address(*y);
      OP_REQUIRES_OK(ctx, this->DeviceTable(ctx, headers, &d_headers, &call.headers));
      OP_REQUIRES_OK(ctx, this->DeviceTable(ctx, entries, &d_entries, &call.entries));
    }
    this->Run(ctx, call);
  }
};

template <bool kGpu>
class MatmulDXOp : public BlocksparseOp<kGpu> {
 public:
  using BlocksparseOp<kGpu>::BlocksparseOp;

  void Compute(OpKernelContext* ctx) override {
    const Problem& p = this->p_;
    const Tensor &dy = ctx->input(0), &w = ctx->input(1), &headers = ctx->input(2),
                 &entries = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckActivations(dy, "dy", "K", p.K(), p));
    OP_REQUIRES_OK(ctx, CheckWeight(w, p));
    OP_REQUIRES_OK(ctx, CheckTable(headers, "headers", 4));
    OP_REQUIRES_OK(ctx, CheckTable(entries, "entries", 0));
    const int64_t n = this->Tokens(dy);
    bsk_matmul_call call = this->Call(BSK_BPROP, dy.dtype(), n, headers, entries.dim_size(1) - 1);
    Tensor* dx = nullptr;
    if (kGpu) OP_REQUIRES_OK(ctx, ctx->allocate_output(0, this->ActivationShape(n, p.C()), &dx));
    if (kGpu && n == 0) return;
    Tensor d_headers, d_entries;
    if (kGpu) {
      call.dy = Address(dy), call.w = Address(w), call.dx = Address(*dx);
      OP_REQUIRES_OK(ctx, this->DeviceTable(ctx, headers, &d_headers, &call.headers));
      OP_REQUIRES_OK(ctx, this->DeviceTable(ctx, entries, &d_entries, &call.entries));
    }
    this->Run(ctx, call);
  }
};

template <bool kGpu>
class MatmulDWOp : public BlocksparseOp<kGpu> {
 public:
  using BlocksparseOp<kGpu>::BlocksparseOp;

  void Compute(OpKernelContext* ctx) override {
    const Problem& p = this->p_;
    const Tensor &x = ctx->input(0), &dy = ctx->input(1), &groups = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckActivations(x, "x", "C", p.C(), p));
    OP_REQUIRES_OK(ctx, CheckActivations(dy, "dy", "K", p.K(), p));
    OP_REQUIRES(ctx, this->Tokens(x) == this->Tokens(dy),
                tensorflow::errors::InvalidArgument(
                    "x and dy must have the same number of tokens N; got ", this->Tokens(x),
                    " and ", this->Tokens(dy)));
    OP_REQUIRES_OK(ctx, CheckTable(groups, "groups", -1));
    bsk_matmul_call call = this->Call(BSK_UPDAT, x.dtype(), this->Tokens(x), groups,
                               (groups.dim_size(1) - 1) / 2);
    Tensor* dw = nullptr;
    Tensor d_groups;
    if (kGpu) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(
                              0, TensorShape({p.blocks, p.block_size, p.block_size}), &dw));
      call.x = Address(x), call.dy = Address(dy), call.dw = Address(*dw);
      OP_REQUIRES_OK(ctx, this->DeviceTable(ctx, groups, &d_groups, &call.groups));
    }
    this->Run(ctx, call);
  }
};

using tensorflow::DEVICE_CPU;
using tensorflow::DEVICE_GPU;

// Every table stays in host memory: the kernels upload their own once (DeviceTables), and the
// fprop op carries its gradient's tables without reading them.
REGISTER_KERNEL_BUILDER(Name("BlocksparseMatmul")
                            .Device(DEVICE_GPU)
                            .HostMemory("headers")
                            .HostMemory("entries")
                            .HostMemory("dx_headers")
                            .HostMemory("dx_entries")
                            .HostMemory("dw_groups"),
                        MatmulOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseMatmulDX")
                            .Device(DEVICE_GPU)
                            .HostMemory("headers")
                            .HostMemory("entries"),
                        MatmulDXOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseMatmulDW").Device(DEVICE_GPU).HostMemory("groups"),
                        MatmulDWOp<true>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseMatmul").Device(DEVICE_CPU), MatmulOp<false>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseMatmulDX").Device(DEVICE_CPU), MatmulDXOp<false>);
REGISTER_KERNEL_BUILDER(Name("BlocksparseMatmulDW").Device(DEVICE_CPU), MatmulDWOp<false>);

}  // namespace
}  // namespace blocksparse
