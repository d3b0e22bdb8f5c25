/* Internals shared by the runtime (bsk.c, driver.c) and the generated spec table (bsk_specs.c,
 * written by blocksparse.aot.codegen). */
#ifndef BLOCKSPARSE_BSK_INTERNAL_H_
#define BLOCKSPARSE_BSK_INTERNAL_H_

#include "bsk.h"
#include "cuda.h"

#define BSK_HIDDEN __attribute__((visibility("hidden")))

/* One kernel argument as compiled: kind (BSK_ARG_*), rank (tensors), and whether the kernel was
 * compiled assuming a multiple of 16 (pointers: 16-byte aligned). */
typedef struct {
  const char *name;
  int kind, rank, divisible;
} bsk_param;

/* A key field of a spec: ints and bools in `value`, strings in `text` (NULL otherwise). */
typedef struct {
  const char *name;
  int64_t value;
  const char *text;
} bsk_key;

/* Packs `args` into the kernel's launch parameters (encoding tensor maps) and launches. */
typedef CUresult (*bsk_launcher)(CUfunction function, CUstream stream, const unsigned grid[3],
                                 const bsk_arg *args);

typedef struct {
  const char *name;     /* the spec's name within its family */
  const char *function; /* the kernel's symbol in the cubin */
  const char *family;
  int arch, image, num_warps, shared; /* image: BSK_IMAGE_* */
  const unsigned char *cubin;          /* what cuModuleLoadData takes: a cubin, or NUL-terminated PTX */
  size_t cubin_size;
  bsk_launcher launch;
  int nparams;
  const bsk_param *params;
  int nkeys;
  const bsk_key *keys;
} bsk_spec;

/* Defined by the generated bsk_specs.c. */
BSK_HIDDEN extern const bsk_spec bsk_specs[];
BSK_HIDDEN extern const int bsk_specs_count;
BSK_HIDDEN extern const char bsk_manifest_json[];

/* driver.c: libcuda, opened on first use. */
typedef struct {
  CUresult (*GetErrorString)(CUresult, const char **);
  CUresult (*Init)(unsigned);
  CUresult (*StreamGetCtx)(CUstream, CUcontext *);
  CUresult (*CtxGetCurrent)(CUcontext *);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext *);
  CUresult (*CtxGetDevice)(CUdevice *);
  CUresult (*PointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*FuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
  CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*FuncSetCacheConfig)(CUfunction, CUfunc_cache);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **, void **);
  CUresult (*MemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                   const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                   const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
} bsk_driver;

/* The driver's entry points, or NULL with the reason in `why` (a static string). */
BSK_HIDDEN const bsk_driver *bsk_driver_get(const char **why);
BSK_HIDDEN const char *bsk_cuda_error(CUresult result);

/* Helpers of the generated launchers. */
BSK_HIDDEN CUresult bsk_encode_tensormap(CUtensorMap *map, const bsk_arg *tensor, int data_type,
                                         int elem_size, const unsigned *box, int swizzle);
BSK_HIDDEN CUresult bsk_launch_kernel(CUfunction function, CUstream stream, const unsigned grid[3],
                                      int num_warps, int shared, void **params);

#endif /* BLOCKSPARSE_BSK_INTERNAL_H_ */
