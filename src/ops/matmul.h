/* The matmul family's C entry points, built on the generic runtime (src/runtime/bsk.h): spec
 * selection, grids and arguments of the three products, for the TensorFlow ops (src/tf/) and
 * the GPU verification script.  The PyTorch frontend computes the same in Python
 * (blocksparse/torch/_matmul/), one launch plan per call shape, and calls bsk_launch itself.
 *
 * A call describes one product of y = x @ W (W block-sparse, packed (blocks, bs, bs)):
 *   fprop  y  = x @ W      x (N, C) -> y  (N, K)      tables: fprop headers / entries
 *   bprop  dx = dy @ W.T   dy (N, K) -> dx (N, C)     tables: bprop headers / entries
 *   updat  dw = x.T @ dy   per block, float32         table:  updat_groups(G)
 * with C = c_blocks * bs, K = k_blocks * bs, activations transposed ((F, N)) when axis == 0.  The
 * tables are the layout core's (blocksparse/layout.py), int32, in device memory, built with the G
 * of the kernel that runs (the build manifest lists each spec's "group").  Every pointer is a
 * device address aligned to 16 bytes.  Where a bprop spec has "trans_w": false in the manifest
 * (float32: blocksparse.ops.matmul.configs.bprop_pretransposes_weight), `w` must hold every block
 * transposed (W[b].T, packed), as the JIT launcher passes it too.
 */
#ifndef BLOCKSPARSE_OPS_MATMUL_H_
#define BLOCKSPARSE_OPS_MATMUL_H_

#include "bsk.h"
#include "dtypes.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { BSK_FPROP = 0, BSK_BPROP = 1, BSK_UPDAT = 2 };

typedef struct {
  int32_t product;      /* BSK_FPROP, BSK_BPROP or BSK_UPDAT */
  int32_t dtype;        /* of the activations and the weight (dw is always float32) */
  int32_t block_size;   /* 16, 32, 64 or 128 */
  int32_t axis;         /* feature axis: 1 for (N, F) activations, 0 for (F, N) */
  int32_t group;        /* G the tables were built with */
  int32_t split;        /* updat: token slices (0: bsk_matmul_run chooses); fprop / bprop: unused */
  int64_t n_tokens;     /* N */
  int64_t c_blocks;     /* CB: C = CB * block_size */
  int64_t k_blocks;     /* KB: K = KB * block_size */
  int64_t blocks;       /* nonzero blocks (rows of the packed weight) */
  int64_t table_rows;   /* rows of headers (fprop / bprop) or of the updat_groups table */
  uint64_t x, dy, w;    /* inputs: fprop x, w; bprop dy, w; updat x, dy */
  uint64_t y, dx, dw;   /* the output of the product */
  uint64_t headers, entries, groups;
} bsk_matmul_call;

/* The matmul spec serving `call` on a GPU of compute capability `arch` (10 * major + minor), with
 * float32 atomics or without, or -1; never a `dw16` updat (dW is float32 here), nor a spec of packed
 * weights (the PyTorch plans' refined layers).  Pure: touches no GPU. */
BSK_API int bsk_matmul_select(const bsk_matmul_call *call, int arch, int atomic);
/* Token slices of an updat call on spec `spec` for a GPU with `sms` multiprocessors. */
BSK_API int bsk_matmul_updat_split(int spec, int64_t n_tokens, int64_t table_rows, int sms);

/* Run `call` on `stream` (a CUstream; the context is the stream's).  bsk_matmul_run picks the
 * spec (and the updat split when call->split is 0); bsk_matmul_run_spec runs the one given.
 * On failure `message` (if not NULL) receives a NUL-terminated explanation. */
BSK_API int bsk_matmul_run(const bsk_matmul_call *call, void *stream, char *message, size_t size);
BSK_API int bsk_matmul_run_spec(int spec, const bsk_matmul_call *call, void *stream, char *message,
                                size_t size);

#ifdef __cplusplus
}
#endif

#endif /* BLOCKSPARSE_OPS_MATMUL_H_ */
