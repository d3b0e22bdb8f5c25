/* Activation dtypes as the families' C entry points number them (shared by src/ops/ and src/tf/). */
#ifndef BLOCKSPARSE_OPS_DTYPES_H_
#define BLOCKSPARSE_OPS_DTYPES_H_

enum { BSK_FP16 = 0, BSK_BF16 = 1, BSK_FP32 = 2 };

#endif /* BLOCKSPARSE_OPS_DTYPES_H_ */
