// The attrs and input checks of the transformer ops, one definition for shape functions and kernels
// alike (src/tf/transformer_ops.cc, src/tf/transformer_kernels.cc): a check reads each input's shape
// through an accessor, as known at graph time (sizes may be unknown) or at run time.
#ifndef BLOCKSPARSE_TF_TRANSFORMER_PROBLEM_H_
#define BLOCKSPARSE_TF_TRANSFORMER_PROBLEM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/platform/errors.h"

namespace blocksparse {

enum class BstOp { kNT, kXN, kSoftmax, kSoftmaxGrad };

// A shape as the checks see it: sizes (-1: unknown), or an unknown rank (`known` false).
struct Dims {
  bool known = true;
  std::vector<int64_t> sizes;

  int64_t Size(int i) const { return known ? sizes[i] : -1; }
  std::string Text() const {
    if (!known) return "<unknown>";
    std::string out = "(";
    for (size_t i = 0; i < sizes.size(); ++i)
      absl::StrAppend(&out, i ? ", " : "", sizes[i] < 0 ? std::string("?") : absl::StrCat(sizes[i]));
    return absl::StrCat(out, sizes.size() == 1 ? ",)" : ")");
  }
};

// `got` must match `want` (-1 in `want`: any size): InvalidArgument naming `name` and describing the
// wanted shape as `what` (e.g. "(batch, heads, blocks, bs, bs)").
inline absl::Status Match(const char* name, const Dims& got, const std::vector<int64_t>& want,
                          const std::string& what) {
  bool ok = !got.known || got.sizes.size() == want.size();
  for (size_t i = 0; ok && got.known && i < want.size(); ++i)
    ok = want[i] < 0 || got.sizes[i] < 0 || got.sizes[i] == want[i];
  if (ok) return absl::OkStatus();
  const std::string sizes = Dims{true, want}.Text();
  return tensorflow::errors::InvalidArgument(name, " must have shape ", what, what == sizes ? "" : " = ",
                                             what == sizes ? "" : sizes, "; got shape ", got.Text());
}

// Two known sizes must agree: `what` names them ("batch size").
inline absl::Status Same(const char* a, const char* b, int64_t size_a, int64_t size_b, const char* what) {
  if (size_a >= 0 && size_b >= 0 && size_a != size_b)
    return tensorflow::errors::InvalidArgument(a, " and ", b, " must have the same ", what, "; got ", size_a,
                                               " and ", size_b);
  return absl::OkStatus();
}

// The layout's sizes as attrs (the tables' shapes follow from them), and the op's variant.
struct TransformerAttrs {
  BstOp op = BstOp::kNT;
  int64_t block_size = 0, heads = 0, lut_heads = 0, blocks = 0, q_blocks = 0, k_blocks = 0;
  bool trans = false;        // xn: tn (w.T @ x by key columns), else nn
  bool masked = false;       // softmax: in-block masks
  bool autoregress = false;  // softmax: the autoregressive rule

  std::vector<int64_t> Scores() const { return {-1, heads, blocks, block_size, block_size}; }
  int64_t InBlocks() const { return op == BstOp::kXN && trans ? q_blocks : k_blocks; }
  int64_t OutBlocks() const { return op == BstOp::kXN && trans ? k_blocks : q_blocks; }
};

template <typename Context>
absl::Status ReadTransformerAttrs(Context* ctx, BstOp op, TransformerAttrs* a) {
  a->op = op;
  TF_RETURN_IF_ERROR(ctx->GetAttr("block_size", &a->block_size));
  TF_RETURN_IF_ERROR(ctx->GetAttr("heads", &a->heads));
  TF_RETURN_IF_ERROR(ctx->GetAttr("lut_heads", &a->lut_heads));
  TF_RETURN_IF_ERROR(ctx->GetAttr("blocks", &a->blocks));
  TF_RETURN_IF_ERROR(ctx->GetAttr("q_blocks", &a->q_blocks));
  TF_RETURN_IF_ERROR(ctx->GetAttr("k_blocks", &a->k_blocks));
  if (op == BstOp::kXN) TF_RETURN_IF_ERROR(ctx->GetAttr("trans", &a->trans));
  if (op == BstOp::kSoftmax) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("masked", &a->masked));
    TF_RETURN_IF_ERROR(ctx->GetAttr("autoregress", &a->autoregress));
  }
  const int64_t bs = a->block_size;
  if (bs != 16 && bs != 32 && bs != 64 && bs != 128)
    return tensorflow::errors::InvalidArgument(
        "block_size must be one of 16, 32, 64, 128 (the GPU kernels' block sizes); got ", bs);
  if (a->heads < 1 || a->q_blocks < 1 || a->k_blocks < 1)
    return tensorflow::errors::InvalidArgument("heads, q_blocks and k_blocks must be >= 1; got ", a->heads, ", ",
                                               a->q_blocks, " and ", a->k_blocks);
  if (a->lut_heads != 1 && a->lut_heads != a->heads)
    return tensorflow::errors::InvalidArgument("lut_heads must be 1 or heads = ", a->heads, "; got ", a->lut_heads);
  if (a->blocks < 1 || a->blocks > a->q_blocks * a->k_blocks)
    return tensorflow::errors::InvalidArgument("blocks must be in [1, q_blocks * k_blocks] = [1, ",
                                               a->q_blocks * a->k_blocks, "]; got ", a->blocks);
  return absl::OkStatus();
}

// Activations (batch, ctx_blocks * bs, heads * head_dim) of `name`; *batch and *features (-1 unknown).
template <typename Input>
absl::Status Activations(const TransformerAttrs& a, Input input, int index, const char* name, int64_t ctx_blocks,
                         const char* ctx_name, int64_t* batch, int64_t* features) {
  const Dims d = input(index);
  TF_RETURN_IF_ERROR(Match(name, d, {-1, ctx_blocks * a.block_size, -1},
                           absl::StrCat("(batch, ", ctx_name, ", heads * head_dim)")));
  *batch = d.Size(0), *features = d.Size(2);
  if (*features == 0 || (*features > 0 && *features % a.heads))
    return tensorflow::errors::InvalidArgument(name, " must have shape (batch, ", ctx_name, ", heads * head_dim): its ",
                                               *features, " features are not a positive multiple of heads = ",
                                               a.heads);
  return absl::OkStatus();
}

// Packed scores (batch, heads, blocks, bs, bs) of `name`; *batch (-1 unknown).
template <typename Input>
absl::Status Scores(const TransformerAttrs& a, Input input, int index, const char* name, int64_t* batch) {
  const Dims d = input(index);
  TF_RETURN_IF_ERROR(Match(name, d, a.Scores(), "(batch, heads, blocks, bs, bs)"));
  *batch = d.Size(0);
  return absl::OkStatus();
}

// Every input of the op, in order, against the attrs and each other: `input(i)` gives input i's Dims.
// *batch and *features: the batch size and, for the products, the features (-1: unknown).
template <typename Input>
absl::Status CheckInputs(const TransformerAttrs& a, Input input, int64_t* batch, int64_t* features) {
  const int64_t lh = a.lut_heads;
  int64_t other_batch = -1, other_features = -1;
  *features = -1;
  auto table = [&](int index, const char* name, std::vector<int64_t> want, const char* what) {
    return Match(name, input(index), want, what);
  };
  auto same_batch = [&](const char* x, const char* y) {
    TF_RETURN_IF_ERROR(Same(x, y, *batch, other_batch, "batch size"));
    if (*batch < 0) *batch = other_batch;
    return absl::OkStatus();
  };
  switch (a.op) {
    case BstOp::kNT:
      TF_RETURN_IF_ERROR(Activations(a, input, 0, "a", a.q_blocks, "ctx_q", batch, features));
      TF_RETURN_IF_ERROR(Activations(a, input, 1, "b", a.k_blocks, "ctx_k", &other_batch, &other_features));
      TF_RETURN_IF_ERROR(Same("a", "b", *features, other_features, "features (heads * head_dim)"));
      if (*features < 0) *features = other_features;
      TF_RETURN_IF_ERROR(table(2, "coords", {lh, a.blocks, 2}, "(lut_heads, blocks, 2)"));
      return same_batch("a", "b");
    case BstOp::kXN:
      TF_RETURN_IF_ERROR(Scores(a, input, 0, "w", batch));
      TF_RETURN_IF_ERROR(Activations(a, input, 1, "x", a.InBlocks(), a.trans ? "ctx_q" : "ctx_k", &other_batch,
                                     features));
      TF_RETURN_IF_ERROR(table(2, "coords", {lh, a.blocks, 2}, "(lut_heads, blocks, 2)"));
      TF_RETURN_IF_ERROR(table(3, "offsets", {lh, a.OutBlocks() + 1},
                               a.trans ? "(lut_heads, k_blocks + 1)" : "(lut_heads, q_blocks + 1)"));
      TF_RETURN_IF_ERROR(table(4, "block_ids", {lh, a.blocks}, "(lut_heads, blocks)"));
      return same_batch("w", "x");
    case BstOp::kSoftmax:
      TF_RETURN_IF_ERROR(Scores(a, input, 0, "x", batch));
      TF_RETURN_IF_ERROR(Match("scale", input(1), {}, "()"));
      TF_RETURN_IF_ERROR(Match("autoregress_at_key", input(2), {}, "()"));
      TF_RETURN_IF_ERROR(table(3, "row_offsets", {lh, a.q_blocks + 1}, "(lut_heads, q_blocks + 1)"));
      TF_RETURN_IF_ERROR(table(4, "coords", {lh, a.blocks, 2}, "(lut_heads, blocks, 2)"));
      if (!a.masked) return absl::OkStatus();
      TF_RETURN_IF_ERROR(table(5, "mask_index", {lh, a.blocks}, "(lut_heads, blocks)"));
      TF_RETURN_IF_ERROR(table(6, "mask_bits", {-1, a.block_size, (a.block_size + 31) / 32},
                               "(masks, bs, ceil(bs / 32))"));
      if (input(6).Size(0) == 0)
        return tensorflow::errors::InvalidArgument("mask_bits must hold at least one mask when masked is true");
      return absl::OkStatus();
    case BstOp::kSoftmaxGrad:
      TF_RETURN_IF_ERROR(Scores(a, input, 0, "dy", batch));
      TF_RETURN_IF_ERROR(Scores(a, input, 1, "y", &other_batch));
      TF_RETURN_IF_ERROR(Match("scale", input(2), {}, "()"));
      TF_RETURN_IF_ERROR(table(3, "row_offsets", {lh, a.q_blocks + 1}, "(lut_heads, q_blocks + 1)"));
      return same_batch("dy", "y");
  }
  return absl::OkStatus();
}

}  // namespace blocksparse

#endif  // BLOCKSPARSE_TF_TRANSFORMER_PROBLEM_H_
