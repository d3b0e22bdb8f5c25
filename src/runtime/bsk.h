/* blocksparse kernel runtime: the ahead-of-time compiled Triton kernels of every op family behind
 * one small, family-neutral C API.
 *
 * A build holds a table of *specs*: one compiled kernel each (a cubin for one GPU architecture),
 * with its family, its arguments in order and the family's key fields (product, dtype, ... as
 * the family chose them).  Callers pick a spec (by its keys, or from the embedded JSON manifest)
 * and launch it with bsk_launch: a grid and one tagged bsk_arg per kernel argument.  The PyTorch
 * frontend calls bsk_launch through ctypes with prebuilt argument arrays; families' C code (e.g.
 * src/ops/matmul.c, which the TensorFlow ops call) builds the same arrays.
 *
 * Nothing here links against CUDA: libcuda.so.1 is opened at the first launch, so a library
 * holding this runtime loads on machines without a GPU driver.  Modules are loaded once per
 * (spec, CUDA context); device properties are read once per context.
 */
#ifndef BLOCKSPARSE_BSK_H_
#define BLOCKSPARSE_BSK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BSK_API __attribute__((visibility("default")))

/* Bumped whenever bsk_arg or a function below changes. */
#define BSK_ABI_VERSION 3

/* Status codes. */
enum {
  BSK_OK = 0,
  BSK_ERR_INVALID = 1,     /* the call is malformed (arguments, alignment, spec index) */
  BSK_ERR_UNSUPPORTED = 2, /* no compiled kernel serves this call on this GPU */
  BSK_ERR_DRIVER = 3,      /* libcuda.so.1 missing or too old */
  BSK_ERR_CUDA = 4         /* a CUDA driver call failed */
};

/* How a spec's image reaches GPUs: a cubin for sm_XY runs on X.Y and later minors of X; an
 * arch-specific cubin (sm_XYa: Triton compiles sm_90 and newer so) on X.Y only; PTX for compute_XY
 * is JIT-compiled by the driver on X.Y and any later GPU. */
enum { BSK_IMAGE_CUBIN = 0, BSK_IMAGE_CUBIN_EXACT = 1, BSK_IMAGE_PTX = 2 };

/* Argument kinds. */
enum { BSK_ARG_PTR = 1, BSK_ARG_I32 = 2, BSK_ARG_I64 = 3, BSK_ARG_F32 = 4, BSK_ARG_TENSOR = 5 };

#define BSK_MAX_RANK 5

/* One kernel argument, in the order of the kernel's non-constexpr parameters.  A tensor stands
 * for a Triton host tensor descriptor: the runtime encodes its CUtensorMap from the base address,
 * shape and strides given here and the box and swizzle the spec was compiled with. */
typedef struct {
  int32_t kind; /* BSK_ARG_* */
  int32_t rank; /* tensors: number of dimensions (1..BSK_MAX_RANK); else 0 */
  union {
    uint64_t ptr; /* BSK_ARG_PTR: a device address; BSK_ARG_TENSOR: the tensor's base */
    int64_t i64;
    int32_t i32;
    float f32;
  } value;
  int64_t shape[BSK_MAX_RANK];   /* tensors: sizes, outermost first */
  int64_t strides[BSK_MAX_RANK]; /* tensors: in elements, the innermost one 1 */
} bsk_arg;

BSK_API int bsk_abi_version(void);
/* Number of compiled specs, and the build manifest (JSON) describing each in order. */
BSK_API int bsk_spec_count(void);
BSK_API const char *bsk_manifest(void);
/* A spec's name, family, compiled arch (10 * major + minor), image (BSK_IMAGE_*) and argument
 * count; NULL / -1 for an index out of range. */
BSK_API const char *bsk_spec_name(int spec);
BSK_API const char *bsk_spec_family(int spec);
BSK_API int bsk_spec_arch(int spec);
BSK_API int bsk_spec_image(int spec);
BSK_API int bsk_spec_nargs(int spec);
/* Argument `i` of a spec: 1 and its name, kind (BSK_ARG_*), rank (tensors) and whether it was
 * compiled as a multiple of 16 (any output pointer may be NULL); 0 past the last one. */
BSK_API int bsk_spec_arg(int spec, int i, const char **name, int *kind, int *rank, int *divisible);
/* A key field of a spec: 1 if present (*value holds ints and bools, *text strings, else NULL),
 * 0 if the spec has no such key. */
BSK_API int bsk_spec_key(int spec, const char *key, int64_t *value, const char **text);
/* The one selection rule of every caller: how well an `image` (BSK_IMAGE_*) compiled for `compiled`
 * serves a GPU of `arch` (both 10 * major + minor).  0: it cannot run there; else larger is
 * better -- any cubin over PTX, then the newest compiled arch.  Pure: touches no GPU. */
BSK_API int bsk_arch_rank(int compiled, int image, int arch);
/* The shared memory (bytes) one block may use on `arch` (the opt-in maximum NVIDIA documents per
 * compute capability); for an architecture this table does not know, the smallest of recent ones
 * (99 KiB), so that no spec is picked that could not launch. */
BSK_API int bsk_arch_shared_limit(int arch);
/* bsk_arch_rank of spec `spec` on `arch`, 0 where its shared memory exceeds bsk_arch_shared_limit
 * (e.g. a float32 sm_80 kernel on an sm_86 GPU, or PTX on sm_120) or the index is out of range. */
BSK_API int bsk_spec_rank(int spec, int arch);

/* Compute capability (10 * major + minor) and multiprocessor count of the GPU of `stream`'s
 * context (the current context for the NULL stream). */
BSK_API int bsk_device(void *stream, int *arch, int *sms, char *message, size_t size);
/* bsk_device, where a thread with no current context (a framework's autograd worker) on the NULL
 * stream asks: then of the GPU holding device address `address` (0: none). */
BSK_API int bsk_device_at(void *stream, uint64_t address, int *arch, int *sms, char *message, size_t size);

/* Launch `spec` on `stream` (a CUstream) over `grid` with `args` (exactly bsk_spec_nargs(spec),
 * in order).  Checks kinds, ranks and the alignment every argument was compiled for, and that
 * the spec was compiled for this GPU; an empty grid launches nothing.  On failure `message` (if
 * not NULL) receives a NUL-terminated explanation. */
BSK_API int bsk_launch(int spec, const unsigned grid[3], const bsk_arg *args, int nargs, void *stream,
                       char *message, size_t size);

/* Fill `count` 32-bit words at `address` with `value` on `stream` (e.g. float32 zeros that
 * atomics add into). */
BSK_API int bsk_memset32(uint64_t address, uint32_t value, size_t count, void *stream, char *message,
                         size_t size);

/* Copy `bytes` from host memory at `source` to the device address `address` on `stream`.  The
 * source must stay untouched until the stream reaches the copy (pageable memory is staged before
 * the call returns).  For tables uploaded once and kept (the TensorFlow ops' lookup tables). */
BSK_API int bsk_upload(uint64_t address, const void *source, size_t bytes, void *stream, char *message,
                       size_t size);

#ifdef __cplusplus
}
#endif

#endif /* BLOCKSPARSE_BSK_H_ */
