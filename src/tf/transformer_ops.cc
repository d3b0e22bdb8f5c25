// The ops of the transformer family (block-sparse attention), their attrs and shape functions.
//
//   BlocksparseTransformerNT           c  = a @ b.T on the layout's blocks   (N, heads, blocks, bs, bs)
//   BlocksparseTransformerXN           y  = w @ x by query rows (nn), or w.T @ x by key columns (trans: tn)
//   BlocksparseTransformerSoftmax      y  = the masked softmax of scale * x along query rows
//   BlocksparseTransformerSoftmaxGrad  dx = (dy - rowsum(dy * y)) * y * scale
//
// Activations are (N, ctx, heads * head_dim) with ctx_q = q_blocks * bs and ctx_k = k_blocks * bs;
// scores are packed (N, heads, blocks, bs, bs).  The int32 tables are those of
// blocksparse/ops/transformer/lut.py: coords (lut_heads, blocks, 2), row_offsets (lut_heads,
// q_blocks + 1), col_offsets (lut_heads, k_blocks + 1), col_blocks and mask_index (lut_heads, blocks),
// mask_bits (masks, bs, ceil(bs / 32)).  XN takes row_offsets (nn) or col_offsets (tn) as `offsets`
// and col_blocks as `block_ids`; the softmax reads the masks only when `masked`.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "transformer_problem.h"

namespace blocksparse {
namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

Dims DimsOf(InferenceContext* c, ShapeHandle s) {
  Dims d;
  d.known = c->RankKnown(s);
  for (int i = 0; d.known && i < c->Rank(s); ++i)
    d.sizes.push_back(c->ValueKnown(c->Dim(s, i)) ? c->Value(c->Dim(s, i)) : -1);
  return d;
}

absl::Status TransformerShape(InferenceContext* c, BstOp op) {
  TransformerAttrs a;
  int64_t batch = -1, features = -1;
  TF_RETURN_IF_ERROR(ReadTransformerAttrs(c, op, &a));
  TF_RETURN_IF_ERROR(CheckInputs(a, [c](int i) { return DimsOf(c, c->input(i)); }, &batch, &features));
  auto dim = [c](int64_t size) { return size >= 0 ? c->MakeDim(size) : c->UnknownDim(); };
  if (op == BstOp::kXN)
    c->set_output(0, c->MakeShape({dim(batch), c->MakeDim(a.OutBlocks() * a.block_size), dim(features)}));
  else
    c->set_output(0, c->MakeShape({dim(batch), c->MakeDim(a.heads), c->MakeDim(a.blocks), c->MakeDim(a.block_size),
                                   c->MakeDim(a.block_size)}));
  return absl::OkStatus();
}

}  // namespace

#define BLOCKSPARSE_TRANSFORMER_ATTRS    \
  Attr("T: {half, bfloat16, float}")     \
      .Attr("block_size: int")           \
      .Attr("heads: int")                \
      .Attr("lut_heads: int")            \
      .Attr("blocks: int")               \
      .Attr("q_blocks: int")             \
      .Attr("k_blocks: int")

REGISTER_OP("BlocksparseTransformerNT")
    .Input("a: T")
    .Input("b: T")
    .Input("coords: int32")
    .Output("c: T")
    .BLOCKSPARSE_TRANSFORMER_ATTRS
    .SetShapeFn([](InferenceContext* c) { return TransformerShape(c, BstOp::kNT); })
    .Doc("Packed scores a_h @ b_h.T on the layout's blocks, per head.");

REGISTER_OP("BlocksparseTransformerXN")
    .Input("w: T")
    .Input("x: T")
    .Input("coords: int32")
    .Input("offsets: int32")
    .Input("block_ids: int32")
    .Output("y: T")
    .BLOCKSPARSE_TRANSFORMER_ATTRS
    .Attr("trans: bool")
    .SetShapeFn([](InferenceContext* c) { return TransformerShape(c, BstOp::kXN); })
    .Doc("nn: packed w times x (N, ctx_k, F) -> (N, ctx_q, F); trans (tn): w transposed times x (N, ctx_q, F) "
         "-> (N, ctx_k, F).");

REGISTER_OP("BlocksparseTransformerSoftmax")
    .Input("x: T")
    .Input("scale: float")
    .Input("autoregress_at_key: int32")
    .Input("row_offsets: int32")
    .Input("coords: int32")
    .Input("mask_index: int32")
    .Input("mask_bits: int32")
    .Output("y: T")
    .BLOCKSPARSE_TRANSFORMER_ATTRS
    .Attr("masked: bool")
    .Attr("autoregress: bool")
    .SetShapeFn([](InferenceContext* c) { return TransformerShape(c, BstOp::kSoftmax); })
    .Doc("Softmax of scale * x along each query row over the kept elements (0 where dropped, and for rows that "
         "keep nothing).");

REGISTER_OP("BlocksparseTransformerSoftmaxGrad")
    .Input("dy: T")
    .Input("y: T")
    .Input("scale: float")
    .Input("row_offsets: int32")
    .Output("dx: T")
    .BLOCKSPARSE_TRANSFORMER_ATTRS
    .SetShapeFn([](InferenceContext* c) { return TransformerShape(c, BstOp::kSoftmaxGrad); })
    .Doc("The gradient of BlocksparseTransformerSoftmax: (dy - rowsum(dy * y)) * y * scale.");

}  // namespace blocksparse
