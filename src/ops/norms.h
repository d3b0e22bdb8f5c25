/* The norms and LSTM families' C entry points on the generic runtime (src/runtime/bsk.h): spec
 * selection, grids and arguments of the layer-norm and LSTM-gate kernels, for the TensorFlow ops
 * (src/tf/).  The PyTorch frontend launches the same kernels with Triton's JIT
 * (blocksparse/torch/_norms/, blocksparse/torch/_lstm/), with the same tiles.
 *
 * Layer norm: x is (N, C) for axis 1 and (C, N) for axis 0, dense; the C features are cut into
 * `segments` equal slices, each normalised on its own; g and b are (C,), float32 or (`params`) of
 * x's 16-bit dtype; mean and rstd float32 (segments, N).  Forward: x, g, b -> y, mean, rstd (y must
 * not overlap x: the split forward of large (C, N) calls stages its partial statistics there).
 * Backward: x, g, b, dy, mean, rstd -> dx and dg, db (C,) in the parameters' dtype, through
 * `workspace` (bsk_layer_norm_workspace bytes).
 *
 * LSTM gates: c (N, K) and the gates i, j, f, o, either four (N, K) tensors or one merged
 * (N, 4K) tensor (`merged`), dense, K a multiple of 16; bias float32 (4K,) or 0.  Forward ->
 * c_next, h_next (N, K).  Backward: + dc_next, dh_next -> dc (N, K), the gate gradients (in the
 * layout of the gates) and float32 dbias (4K,), through `workspace`.
 * Every pointer is a device address aligned to 16 bytes; empty tensors may be 0. */
#ifndef BLOCKSPARSE_OPS_NORMS_H_
#define BLOCKSPARSE_OPS_NORMS_H_

#include "bsk.h"
#include "dtypes.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t dtype;      /* BSK_FP16, BSK_BF16 or BSK_FP32: of x, y, dy, dx */
  int32_t axis;       /* 1: (N, C); 0: (C, N) */
  int32_t relu;       /* relu after the gain and bias */
  int32_t segments;   /* >= 1, divides C */
  int64_t n_tokens;   /* N */
  int64_t features;   /* C */
  float epsilon;
  uint64_t x, g, b, y, mean, rstd;
  uint64_t dy, dx, dg, db, workspace;
  int32_t params;     /* g and b: 0 float32, 1 the dtype of x (16-bit x only) */
} bsk_layer_norm_call;

typedef struct {
  int32_t dtype;      /* of c, the gates and every activation output */
  int32_t merged;     /* gates: one (N, 4K) tensor at i (j, f, o unused), else four (N, K) */
  int64_t n_tokens;   /* N */
  int64_t features;   /* K */
  float forget_bias;
  uint64_t c, i, j, f, o, bias, c_next, h_next;
  uint64_t dc_next, dh_next, dc, di, dj, df, d_o, dbias, workspace;
  int32_t params;     /* bias and dbias: 0 float32, 1 the dtype of c (16-bit c only) */
} bsk_lstm_gates_call;

/* The spec of the forward (backward = 0) or backward kernel serving `call` on a GPU of compute
 * capability `arch`, or -1.  Pure: touches no GPU. */
BSK_API int bsk_layer_norm_select(const bsk_layer_norm_call *call, int backward, int arch);
BSK_API int bsk_lstm_gates_select(const bsk_lstm_gates_call *call, int backward, int arch);

/* Bytes of device memory the backward needs in call->workspace on `stream`'s GPU. */
BSK_API int bsk_layer_norm_workspace(const bsk_layer_norm_call *call, void *stream, size_t *bytes, char *message,
                                     size_t size);
BSK_API int bsk_lstm_gates_workspace(const bsk_lstm_gates_call *call, void *stream, size_t *bytes, char *message,
                                     size_t size);

/* Run the forward or backward of `call` on `stream`; on failure `message` (if not NULL) explains. */
BSK_API int bsk_layer_norm_run(const bsk_layer_norm_call *call, int backward, void *stream, char *message,
                               size_t size);
BSK_API int bsk_lstm_gates_run(const bsk_lstm_gates_call *call, int backward, void *stream, char *message,
                               size_t size);

#ifdef __cplusplus
}
#endif

#endif /* BLOCKSPARSE_OPS_NORMS_H_ */
