// What every op kernel shares with the kernel runtime: dtype numbers, device addresses, the
// runtime's status as TensorFlow's, and TensorFlow's CUDA stream.
#ifndef BLOCKSPARSE_TF_RUNTIME_GLUE_H_
#define BLOCKSPARSE_TF_RUNTIME_GLUE_H_

#include <cstdint>

#include "bsk.h"
#include "dtypes.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#if __has_include("xla/stream_executor/stream.h")
#include "xla/stream_executor/stream.h"
#else
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#endif

namespace blocksparse {

inline int DtypeOf(tensorflow::DataType t) {
  return t == tensorflow::DT_HALF ? BSK_FP16 : t == tensorflow::DT_BFLOAT16 ? BSK_BF16 : BSK_FP32;
}

inline uint64_t Address(const tensorflow::Tensor& t) { return reinterpret_cast<uint64_t>(t.data()); }

inline absl::Status FromRuntime(int status, const char* message) {
  switch (status) {
    case BSK_OK: return absl::OkStatus();
    case BSK_ERR_INVALID: return tensorflow::errors::InvalidArgument(message);
    case BSK_ERR_UNSUPPORTED: return tensorflow::errors::Unimplemented(message);
    case BSK_ERR_DRIVER: return tensorflow::errors::FailedPrecondition(message);
    default: return tensorflow::errors::Internal(message);
  }
}

inline void* Stream(tensorflow::OpKernelContext* ctx) {
  return ctx->op_device_context()->stream()->platform_specific_handle().stream;
}

// The CPU kernels check their inputs, then say where the op runs: blocksparse's dispatcher takes
// the reference path on the CPU, so they serve the checks and a clear error for a misplaced op.
inline absl::Status GpuOnly(const std::string& op) {
  return tensorflow::errors::Unimplemented(op, " runs on GPUs only; on the CPU blocksparse computes it with its "
                                           "reference path (TensorFlow ops)");
}

}  // namespace blocksparse

#endif  // BLOCKSPARSE_TF_RUNTIME_GLUE_H_
