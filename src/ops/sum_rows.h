/* The deterministic column sums of per-program partial rows (blocksparse/ops/common/reduce.py),
 * as families with a reducing backward register them (blocksparse/ops/common/aot.py). */
#ifndef BLOCKSPARSE_OPS_SUM_ROWS_H_
#define BLOCKSPARSE_OPS_SUM_ROWS_H_

#include "bsk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out_a[m] = sum_p part_a[p, m] (out_b likewise when part_b is not 0) over float32 (rows, columns)
 * buffers, written in `out_dtype` (BSK_FP16, BSK_BF16 or BSK_FP32), with the sum_rows spec of
 * `family` that serves `arch`. */
BSK_API int bsk_sum_rows_run(const char *family, int arch, int out_dtype, uint64_t part_a, uint64_t part_b,
                             uint64_t out_a, uint64_t out_b, int64_t rows, int64_t columns, void *stream,
                             char *message, size_t size);

/* The index of the spec bsk_sum_rows_run takes for (rows, columns) on `arch`, or -1. */
BSK_API int bsk_sum_rows_select(const char *family, int arch, int out_dtype, int has_b, int64_t rows,
                                int64_t columns);

#ifdef __cplusplus
}
#endif

#endif /* BLOCKSPARSE_OPS_SUM_ROWS_H_ */
