// The three ops of the block-sparse matmul y = x @ W, their attrs and shape functions.
//
//   BlocksparseMatmul    y  = x @ W      (fprop; also takes the tables of its gradient)
//   BlocksparseMatmulDX  dx = dy @ W.T   (bprop)
//   BlocksparseMatmulDW  dW = x.T @ dy   per block, float32 (updat)
//
// Activations are (N, F) for axis = 1 and (F, N) for axis = 0 with F = C or K; W is packed
// (blocks, block_size, block_size).  The int32 tables are the layout core's
// (blocksparse/layout.py): xprop headers (S, 4) and entries (E, 1 + G), updat_groups (R, 1 + 2G).
#include "problem.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace blocksparse {
namespace {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

absl::Status Matrix(InferenceContext* c, int index, const char* name, const std::string& want,
                    ShapeHandle* out) {
  ShapeHandle s = c->input(index);
  if (c->RankKnown(s) && c->Rank(s) != 2)
    return tensorflow::errors::InvalidArgument(name, " must have rank 2, shape ", want,
                                               "; got shape ", c->DebugString(s));
  return c->WithRank(s, 2, out);
}

// Activations: checks the feature dimension, returns the token dimension N.
absl::Status Activations(InferenceContext* c, int index, const char* name, const char* features,
                         int64_t size, const Problem& p, DimensionHandle* n) {
  const std::string want = p.ActivationShape(features);
  ShapeHandle s;
  TF_RETURN_IF_ERROR(Matrix(c, index, name, want, &s));
  DimensionHandle f = c->Dim(s, p.axis == 1 ? 1 : 0);
  if (c->ValueKnown(f) && c->Value(f) != size)
    return tensorflow::errors::InvalidArgument(name, " must have shape ", want, " with ", features,
                                               " = ", size, " for axis = ", p.axis, "; got shape ",
                                               c->DebugString(s));
  *n = c->Dim(s, p.axis == 1 ? 0 : 1);
  return absl::OkStatus();
}

absl::Status Weight(InferenceContext* c, int index, const Problem& p) {
  ShapeHandle s = c->input(index);
  const int64_t want[3] = {p.blocks, p.block_size, p.block_size};
  bool ok = !c->RankKnown(s) || c->Rank(s) == 3;
  for (int i = 0; ok && c->RankKnown(s) && i < 3; ++i)
    ok = !c->ValueKnown(c->Dim(s, i)) || c->Value(c->Dim(s, i)) == want[i];
  if (!ok)
    return tensorflow::errors::InvalidArgument("w must have shape (blocks, block_size, block_size) = (",
                                               want[0], ", ", want[1], ", ", want[2], "); got shape ",
                                               c->DebugString(s));
  return absl::OkStatus();
}

absl::Status Table(InferenceContext* c, int index, const char* name, int64_t width) {
  ShapeHandle s;
  TF_RETURN_IF_ERROR(Matrix(c, index, name, "(rows, columns)", &s));
  DimensionHandle rows = c->Dim(s, 0), columns = c->Dim(s, 1);
  return CheckTableWidth(name, c->ValueKnown(rows) ? c->Value(rows) : -1,
                         c->ValueKnown(columns) ? c->Value(columns) : -1, width);
}

ShapeHandle Output(InferenceContext* c, const Problem& p, DimensionHandle n, int64_t features) {
  return p.axis == 1 ? c->Matrix(n, features) : c->Matrix(features, n);
}

absl::Status MatmulShape(InferenceContext* c) {
  Problem p;
  DimensionHandle n;
  TF_RETURN_IF_ERROR(ReadProblem(c, &p));
  TF_RETURN_IF_ERROR(Activations(c, 0, "x", "C", p.C(), p, &n));
  TF_RETURN_IF_ERROR(Weight(c, 1, p));
  TF_RETURN_IF_ERROR(Table(c, 2, "headers", 4));
  TF_RETURN_IF_ERROR(Table(c, 3, "entries", 0));
  TF_RETURN_IF_ERROR(Table(c, 4, "dx_headers", 4));
  TF_RETURN_IF_ERROR(Table(c, 5, "dx_entries", 0));
  TF_RETURN_IF_ERROR(Table(c, 6, "dw_groups", -1));
  c->set_output(0, Output(c, p, n, p.K()));
  return absl::OkStatus();
}

absl::Status MatmulDXShape(InferenceContext* c) {
  Problem p;
  DimensionHandle n;
  TF_RETURN_IF_ERROR(ReadProblem(c, &p));
  TF_RETURN_IF_ERROR(Activations(c, 0, "dy", "K", p.K(), p, &n));
  TF_RETURN_IF_ERROR(Weight(c, 1, p));
  TF_RETURN_IF_ERROR(Table(c, 2, "headers", 4));
  TF_RETURN_IF_ERROR(Table(c, 3, "entries", 0));
  c->set_output(0, Output(c, p, n, p.C()));
  return absl::OkStatus();
}

absl::Status MatmulDWShape(InferenceContext* c) {
  Problem p;
  DimensionHandle nx, ndy, n;
  TF_RETURN_IF_ERROR(ReadProblem(c, &p));
  TF_RETURN_IF_ERROR(Activations(c, 0, "x", "C", p.C(), p, &nx));
  TF_RETURN_IF_ERROR(Activations(c, 1, "dy", "K", p.K(), p, &ndy));
  if (!c->Merge(nx, ndy, &n).ok())
    return tensorflow::errors::InvalidArgument("x and dy must have the same number of tokens N; got ",
                                               c->Value(nx), " and ", c->Value(ndy));
  TF_RETURN_IF_ERROR(Table(c, 2, "groups", -1));
  c->set_output(0, c->MakeShape({p.blocks, p.block_size, p.block_size}));
  return absl::OkStatus();
}

}  // namespace

#define BLOCKSPARSE_ATTRS                 \
  Attr("T: {half, bfloat16, float}")      \
      .Attr("block_size: int")            \
      .Attr("axis: int")                  \
      .Attr("blocks: int")                \
      .Attr("c_blocks: int")              \
      .Attr("k_blocks: int")

REGISTER_OP("BlocksparseMatmul")
    .Input("x: T")
    .Input("w: T")
    .Input("headers: int32")
    .Input("entries: int32")
    .Input("dx_headers: int32")
    .Input("dx_entries: int32")
    .Input("dw_groups: int32")
    .Output("y: T")
    .BLOCKSPARSE_ATTRS
    .SetShapeFn(MatmulShape)
    .Doc("y = x @ W for a block-sparse W; the dx_/dw_ tables serve its registered gradient.");

REGISTER_OP("BlocksparseMatmulDX")
    .Input("dy: T")
    .Input("w: T")
    .Input("headers: int32")
    .Input("entries: int32")
    .Output("dx: T")
    .BLOCKSPARSE_ATTRS
    .SetShapeFn(MatmulDXShape)
    .Doc("dx = dy @ W.T for a block-sparse W.  For T = float, w holds every block transposed "
         "(W[b].T): the float32 kernels read it so (blocksparse/ops/matmul/configs.py).");

REGISTER_OP("BlocksparseMatmulDW")
    .Input("x: T")
    .Input("dy: T")
    .Input("groups: int32")
    .Output("dw: float")
    .BLOCKSPARSE_ATTRS
    .SetShapeFn(MatmulDWShape)
    .Doc("dW = x.T @ dy for every block of W, in float32.");

}  // namespace blocksparse
