// The attrs of the layer-norm and LSTM-gate ops, read and checked alike by shape functions and
// kernels (src/tf/norms_ops.cc, src/tf/norms_kernels.cc).
#ifndef BLOCKSPARSE_TF_NORMS_ATTRS_H_
#define BLOCKSPARSE_TF_NORMS_ATTRS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/platform/errors.h"

namespace blocksparse {

// Layer norm over the C features of (N, C) (axis 1) or (C, N) (axis 0) activations, in `segments`
// equal slices.
struct LayerNormAttrs {
  int64_t axis = 1;
  int64_t segments = 1;
  float epsilon = 0;
  bool relu = false;

  int FeatureDim() const { return axis == 1 ? 1 : 0; }
  int TokenDim() const { return axis == 1 ? 0 : 1; }
  std::string Shape() const { return axis == 1 ? "(N, C)" : "(C, N)"; }

  // `features` (-1: unknown) against the attrs.
  absl::Status CheckFeatures(const char* name, int64_t features) const {
    if (features >= 0 && (features == 0 || features % segments))
      return tensorflow::errors::InvalidArgument(name, " must have shape ", Shape(), " with C a positive "
                                                 "multiple of segments = ", segments, "; got C = ", features);
    return absl::OkStatus();
  }
};

template <typename Context>
absl::Status ReadLayerNormAttrs(Context* ctx, LayerNormAttrs* a) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("axis", &a->axis));
  TF_RETURN_IF_ERROR(ctx->GetAttr("segments", &a->segments));
  TF_RETURN_IF_ERROR(ctx->GetAttr("epsilon", &a->epsilon));
  TF_RETURN_IF_ERROR(ctx->GetAttr("relu", &a->relu));
  if (a->axis != 0 && a->axis != 1)
    return tensorflow::errors::InvalidArgument("axis must be 1 (x is (N, C)) or 0 (x is (C, N)); got ", a->axis);
  if (a->segments < 1)
    return tensorflow::errors::InvalidArgument("segments must be >= 1; got ", a->segments);
  if (!(a->epsilon > 0))
    return tensorflow::errors::InvalidArgument("epsilon must be > 0; got ", a->epsilon);
  return absl::OkStatus();
}

// The fused LSTM gates: one merged (N, 4K) gate tensor or four (N, K) ones.
struct LstmAttrs {
  int64_t num_gates = 1;
  float forget_bias = 0;
  bool has_bias = false;
};

template <typename Context>
absl::Status ReadLstmAttrs(Context* ctx, LstmAttrs* a) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_gates", &a->num_gates));
  TF_RETURN_IF_ERROR(ctx->GetAttr("forget_bias", &a->forget_bias));
  TF_RETURN_IF_ERROR(ctx->GetAttr("has_bias", &a->has_bias));
  if (a->num_gates != 1 && a->num_gates != 4)
    return tensorflow::errors::InvalidArgument(
        "num_gates must be 1 (merged gates (N, 4K)) or 4 (i, j, f, o, each (N, K)); got ", a->num_gates);
  return absl::OkStatus();
}

}  // namespace blocksparse

#endif  // BLOCKSPARSE_TF_NORMS_ATTRS_H_
