/* The runtime: spec queries, argument checks, a module cache per CUDA context, launches.
 *
 * Family-neutral: what a spec's arguments mean is its family's business (the PyTorch frontend's
 * launch plans, or a family's C file such as src/ops/matmul.c); this file only checks them
 * against what the spec was compiled for and hands them to the spec's generated launcher. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bsk_internal.h"
#include "bsk_message.h"

int bsk_abi_version(void) { return BSK_ABI_VERSION; }
int bsk_spec_count(void) { return bsk_specs_count; }
const char *bsk_manifest(void) { return bsk_manifest_json; }

static const bsk_spec *spec_at(int index) {
  return index >= 0 && index < bsk_specs_count ? &bsk_specs[index] : NULL;
}

const char *bsk_spec_name(int index) { return spec_at(index) ? bsk_specs[index].name : NULL; }
const char *bsk_spec_family(int index) { return spec_at(index) ? bsk_specs[index].family : NULL; }
int bsk_spec_arch(int index) { return spec_at(index) ? bsk_specs[index].arch : -1; }
int bsk_spec_image(int index) { return spec_at(index) ? bsk_specs[index].image : -1; }
int bsk_spec_nargs(int index) { return spec_at(index) ? bsk_specs[index].nparams : -1; }

int bsk_spec_arg(int index, int i, const char **name, int *kind, int *rank, int *divisible) {
  const bsk_spec *s = spec_at(index);
  if (!s || i < 0 || i >= s->nparams) return 0;
  const bsk_param *p = &s->params[i];
  if (name) *name = p->name;
  if (kind) *kind = p->kind;
  if (rank) *rank = p->rank;
  if (divisible) *divisible = p->divisible;
  return 1;
}

int bsk_spec_key(int index, const char *key, int64_t *value, const char **text) {
  const bsk_spec *s = spec_at(index);
  if (!s || !key) return 0;
  for (int i = 0; i < s->nkeys; ++i) {
    if (strcmp(s->keys[i].name, key)) continue;
    if (value) *value = s->keys[i].value;
    if (text) *text = s->keys[i].text;
    return 1;
  }
  return 0;
}

int bsk_arch_rank(int compiled, int image, int arch) {
  switch (image) {
    case BSK_IMAGE_PTX: return compiled <= arch ? compiled : 0;
    case BSK_IMAGE_CUBIN_EXACT: return compiled == arch ? 1000 + compiled : 0;
    case BSK_IMAGE_CUBIN:
      return compiled / 10 == arch / 10 && compiled % 10 <= arch % 10 ? 1000 + compiled : 0;
    default: return 0;
  }
}

int bsk_arch_shared_limit(int arch) {
  switch (arch) {
    case 80: case 87: return 163 * 1024;
    case 90: case 100: case 103: return 227 * 1024;
    default: return 99 * 1024; /* 8.6, 8.9, 12.x, and what this table does not know */
  }
}

int bsk_spec_rank(int index, int arch) {
  const bsk_spec *s = spec_at(index);
  return s && s->shared <= bsk_arch_shared_limit(arch) ? bsk_arch_rank(s->arch, s->image, arch) : 0;
}

static int cuda_fail(char *message, size_t size, const char *what, CUresult err) {
  return bsk_fail(message, size, BSK_ERR_CUDA, "%s failed: %s (CUDA error %d)", what,
                  bsk_cuda_error(err), (int)err);
}

/* ---- checks: what every launch of a spec must satisfy ------------------------------------- */

static const char *const KIND_NAMES[] = {"?", "pointer", "i32", "i64", "f32", "tensor"};

static const char *kind_name(int kind) {
  return kind >= BSK_ARG_PTR && kind <= BSK_ARG_TENSOR ? KIND_NAMES[kind] : KIND_NAMES[0];
}

static int check_args(const bsk_spec *s, const unsigned grid[3], const bsk_arg *args, int nargs,
                      char *message, size_t size) {
  if (!grid) return bsk_fail(message, size, BSK_ERR_INVALID, "grid must not be NULL");
  if (nargs != s->nparams)
    return bsk_fail(message, size, BSK_ERR_INVALID, "%s/%s takes %d arguments; got %d", s->family, s->name,
                    s->nparams, nargs);
  if (nargs && !args) return bsk_fail(message, size, BSK_ERR_INVALID, "args must not be NULL");
  for (int i = 0; i < nargs; ++i) {
    const bsk_param *p = &s->params[i];
    const bsk_arg *a = &args[i];
    if (a->kind != p->kind)
      return bsk_fail(message, size, BSK_ERR_INVALID, "%s/%s: argument %d (%s) must be a %s; got kind %d (%s)",
                      s->family, s->name, i, p->name, kind_name(p->kind), a->kind, kind_name(a->kind));
    uint64_t bits = 0;
    switch (p->kind) {
      case BSK_ARG_PTR: bits = a->value.ptr; break;
      case BSK_ARG_I32: bits = (uint64_t)(int64_t)a->value.i32; break;
      case BSK_ARG_I64: bits = (uint64_t)a->value.i64; break;
      case BSK_ARG_TENSOR:
        if (a->rank != p->rank)
          return bsk_fail(message, size, BSK_ERR_INVALID, "%s/%s: tensor %s must have %d dimensions; got %d",
                          s->family, s->name, p->name, p->rank, a->rank);
        for (int d = 0; d < a->rank; ++d)
          if (a->shape[d] < 0 || a->shape[d] > INT32_MAX || a->strides[d] < 0)
            return bsk_fail(message, size, BSK_ERR_INVALID,
                            "%s/%s: tensor %s has shape[%d] = %lld and strides[%d] = %lld; shapes must be "
                            "in [0, 2^31) and strides >= 0", s->family, s->name, p->name, d,
                            (long long)a->shape[d], d, (long long)a->strides[d]);
        if (a->strides[a->rank - 1] != 1)
          return bsk_fail(message, size, BSK_ERR_INVALID,
                          "%s/%s: tensor %s must have an innermost stride of 1; got %lld", s->family, s->name,
                          p->name, (long long)a->strides[a->rank - 1]);
        bits = a->value.ptr;
        break;
      default: break;
    }
    /* the kernel was compiled assuming these are multiples of 16: anything else is wrong answers */
    if (p->divisible && bits % 16)
      return bsk_fail(message, size, BSK_ERR_INVALID,
                      "%s/%s: %s must be %s 16; got %s0x%llx", s->family, s->name, p->name,
                      p->kind == BSK_ARG_PTR ? "a device address aligned to" : "a multiple of",
                      p->kind == BSK_ARG_PTR ? "" : "value ", (unsigned long long)bits);
  }
  return BSK_OK;
}

/* ---- contexts: entered per call; modules and device properties cached per context ----------- */

#define BSK_MAX_CONTEXTS 64

typedef struct {
  CUcontext context;
  int arch, sms, shared_optin; /* shared_optin: the device's opt-in shared memory per block */
  CUfunction *functions; /* bsk_specs_count entries, NULL until loaded */
} bsk_context;

static bsk_context contexts[BSK_MAX_CONTEXTS];
static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;

/* The cache entry of the current context (created on first use, with its device's properties). */
static int context_entry(const bsk_driver *cu, bsk_context **out, char *message, size_t size) {
  CUcontext context;
  CUresult err = cu->CtxGetCurrent(&context);
  if (err) return cuda_fail(message, size, "cuCtxGetCurrent", err);
  int status = BSK_OK;
  pthread_mutex_lock(&contexts_lock);
  bsk_context *entry = NULL;
  for (int i = 0; i < BSK_MAX_CONTEXTS && !entry; ++i) {
    if (contexts[i].context == context) {
      entry = &contexts[i];
    } else if (!contexts[i].context) {
      CUdevice device;
      int major = 0, minor = 0, sms = 0, optin = 0;
      if ((err = cu->CtxGetDevice(&device)) ||
          (err = cu->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)) ||
          (err = cu->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)) ||
          (err = cu->DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)) ||
          (err = cu->DeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device))) {
        status = cuda_fail(message, size, "querying the device", err);
        break;
      }
      CUfunction *functions = calloc((size_t)bsk_specs_count + 1, sizeof(CUfunction));
      if (!functions) {
        status = bsk_fail(message, size, BSK_ERR_CUDA, "out of host memory");
        break;
      }
      contexts[i] = (bsk_context){context, 10 * major + minor, sms, optin, functions};
      entry = &contexts[i];
    }
  }
  if (!entry && !status)
    status = bsk_fail(message, size, BSK_ERR_CUDA, "more than %d CUDA contexts", BSK_MAX_CONTEXTS);
  pthread_mutex_unlock(&contexts_lock);
  *out = entry;
  return status;
}

/* The function of spec `index` in `entry`'s context, loaded on first use. */
static CUresult load_function(const bsk_driver *cu, bsk_context *entry, int index, CUfunction *out) {
  const bsk_spec *s = &bsk_specs[index];
  CUresult err = CUDA_SUCCESS;
  pthread_mutex_lock(&contexts_lock);
  if (!entry->functions[index]) {
    CUmodule module;
    CUfunction function;
    if ((err = cu->ModuleLoadData(&module, s->cubin))) goto done;
    if ((err = cu->ModuleGetFunction(&function, module, s->function))) goto done;
    if (s->shared > 49152) { /* beyond the default 48 KiB: opt in, as Triton's loader does */
      CUdevice device;
      int optin, static_bytes;
      if ((err = cu->CtxGetDevice(&device))) goto done;
      if ((err = cu->DeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                        device)))
        goto done;
      if ((err = cu->FuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function)))
        goto done;
      if ((err = cu->FuncSetCacheConfig(function, CU_FUNC_CACHE_PREFER_SHARED))) goto done;
      if ((err = cu->FuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      optin - static_bytes)))
        goto done;
    }
    entry->functions[index] = function;
  }
  *out = entry->functions[index];
done:
  pthread_mutex_unlock(&contexts_lock);
  return err;
}

/* The primary context of the device holding `address` (retained once per device, never
 * released: it lives as long as the process, as the frameworks' own use of it). */
static CUresult primary_context(const bsk_driver *cu, uint64_t address, CUcontext *out) {
  static CUcontext primaries[BSK_MAX_CONTEXTS];
  int ordinal = -1;
  CUdevice device;
  CUresult err = cu->PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)address);
  if (err) return err;
  if (ordinal < 0 || ordinal >= BSK_MAX_CONTEXTS) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&contexts_lock);
  if (!primaries[ordinal] && !(err = cu->DeviceGet(&device, ordinal)))
    err = cu->DevicePrimaryCtxRetain(&primaries[ordinal], device);
  *out = primaries[ordinal];
  pthread_mutex_unlock(&contexts_lock);
  return err;
}

/* Make the launch's context current (*pushed: it must be popped), return its cache entry: the
 * stream's context; for the legacy default stream (NULL) the current one, or -- on a thread that
 * has none current, e.g. a framework's autograd worker -- the primary context of the device
 * holding `address` (an operand; 0: none). */
static int enter(void *stream, uint64_t address, const bsk_driver **cu, int *pushed, bsk_context **entry,
                 char *message, size_t size) {
  const char *why = NULL;
  *pushed = 0;
  *cu = bsk_driver_get(&why);
  if (!*cu) return bsk_fail(message, size, BSK_ERR_DRIVER, "%s", why);
  CUcontext context = NULL, current = NULL;
  CUresult err;
  if ((err = (*cu)->CtxGetCurrent(&current))) return cuda_fail(message, size, "cuCtxGetCurrent", err);
  if (stream && (*cu)->StreamGetCtx((CUstream)stream, &context) == CUDA_SUCCESS && context) {
    /* the stream's context */
  } else if (current) {
    context = current;
  } else if (!address) {
    return bsk_fail(message, size, BSK_ERR_CUDA, "no CUDA context: the stream has none, none is current "
                    "and the launch has no device address to take one from");
  } else if ((err = primary_context(*cu, address, &context))) {
    return cuda_fail(message, size, "no CUDA context is current; retaining the operand's device's primary "
                     "context", err);
  }
  if (current != context) {
    if ((err = (*cu)->CtxPushCurrent(context))) return cuda_fail(message, size, "cuCtxPushCurrent", err);
    *pushed = 1;
  }
  int status = context_entry(*cu, entry, message, size);
  if (status && *pushed) {
    CUcontext popped;
    (*cu)->CtxPopCurrent(&popped);
    *pushed = 0;
  }
  return status;
}

/* The first device address among a launch's arguments (0: none). */
static uint64_t first_address(const bsk_arg *args, int nargs) {
  for (int i = 0; i < nargs; ++i)
    if ((args[i].kind == BSK_ARG_PTR || args[i].kind == BSK_ARG_TENSOR) && args[i].value.ptr)
      return args[i].value.ptr;
  return 0;
}

static void leave(const bsk_driver *cu, int pushed) {
  CUcontext popped;
  if (pushed) cu->CtxPopCurrent(&popped);
}

int bsk_device(void *stream, int *arch, int *sms, char *message, size_t size) {
  return bsk_device_at(stream, 0, arch, sms, message, size);
}

int bsk_device_at(void *stream, uint64_t address, int *arch, int *sms, char *message, size_t size) {
  const bsk_driver *cu;
  bsk_context *entry;
  int pushed;
  int status = enter(stream, address, &cu, &pushed, &entry, message, size);
  if (status) return status;
  if (arch) *arch = entry->arch;
  if (sms) *sms = entry->sms;
  leave(cu, pushed);
  return BSK_OK;
}

int bsk_launch(int index, const unsigned grid[3], const bsk_arg *args, int nargs, void *stream,
               char *message, size_t size) {
  const bsk_spec *s = spec_at(index);
  if (!s)
    return bsk_fail(message, size, BSK_ERR_INVALID, "no spec %d (this build has %d)", index, bsk_specs_count);
  int status = check_args(s, grid, args, nargs, message, size);
  if (status) return status;
  if (!grid[0] || !grid[1] || !grid[2]) return BSK_OK;
  const bsk_driver *cu;
  bsk_context *entry;
  int pushed;
  if ((status = enter(stream, first_address(args, nargs), &cu, &pushed, &entry, message, size))) return status;
  CUfunction function;
  CUresult err;
  if (!bsk_arch_rank(s->arch, s->image, entry->arch)) {
    status = bsk_fail(message, size, BSK_ERR_UNSUPPORTED, "%s/%s was compiled for %s_%d%s; this GPU is sm_%d",
                      s->family, s->name, s->image == BSK_IMAGE_PTX ? "compute" : "sm", s->arch,
                      s->image == BSK_IMAGE_CUBIN_EXACT ? "a" : "", entry->arch);
  } else if (s->shared > entry->shared_optin) {
    status = bsk_fail(message, size, BSK_ERR_UNSUPPORTED,
                      "%s/%s needs %d bytes of shared memory per block; this GPU (sm_%d) offers %d", s->family,
                      s->name, s->shared, entry->arch, entry->shared_optin);
  } else if ((err = load_function(cu, entry, index, &function))) {
    status = bsk_fail(message, size, BSK_ERR_CUDA, "loading kernel %s/%s failed: %s (CUDA error %d)", s->family,
                      s->name, bsk_cuda_error(err), (int)err);
  } else if ((err = s->launch(function, (CUstream)stream, grid, args))) {
    status = bsk_fail(message, size, BSK_ERR_CUDA, "launching kernel %s/%s failed: %s (CUDA error %d)",
                      s->family, s->name, bsk_cuda_error(err), (int)err);
  }
  leave(cu, pushed);
  return status;
}

int bsk_memset32(uint64_t address, uint32_t value, size_t count, void *stream, char *message,
                 size_t size) {
  if (!count) return BSK_OK;
  if (!address || address % 4)
    return bsk_fail(message, size, BSK_ERR_INVALID, "address must be a device address aligned to 4 bytes; "
                    "got 0x%llx", (unsigned long long)address);
  const bsk_driver *cu;
  bsk_context *entry;
  int pushed;
  int status = enter(stream, address, &cu, &pushed, &entry, message, size);
  if (status) return status;
  CUresult err = cu->MemsetD32Async((CUdeviceptr)address, value, count, (CUstream)stream);
  leave(cu, pushed);
  return err ? cuda_fail(message, size, "cuMemsetD32Async", err) : BSK_OK;
}

int bsk_upload(uint64_t address, const void *source, size_t bytes, void *stream, char *message, size_t size) {
  if (!bytes) return BSK_OK;
  if (!address || !source)
    return bsk_fail(message, size, BSK_ERR_INVALID, "address and source must not be NULL; got 0x%llx and %p",
                    (unsigned long long)address, source);
  const bsk_driver *cu;
  bsk_context *entry;
  int pushed;
  int status = enter(stream, address, &cu, &pushed, &entry, message, size);
  if (status) return status;
  CUresult err = cu->MemcpyHtoDAsync((CUdeviceptr)address, source, bytes, (CUstream)stream);
  leave(cu, pushed);
  return err ? cuda_fail(message, size, "cuMemcpyHtoDAsync", err) : BSK_OK;
}
