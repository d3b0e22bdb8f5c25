/* The transformer family's C entry points on the generic runtime (src/runtime/bsk.h): spec
 * selection, grids and arguments of the block-sparse attention kernels
 * (blocksparse/ops/transformer/products.py, softmax.py), for the TensorFlow ops (src/tf/).  The
 * PyTorch frontend launches the same kernels with Triton's JIT (blocksparse/torch/_transformer/
 * launch.py) with the same grids, head slices and warps.
 *
 * Shapes (N batch, H heads, QB / KB query / key blocks of bs positions, F = H * head_dim):
 * activations are dense (N, ctx, F), packed scores dense (N, H, blocks, bs, bs).
 *   nt            a (N, QB * bs, F), b (N, KB * bs, F)  -> out packed scores
 *   nn            a packed w, b x (N, KB * bs, F)        -> out (N, QB * bs, F)
 *   tn            a packed w, b x (N, QB * bs, F)        -> out (N, KB * bs, F)
 *   softmax       a packed x                             -> out packed y
 *   softmax_grad  a packed dy, b packed y                -> out packed dx
 * The tables are those of blocksparse/ops/transformer/lut.py (int32, in device memory): coords
 * (nt, nn, tn, masked or autoregressive softmax), row_offsets (nn, softmax, softmax_grad),
 * col_offsets and col_blocks (tn), mask_index and mask_bits (masked softmax).  The products need a
 * head dimension that is a multiple of 16 (what the kernels were compiled for).  Every pointer is a
 * device address aligned to 16 bytes. */
#ifndef BLOCKSPARSE_OPS_TRANSFORMER_H_
#define BLOCKSPARSE_OPS_TRANSFORMER_H_

#include "bsk.h"
#include "dtypes.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { BSK_BST_NT = 0, BSK_BST_NN = 1, BSK_BST_TN = 2, BSK_BST_SOFTMAX = 3, BSK_BST_SOFTMAX_GRAD = 4 };

typedef struct {
  int32_t product;      /* BSK_BST_* */
  int32_t dtype;        /* BSK_FP16, BSK_BF16 or BSK_FP32: of every operand */
  int32_t block_size;   /* bs: 16, 32, 64 or 128 */
  int32_t masked;       /* softmax: drop what the in-block masks drop */
  int32_t autoregress;  /* softmax: drop key position kp > query position qp where kp >= ar_key */
  int32_t ar_key;
  int64_t batch;        /* N */
  int64_t heads;        /* H */
  int64_t lut_heads;    /* heads of the tables: head h reads lut head h % lut_heads */
  int64_t blocks;       /* blocks per head */
  int64_t q_blocks;     /* QB */
  int64_t k_blocks;     /* KB */
  int64_t features;     /* F (the products) */
  float scale;          /* softmax, softmax_grad */
  uint64_t a, b, out;
  uint64_t coords, row_offsets, col_offsets, col_blocks, mask_index, mask_bits;
} bsk_transformer_call;

/* The spec serving `call` on a GPU of compute capability `arch` (10 * major + minor), or -1.
 * Pure: touches no GPU. */
BSK_API int bsk_transformer_select(const bsk_transformer_call *call, int arch);

/* Run `call` on `stream` (a CUstream); on failure `message` (if not NULL) explains. */
BSK_API int bsk_transformer_run(const bsk_transformer_call *call, void *stream, char *message, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* BLOCKSPARSE_OPS_TRANSFORMER_H_ */
