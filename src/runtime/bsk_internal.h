/* Internals shared by the runtime (bsk.c, driver.c) and the generated specialisation table
 * (bsk_specs.c, written by blocksparse.aot.codegen). */
#ifndef BLOCKSPARSE_BSK_INTERNAL_H_
#define BLOCKSPARSE_BSK_INTERNAL_H_

#include "bsk.h"
#include "cuda.h"

#define BSK_HIDDEN __attribute__((visibility("hidden")))

/* Kernel families: how a kernel's arguments and grid are computed (one parameter list each). */
enum { BSK_XPROP_PTR = 0, BSK_XPROP_TMA = 1, BSK_UPDAT_PTR = 2, BSK_UPDAT_TMA = 3 };

/* A 2-D tensor a descriptor covers, in storage order; strides in elements. */
typedef struct {
  CUdeviceptr base;
  int32_t shape[2];
  int64_t strides[2];
} bsk_tensor;

/* Every argument one of the kernels takes, named as the kernel names it.  The runtime fills the
 * ones a family uses; a generated launcher passes those its kernel was compiled to take. */
typedef struct {
  CUdeviceptr X, W, Y, DY, DW, HEADERS, ENTRIES, GROUPS;
  int32_t N, OUT_FEATURES, num_segments, tokens_per_split;
  int32_t stride_xn, stride_xf, stride_yn, stride_yf, stride_dn, stride_df;
  bsk_tensor x_desc, w_desc, y_desc, dy_desc;
} bsk_values;

typedef CUresult (*bsk_launcher)(CUfunction function, CUstream stream, const unsigned grid[3],
                                 const bsk_values *values);

typedef struct {
  const char *name;     /* the specialisation (AotSpec.name) */
  const char *function; /* the kernel's symbol in the cubin */
  int arch, product, dtype, block_size, axis, family, atomic;
  int group, bm, bk, bn, waves; /* tile: G, BM, BK, BN (resolved: never 0), WAVES */
  int num_warps, shared;
  const unsigned char *cubin;
  size_t cubin_size;
  bsk_launcher launch;
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
  CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*FuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
  CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*FuncSetCacheConfig)(CUfunction, CUfunc_cache);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **, void **);
  CUresult (*MemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
  CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                   const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                   const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
} bsk_driver;

/* The driver's entry points, or NULL with the reason in `why` (a static string). */
BSK_HIDDEN const bsk_driver *bsk_driver_get(const char **why);
BSK_HIDDEN const char *bsk_cuda_error(CUresult result);

/* Helpers of the generated launchers. */
BSK_HIDDEN CUresult bsk_encode_tensormap(CUtensorMap *map, const bsk_tensor *tensor, int data_type,
                                         int elem_size, int box0, int box1, int swizzle);
BSK_HIDDEN CUresult bsk_launch_kernel(CUfunction function, CUstream stream, const unsigned grid[3],
                                      int num_warps, int shared, void **params);

#endif /* BLOCKSPARSE_BSK_INTERNAL_H_ */
