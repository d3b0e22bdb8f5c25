// The ops of the norms and LSTM families, their attrs and shape functions.
//
//   BlocksparseLayerNorm          y, mean, rstd = layer_norm(x, g, b)
//   BlocksparseLayerNormGrad      dx, dg, db from dy, x, g, b and the forward's mean, rstd
//   BlocksparseLstmGates          c_next, h_next = lstm_gates(c, gates, bias)
//   BlocksparseLstmGatesGrad      dc, dgates, dbias from c, gates, bias, dc_next, dh_next
//
// x, dy, dx: (N, C) for axis = 1, (C, N) for axis = 0; g, b, dg, db: float32 (C,); mean, rstd:
// float32 (segments, N).  c, c_next, h_next: (N, K); gates: one (N, 4K) tensor (i, j, f, o one
// after the other) or four (N, K); bias, dbias: float32 (4K,), or (0,) without a bias.
#include "norms_attrs.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace blocksparse {
namespace {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

int64_t Known(InferenceContext* c, DimensionHandle d) { return c->ValueKnown(d) ? c->Value(d) : -1; }

absl::Status Rank(InferenceContext* c, int index, int rank, const char* name, const std::string& want,
                  ShapeHandle* out) {
  ShapeHandle s = c->input(index);
  if (c->RankKnown(s) && c->Rank(s) != rank)
    return tensorflow::errors::InvalidArgument(name, " must have shape ", want, "; got shape ", c->DebugString(s));
  return c->WithRank(s, rank, out);
}

// A vector of `size` elements (-1: unknown).
absl::Status Vector(InferenceContext* c, int index, const char* name, int64_t size, const char* what) {
  ShapeHandle s;
  TF_RETURN_IF_ERROR(Rank(c, index, 1, name, absl::StrCat("(", what, ",)"), &s));
  int64_t got = Known(c, c->Dim(s, 0));
  if (size >= 0 && got >= 0 && got != size)
    return tensorflow::errors::InvalidArgument(name, " must have shape (", what, ",) = (", size, ",); got shape ",
                                               c->DebugString(s));
  return absl::OkStatus();
}

// Activations of layer norm: checks them against the attrs; *n and *features their sizes.
absl::Status NormActivations(InferenceContext* c, int index, const char* name, const LayerNormAttrs& a,
                             ShapeHandle* s) {
  TF_RETURN_IF_ERROR(Rank(c, index, 2, name, a.Shape(), s));
  return a.CheckFeatures(name, Known(c, c->Dim(*s, a.FeatureDim())));
}

absl::Status LayerNormShape(InferenceContext* c) {
  LayerNormAttrs a;
  ShapeHandle x;
  TF_RETURN_IF_ERROR(ReadLayerNormAttrs(c, &a));
  TF_RETURN_IF_ERROR(NormActivations(c, 0, "x", a, &x));
  int64_t features = Known(c, c->Dim(x, a.FeatureDim()));
  TF_RETURN_IF_ERROR(Vector(c, 1, "g", features, "C"));
  TF_RETURN_IF_ERROR(Vector(c, 2, "b", features, "C"));
  ShapeHandle stats = c->Matrix(a.segments, c->Dim(x, a.TokenDim()));
  c->set_output(0, x);
  c->set_output(1, stats);
  c->set_output(2, stats);
  return absl::OkStatus();
}

absl::Status LayerNormGradShape(InferenceContext* c) {
  LayerNormAttrs a;
  ShapeHandle dy, x, merged;
  TF_RETURN_IF_ERROR(ReadLayerNormAttrs(c, &a));
  TF_RETURN_IF_ERROR(NormActivations(c, 0, "dy", a, &dy));
  TF_RETURN_IF_ERROR(NormActivations(c, 1, "x", a, &x));
  if (!c->Merge(dy, x, &merged).ok())
    return tensorflow::errors::InvalidArgument("dy must have the shape of x ", c->DebugString(x), "; got shape ",
                                               c->DebugString(dy));
  int64_t features = Known(c, c->Dim(merged, a.FeatureDim()));
  TF_RETURN_IF_ERROR(Vector(c, 2, "g", features, "C"));
  TF_RETURN_IF_ERROR(Vector(c, 3, "b", features, "C"));
  for (int i : {4, 5}) {
    ShapeHandle stats;
    const char* name = i == 4 ? "mean" : "rstd";
    TF_RETURN_IF_ERROR(Rank(c, i, 2, name, "(segments, N)", &stats));
    int64_t rows = Known(c, c->Dim(stats, 0)), n = Known(c, c->Dim(stats, 1));
    int64_t tokens = Known(c, c->Dim(merged, a.TokenDim()));
    if ((rows >= 0 && rows != a.segments) || (n >= 0 && tokens >= 0 && n != tokens))
      return tensorflow::errors::InvalidArgument(name, " must have shape (segments, N) = (", a.segments, ", ",
                                                 tokens, "); got shape ", c->DebugString(stats));
  }
  c->set_output(0, merged);
  c->set_output(1, c->Vector(features >= 0 ? c->MakeDim(features) : c->UnknownDim()));
  c->set_output(2, c->output(1));
  return absl::OkStatus();
}

// c and the gates: returns the (N, K) cell shape.
absl::Status Cell(InferenceContext* c, const LstmAttrs& a, int first, ShapeHandle* cell) {
  TF_RETURN_IF_ERROR(Rank(c, first, 2, "c", "(N, K)", cell));
  for (int g = 0; g < a.num_gates; ++g) {
    ShapeHandle gate;
    const char* want = a.num_gates == 1 ? "(N, 4K)" : "(N, K)";
    TF_RETURN_IF_ERROR(Rank(c, first + 1 + g, 2, "gates", want, &gate));
    DimensionHandle k = c->Dim(*cell, 1);
    if (a.num_gates == 1) TF_RETURN_IF_ERROR(c->Multiply(k, 4, &k));
    ShapeHandle expected = c->Matrix(c->Dim(*cell, 0), k), merged;
    if (!c->Merge(gate, expected, &merged).ok())
      return tensorflow::errors::InvalidArgument("gates must have shape ", want, " for c of shape ",
                                                 c->DebugString(*cell), "; got shape ", c->DebugString(gate));
  }
  int64_t k = Known(c, c->Dim(*cell, 1));
  ShapeHandle bias;
  TF_RETURN_IF_ERROR(Rank(c, first + 1 + a.num_gates, 1, "bias", a.has_bias ? "(4K,)" : "(0,)", &bias));
  int64_t want = a.has_bias ? (k >= 0 ? 4 * k : -1) : 0, got = Known(c, c->Dim(bias, 0));
  if (want >= 0 && got >= 0 && got != want)
    return tensorflow::errors::InvalidArgument("bias must have shape ", a.has_bias ? "(4K,) = (" : "(0,) (no bias",
                                               a.has_bias ? absl::StrCat(want, ",)") : ")", "; got shape ",
                                               c->DebugString(bias));
  return absl::OkStatus();
}

absl::Status LstmGatesShape(InferenceContext* c) {
  LstmAttrs a;
  ShapeHandle cell;
  TF_RETURN_IF_ERROR(ReadLstmAttrs(c, &a));
  TF_RETURN_IF_ERROR(Cell(c, a, 0, &cell));
  c->set_output(0, cell);
  c->set_output(1, cell);
  return absl::OkStatus();
}

absl::Status LstmGatesGradShape(InferenceContext* c) {
  LstmAttrs a;
  ShapeHandle cell;
  TF_RETURN_IF_ERROR(ReadLstmAttrs(c, &a));
  TF_RETURN_IF_ERROR(Cell(c, a, 0, &cell));
  for (int i = 0; i < 2; ++i) {
    ShapeHandle d, merged;
    const char* name = i ? "dh_next" : "dc_next";
    TF_RETURN_IF_ERROR(Rank(c, 2 + a.num_gates + i, 2, name, "(N, K)", &d));
    if (!c->Merge(d, cell, &merged).ok())
      return tensorflow::errors::InvalidArgument(name, " must have the shape of c ", c->DebugString(cell),
                                                 "; got shape ", c->DebugString(d));
  }
  c->set_output(0, cell);
  for (int g = 0; g < a.num_gates; ++g) c->set_output(1 + g, c->input(1 + g));
  c->set_output(1 + a.num_gates, c->input(1 + a.num_gates));
  return absl::OkStatus();
}

}  // namespace

#define BLOCKSPARSE_LAYER_NORM_ATTRS         \
  Attr("T: {half, bfloat16, float}")         \
      .Attr("axis: int")                     \
      .Attr("segments: int")                 \
      .Attr("epsilon: float")                \
      .Attr("relu: bool")

#define BLOCKSPARSE_LSTM_ATTRS               \
  Attr("T: {half, bfloat16, float}")         \
      .Attr("num_gates: int")                \
      .Attr("forget_bias: float")            \
      .Attr("has_bias: bool")

REGISTER_OP("BlocksparseLayerNorm")
    .Input("x: T")
    .Input("g: float")
    .Input("b: float")
    .Output("y: T")
    .Output("mean: float")
    .Output("rstd: float")
    .BLOCKSPARSE_LAYER_NORM_ATTRS
    .SetShapeFn(LayerNormShape)
    .Doc("y = relu?((x - mean) * rstd * g + b) over each of `segments` slices of the C features.");

REGISTER_OP("BlocksparseLayerNormGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("g: float")
    .Input("b: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("dx: T")
    .Output("dg: float")
    .Output("db: float")
    .BLOCKSPARSE_LAYER_NORM_ATTRS
    .SetShapeFn(LayerNormGradShape)
    .Doc("The gradients of BlocksparseLayerNorm from its mean and rstd.");

REGISTER_OP("BlocksparseLstmGates")
    .Input("c: T")
    .Input("gates: num_gates * T")
    .Input("bias: float")
    .Output("c_next: T")
    .Output("h_next: T")
    .BLOCKSPARSE_LSTM_ATTRS
    .SetShapeFn(LstmGatesShape)
    .Doc("c_next = sigmoid(f + forget_bias) * c + sigmoid(i) * tanh(j); h_next = sigmoid(o) * tanh(c_next).");

REGISTER_OP("BlocksparseLstmGatesGrad")
    .Input("c: T")
    .Input("gates: num_gates * T")
    .Input("bias: float")
    .Input("dc_next: T")
    .Input("dh_next: T")
    .Output("dc: T")
    .Output("dgates: num_gates * T")
    .Output("dbias: float")
    .BLOCKSPARSE_LSTM_ATTRS
    .SetShapeFn(LstmGatesGradShape)
    .Doc("The gradients of BlocksparseLstmGates (dbias: (0,) without a bias).");

}  // namespace blocksparse
