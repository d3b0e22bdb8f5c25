/* The CUDA driver, opened at first use: a library holding the runtime loads where no driver is
 * installed (CPU-only TensorFlow, CI), and fails only when a kernel is launched. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "bsk_internal.h"

/* glibc 2.34 moved these into libc under new symbol versions; binding the original ones keeps
 * the library loadable on older systems (its wheel's manylinux tag follows what it needs). */
#if defined(__GLIBC__) && defined(__x86_64__)
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
__asm__(".symver pthread_once,pthread_once@GLIBC_2.2.5");
#endif

#define BSK_STR_(x) #x
#define BSK_STR(x) BSK_STR_(x) /* expands cuda.h's renames, e.g. cuCtxPushCurrent_v2 */

static bsk_driver driver;
static const char *driver_error;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

/* The field must have the type of the cuda.h prototype: checked at compile time, without
 * referencing the symbol (nothing here links against libcuda). */
#define BSK_LOAD(field, symbol)                                                               \
  do {                                                                                        \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&symbol), __typeof__(driver.field)), \
                   "driver." #field " does not match " #symbol);                             \
    *(void **)(&driver.field) = dlsym(lib, BSK_STR(symbol));                                  \
    if (!driver.field) {                                                                      \
      driver_error = "libcuda.so.1 lacks " BSK_STR(symbol) "; the driver is too old for "     \
                     "blocksparse's kernels (they need CUDA 12)";                             \
      return;                                                                                 \
    }                                                                                         \
  } while (0)

static void open_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    driver_error = "libcuda.so.1 (the NVIDIA driver) could not be opened; blocksparse's GPU "
                   "kernels need an NVIDIA GPU with its driver installed";
    return;
  }
  BSK_LOAD(GetErrorString, cuGetErrorString);
  BSK_LOAD(Init, cuInit);
  BSK_LOAD(StreamGetCtx, cuStreamGetCtx);
  BSK_LOAD(CtxGetCurrent, cuCtxGetCurrent);
  BSK_LOAD(CtxPushCurrent, cuCtxPushCurrent);
  BSK_LOAD(CtxPopCurrent, cuCtxPopCurrent);
  BSK_LOAD(CtxGetDevice, cuCtxGetDevice);
  BSK_LOAD(PointerGetAttribute, cuPointerGetAttribute);
  BSK_LOAD(DeviceGet, cuDeviceGet);
  BSK_LOAD(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
  BSK_LOAD(DeviceGetAttribute, cuDeviceGetAttribute);
  BSK_LOAD(ModuleLoadData, cuModuleLoadData);
  BSK_LOAD(ModuleGetFunction, cuModuleGetFunction);
  BSK_LOAD(FuncGetAttribute, cuFuncGetAttribute);
  BSK_LOAD(FuncSetAttribute, cuFuncSetAttribute);
  BSK_LOAD(FuncSetCacheConfig, cuFuncSetCacheConfig);
  BSK_LOAD(LaunchKernel, cuLaunchKernel);
  BSK_LOAD(MemsetD32Async, cuMemsetD32Async);
  BSK_LOAD(MemcpyHtoDAsync, cuMemcpyHtoDAsync);
  BSK_LOAD(TensorMapEncodeTiled, cuTensorMapEncodeTiled);
  if (driver.Init(0) != CUDA_SUCCESS) {
    driver_error = "cuInit failed: the NVIDIA driver is installed but no GPU can be used";
    return;
  }
}

const bsk_driver *bsk_driver_get(const char **why) {
  pthread_once(&driver_once, open_driver);
  if (driver_error) {
    *why = driver_error;
    return NULL;
  }
  return &driver;
}

const char *bsk_cuda_error(CUresult result) {
  const char *text = NULL;
  if (driver.GetErrorString && driver.GetErrorString(result, &text) == CUDA_SUCCESS && text)
    return text;
  return "unknown CUDA error";
}

CUresult bsk_encode_tensormap(CUtensorMap *map, const bsk_arg *tensor, int data_type,
                              int elem_size, const unsigned *box, int swizzle) {
  /* cuTensorMapEncodeTiled lists dimensions innermost first; strides in bytes, the innermost
   * one (always 1 element) left out.  As Triton's launcher encodes its descriptors. */
  int rank = tensor->rank;
  cuuint64_t dims[BSK_MAX_RANK], strides[BSK_MAX_RANK];
  cuuint32_t boxes[BSK_MAX_RANK], element_strides[BSK_MAX_RANK];
  for (int i = 0; i < rank; ++i) {
    dims[i] = (cuuint64_t)tensor->shape[rank - 1 - i];
    boxes[i] = (cuuint32_t)box[rank - 1 - i];
    element_strides[i] = 1;
  }
  for (int i = 0; i + 1 < rank; ++i)
    strides[i] = (cuuint64_t)(tensor->strides[rank - 2 - i] * elem_size);
  return driver.TensorMapEncodeTiled(
      map, (CUtensorMapDataType)data_type, (cuuint32_t)rank, (void *)(uintptr_t)tensor->value.ptr,
      dims, strides, boxes, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      (CUtensorMapSwizzle)swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

CUresult bsk_launch_kernel(CUfunction function, CUstream stream, const unsigned grid[3],
                           int num_warps, int shared, void **params) {
  return driver.LaunchKernel(function, grid[0], grid[1], grid[2], 32 * (unsigned)num_warps, 1, 1,
                             (unsigned)shared, stream, params, NULL);
}
