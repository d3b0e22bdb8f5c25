// The attributes the three ops share, and the checks shape functions and kernels both apply.
#ifndef BLOCKSPARSE_TF_PROBLEM_H_
#define BLOCKSPARSE_TF_PROBLEM_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/platform/errors.h"

namespace blocksparse {

// What the attrs say about y = x @ W: block size, feature axis, nonzero blocks and the layout's
// block rows (C = c_blocks * block_size) and columns (K = k_blocks * block_size).
struct Problem {
  int64_t block_size = 0;
  int64_t axis = 0;
  int64_t blocks = 0;
  int64_t c_blocks = 0;
  int64_t k_blocks = 0;

  int64_t C() const { return c_blocks * block_size; }
  int64_t K() const { return k_blocks * block_size; }
  // "(N, C)" / "(C, N)"
  std::string ActivationShape(const char* features) const {
    return axis == 1 ? absl::StrCat("(N, ", features, ")") : absl::StrCat("(", features, ", N)");
  }
};

// Reads and checks the attrs from an OpKernelConstruction or a shape InferenceContext.
template <typename Context>
absl::Status ReadProblem(Context* ctx, Problem* p) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("block_size", &p->block_size));
  TF_RETURN_IF_ERROR(ctx->GetAttr("axis", &p->axis));
  TF_RETURN_IF_ERROR(ctx->GetAttr("blocks", &p->blocks));
  TF_RETURN_IF_ERROR(ctx->GetAttr("c_blocks", &p->c_blocks));
  TF_RETURN_IF_ERROR(ctx->GetAttr("k_blocks", &p->k_blocks));
  const int64_t bs = p->block_size;
  if (bs != 16 && bs != 32 && bs != 64 && bs != 128)
    return tensorflow::errors::InvalidArgument(
        "block_size must be one of 16, 32, 64, 128 (the GPU kernels' block sizes); got ", bs);
  if (p->axis != 0 && p->axis != 1)
    return tensorflow::errors::InvalidArgument(
        "axis must be 1 (activations (N, C)) or 0 (activations (C, N)); got ", p->axis);
  if (p->c_blocks < 1 || p->k_blocks < 1)
    return tensorflow::errors::InvalidArgument("c_blocks and k_blocks must be >= 1; got ",
                                               p->c_blocks, " and ", p->k_blocks);
  if (p->blocks < 1 || p->blocks > p->c_blocks * p->k_blocks)
    return tensorflow::errors::InvalidArgument(
        "blocks must be in [1, c_blocks * k_blocks] = [1, ", p->c_blocks * p->k_blocks,
        "]; got ", p->blocks);
  return absl::OkStatus();
}

// Lookup tables: `width` columns, or (width < 0) an odd number >= 3 (updat_groups: 1 + 2G), or
// (width == 0) at least 2 (xprop entries: 1 + G).
inline absl::Status CheckTableWidth(const char* name, int64_t rows, int64_t columns,
                                    int64_t width) {
  if (rows == 0)
    return tensorflow::errors::InvalidArgument(name, " must have at least one row; got none");
  bool ok = width > 0 ? columns == width
                      : (width == 0 ? columns >= 2 : (columns >= 3 && columns % 2 == 1));
  if (columns >= 0 && !ok) {
    const std::string want = width > 0    ? absl::StrCat(width, " columns")
                             : width == 0 ? std::string("1 + G columns (G >= 1)")
                                          : std::string("1 + 2G columns (G >= 1)");
    return tensorflow::errors::InvalidArgument(name, " must have ", want, "; got ", columns);
  }
  return absl::OkStatus();
}

}  // namespace blocksparse

#endif  // BLOCKSPARSE_TF_PROBLEM_H_
