/* The runtime: choose a specialisation, compute its grid and arguments, launch.
 *
 * Grids, strides, descriptors and token splits are those of the JIT launchers
 * (blocksparse/torch/_matmul/launch.py) for the same tile configuration, so that both paths run the
 * same programs; scripts/verify_aot.py checks it on a GPU. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bsk_internal.h"

static const char *const PRODUCTS[] = {"fprop", "bprop", "updat"};
static const char *const DTYPES[] = {"fp16", "bf16", "fp32"};
static const int ELEM_SIZE[] = {2, 2, 4};

int bsk_abi_version(void) { return BSK_ABI_VERSION; }
int bsk_spec_count(void) { return bsk_specs_count; }
const char *bsk_manifest(void) { return bsk_manifest_json; }

static int fail(char *message, size_t size, int status, const char *format, ...) {
  if (message && size) {
    va_list args;
    va_start(args, format);
    vsnprintf(message, size, format, args);
    va_end(args);
  }
  return status;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The compiled arch serving a GPU of compute capability `arch`: cubins run on GPUs of the same
 * major version and an equal or newer minor one. */
static int serves(int compiled, int arch) {
  return compiled / 10 == arch / 10 && compiled % 10 <= arch % 10;
}

/* Whether tensor descriptors can address the activations: (F, N) rows must span a multiple of
 * 16 bytes ((N, F) rows always do: F is a multiple of the block size). */
static int rows_aligned(const bsk_call *call) {
  return call->axis == 1 || (call->n_tokens * ELEM_SIZE[call->dtype]) % 16 == 0;
}

static int matches(const bsk_spec *s, const bsk_call *call) {
  return s->product == call->product && s->dtype == call->dtype &&
         s->block_size == call->block_size && s->axis == call->axis && s->group == call->group;
}

int bsk_select(const bsk_call *call, int arch, int atomic) {
  if (!call || call->dtype < 0 || call->dtype > BSK_FP32) return -1;
  int best = -1;
  for (int i = 0; i < bsk_specs_count; ++i) {
    const bsk_spec *s = &bsk_specs[i];
    if (!matches(s, call) || s->atomic != !!atomic || !serves(s->arch, arch)) continue;
    int tma = s->family == BSK_XPROP_TMA || s->family == BSK_UPDAT_TMA;
    if (tma && !rows_aligned(call)) continue;
    if (best < 0) {
      best = i;
      continue;
    }
    const bsk_spec *b = &bsk_specs[best];
    int best_tma = b->family == BSK_XPROP_TMA || b->family == BSK_UPDAT_TMA;
    /* the newest arch first, then the TMA kernel over the pointer one */
    if (s->arch > b->arch || (s->arch == b->arch && tma && !best_tma)) best = i;
  }
  return best;
}

int bsk_updat_split(int spec, int64_t n_tokens, int64_t table_rows, int sms) {
  /* configs.updat_split: about WAVES programs per SM, slices of at least 4 * BK tokens */
  if (spec < 0 || spec >= bsk_specs_count || table_rows < 1 || sms < 1) return 1;
  const bsk_spec *s = &bsk_specs[spec];
  int64_t by_waves = (int64_t)s->waves * sms / table_rows;
  int64_t by_tokens = cdiv(n_tokens, 4 * (int64_t)s->bk);
  int64_t split = by_waves < by_tokens ? by_waves : by_tokens;
  return split < 1 ? 1 : (int)split;
}

/* ---- checks ---------------------------------------------------------------------------- */

static int check_call(const bsk_spec *s, const bsk_call *call, char *message, size_t size) {
  if (!matches(s, call))
    return fail(message, size, BSK_ERR_INVALID,
                "specialisation %s serves %s %s bs=%d axis=%d G=%d; the call is %s %s bs=%d "
                "axis=%d G=%d", s->name, PRODUCTS[s->product], DTYPES[s->dtype], s->block_size,
                s->axis, s->group, PRODUCTS[call->product], DTYPES[call->dtype],
                call->block_size, call->axis, call->group);
  if (call->n_tokens < 0 || call->n_tokens > INT32_MAX)
    return fail(message, size, BSK_ERR_INVALID, "n_tokens must be in [0, 2^31); got %lld",
                (long long)call->n_tokens);
  int64_t bs = call->block_size;
  if (call->c_blocks < 1 || call->k_blocks < 1 || call->c_blocks * bs > INT32_MAX ||
      call->k_blocks * bs > INT32_MAX)
    return fail(message, size, BSK_ERR_INVALID,
                "c_blocks and k_blocks must be >= 1 with C and K below 2^31; got %lld and %lld",
                (long long)call->c_blocks, (long long)call->k_blocks);
  if (call->blocks < 1 || call->blocks > call->c_blocks * call->k_blocks)
    return fail(message, size, BSK_ERR_INVALID, "blocks must be in [1, %lld]; got %lld",
                (long long)(call->c_blocks * call->k_blocks), (long long)call->blocks);
  if (call->table_rows < 1 || call->table_rows > INT32_MAX)
    return fail(message, size, BSK_ERR_INVALID, "table_rows must be in [1, 2^31); got %lld",
                (long long)call->table_rows);
  int tma = s->family == BSK_XPROP_TMA || s->family == BSK_UPDAT_TMA;
  if (tma && !rows_aligned(call))
    return fail(message, size, BSK_ERR_INVALID,
                "%s uses tensor descriptors: (F, N) rows of %lld tokens are not a multiple of "
                "16 bytes", s->name, (long long)call->n_tokens);
  if (s->product == BSK_UPDAT && (call->split < 1 || (!s->atomic && call->split != 1)))
    return fail(message, size, BSK_ERR_INVALID,
                "%s needs split %s; got %d", s->name, s->atomic ? ">= 1" : "== 1", call->split);
  /* the kernels were compiled for 16-byte aligned buffers; empty activations may be NULL */
  typedef struct { const char *name; uint64_t address; int activations; } buffer;
  const buffer buffers[3][5] = {
      {{"x", call->x, 1}, {"y", call->y, 1}, {"w", call->w, 0}, {"headers", call->headers, 0},
       {"entries", call->entries, 0}},
      {{"dy", call->dy, 1}, {"dx", call->dx, 1}, {"w", call->w, 0}, {"headers", call->headers, 0},
       {"entries", call->entries, 0}},
      {{"x", call->x, 1}, {"dy", call->dy, 1}, {"dw", call->dw, 0}, {"groups", call->groups, 0},
       {NULL, 0, 0}}};
  for (const buffer *b = buffers[s->product]; b < buffers[s->product] + 5 && b->name; ++b) {
    int may_be_null = b->activations && call->n_tokens == 0;
    if (b->address % 16 || (!b->address && !may_be_null))
      return fail(message, size, BSK_ERR_INVALID,
                  "%s must be a device address aligned to 16 bytes; got 0x%llx", b->name,
                  (unsigned long long)b->address);
  }
  return BSK_OK;
}

/* ---- modules: one per (context, specialisation), loaded on first use ---------------------- */

#define BSK_MAX_CONTEXTS 64

typedef struct {
  CUcontext context;
  CUfunction *functions; /* bsk_specs_count entries, NULL until loaded */
} bsk_context_cache;

static bsk_context_cache cache[BSK_MAX_CONTEXTS];
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult load_function(const bsk_driver *cu, CUcontext context, int index,
                              CUfunction *out) {
  const bsk_spec *s = &bsk_specs[index];
  CUresult err = CUDA_SUCCESS;
  pthread_mutex_lock(&cache_lock);
  bsk_context_cache *entry = NULL;
  for (int i = 0; i < BSK_MAX_CONTEXTS && !entry; ++i) {
    if (cache[i].context == context) entry = &cache[i];
    else if (!cache[i].context) {
      cache[i].functions = calloc((size_t)bsk_specs_count, sizeof(CUfunction));
      if (!cache[i].functions) {
        err = CUDA_ERROR_OUT_OF_MEMORY;
        goto done;
      }
      cache[i].context = context;
      entry = &cache[i];
    }
  }
  if (!entry) {
    err = CUDA_ERROR_OUT_OF_MEMORY;
    goto done;
  }
  if (!entry->functions[index]) {
    CUmodule module;
    CUfunction function;
    if ((err = cu->ModuleLoadData(&module, s->cubin))) goto done;
    if ((err = cu->ModuleGetFunction(&function, module, s->function))) goto done;
    if (s->shared > 49152) { /* beyond the default 48 KiB: opt in, as Triton's loader does */
      CUdevice device;
      int optin, static_bytes;
      if ((err = cu->CtxGetDevice(&device))) goto done;
      if ((err = cu->DeviceGetAttribute(
               &optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device)))
        goto done;
      if ((err = cu->FuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                      function)))
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
  pthread_mutex_unlock(&cache_lock);
  return err;
}

/* ---- arguments and grids, per family (as blocksparse/torch/_matmul/launch.py) --------------------- */

static bsk_tensor activations(CUdeviceptr base, int64_t n, int64_t features, int axis) {
  bsk_tensor t = {base, {0, 0}, {0, 0}};
  if (axis == 1) {
    t.shape[0] = (int32_t)n, t.shape[1] = (int32_t)features;
    t.strides[0] = features, t.strides[1] = 1;
  } else {
    t.shape[0] = (int32_t)features, t.shape[1] = (int32_t)n;
    t.strides[0] = n, t.strides[1] = 1;
  }
  return t;
}

/* (token stride, feature stride) of activations in either layout */
static void strides(int64_t n, int64_t features, int axis, int32_t *stride_n, int32_t *stride_f) {
  *stride_n = (int32_t)(axis == 1 ? features : 1);
  *stride_f = (int32_t)(axis == 1 ? 1 : n);
}

static void xprop_values(const bsk_spec *s, const bsk_call *call, bsk_values *v,
                         unsigned grid[3]) {
  int64_t bs = call->block_size, n = call->n_tokens;
  int64_t c = call->c_blocks * bs, k = call->k_blocks * bs;
  int fprop = call->product == BSK_FPROP;
  int64_t in_features = fprop ? c : k, out_features = fprop ? k : c;
  CUdeviceptr in = fprop ? call->x : call->dy, out = fprop ? call->y : call->dx;
  v->W = call->w, v->Y = out, v->HEADERS = call->headers, v->ENTRIES = call->entries;
  v->N = (int32_t)n, v->OUT_FEATURES = (int32_t)out_features;
  v->num_segments = (int32_t)call->table_rows;
  strides(n, out_features, call->axis, &v->stride_yn, &v->stride_yf);
  int64_t programs = call->table_rows * cdiv(n, s->bm);
  if (s->family == BSK_XPROP_TMA) {
    v->x_desc = activations(in, n, in_features, call->axis);
    v->y_desc = activations(out, n, out_features, call->axis);
    v->w_desc = activations(call->w, call->blocks * bs, bs, 1);
    programs *= bs / s->bn;
  } else {
    v->X = in;
    strides(n, in_features, call->axis, &v->stride_xn, &v->stride_xf);
  }
  grid[0] = (unsigned)programs, grid[1] = 1, grid[2] = 1;
}

static void updat_values(const bsk_spec *s, const bsk_call *call, bsk_values *v,
                         unsigned grid[3]) {
  int64_t bs = call->block_size, n = call->n_tokens;
  int64_t c = call->c_blocks * bs, k = call->k_blocks * bs;
  int64_t per_split = cdiv(cdiv(n, call->split), s->bk) * s->bk;
  v->DW = call->dw, v->GROUPS = call->groups;
  v->N = (int32_t)n, v->tokens_per_split = (int32_t)per_split;
  if (s->family == BSK_UPDAT_TMA) {
    v->x_desc = activations(call->x, n, c, call->axis);
    v->dy_desc = activations(call->dy, n, k, call->axis);
  } else {
    v->X = call->x, v->DY = call->dy;
    strides(n, c, call->axis, &v->stride_xn, &v->stride_xf);
    strides(n, k, call->axis, &v->stride_dn, &v->stride_df);
  }
  grid[0] = (unsigned)call->table_rows, grid[1] = (unsigned)cdiv(n, per_split), grid[2] = 1;
}

/* ---- running ------------------------------------------------------------------------------ */

static int cuda_fail(char *message, size_t size, const char *what, CUresult err) {
  return fail(message, size, BSK_ERR_CUDA, "%s failed: %s (CUDA error %d)", what,
              bsk_cuda_error(err), (int)err);
}

/* Make the stream's context current; *pushed says whether it must be popped. */
static int enter(const bsk_driver *cu, CUstream stream, int *pushed, char *message, size_t size) {
  CUcontext context = NULL, current = NULL;
  CUresult err;
  *pushed = 0;
  if (cu->StreamGetCtx(stream, &context) != CUDA_SUCCESS || !context) {
    if ((err = cu->CtxGetCurrent(&current))) return cuda_fail(message, size, "cuCtxGetCurrent", err);
    if (!current)
      return fail(message, size, BSK_ERR_CUDA, "no CUDA context: the stream has none and none "
                                               "is current");
    return BSK_OK;
  }
  if ((err = cu->CtxGetCurrent(&current))) return cuda_fail(message, size, "cuCtxGetCurrent", err);
  if (current != context) {
    if ((err = cu->CtxPushCurrent(context))) return cuda_fail(message, size, "cuCtxPushCurrent", err);
    *pushed = 1;
  }
  return BSK_OK;
}

static void leave(const bsk_driver *cu, int pushed) {
  CUcontext popped;
  if (pushed) cu->CtxPopCurrent(&popped);
}

static int launch(const bsk_driver *cu, int index, const bsk_call *call, CUstream stream,
                  char *message, size_t size) {
  const bsk_spec *s = &bsk_specs[index];
  CUresult err;
  CUcontext context;
  if ((err = cu->CtxGetCurrent(&context))) return cuda_fail(message, size, "cuCtxGetCurrent", err);
  if (s->product == BSK_UPDAT && (s->atomic || call->n_tokens == 0)) {
    /* atomics add into zeros; no tokens: the gradient is zero */
    size_t words = (size_t)call->blocks * call->block_size * call->block_size;
    if ((err = cu->MemsetD32Async(call->dw, 0, words, stream)))
      return cuda_fail(message, size, "cuMemsetD32Async", err);
  }
  if (call->n_tokens == 0) return BSK_OK;
  CUfunction function;
  if ((err = load_function(cu, context, index, &function)))
    return fail(message, size, BSK_ERR_CUDA, "loading kernel %s failed: %s (CUDA error %d)",
                s->name, bsk_cuda_error(err), (int)err);
  bsk_values values;
  unsigned grid[3];
  memset(&values, 0, sizeof(values));
  if (s->product == BSK_UPDAT) updat_values(s, call, &values, grid);
  else xprop_values(s, call, &values, grid);
  if ((err = s->launch(function, stream, grid, &values)))
    return fail(message, size, BSK_ERR_CUDA, "launching kernel %s failed: %s (CUDA error %d)",
                s->name, bsk_cuda_error(err), (int)err);
  return BSK_OK;
}

/* Compute capability (10 * major + minor) and SM count of the current context's device. */
static CUresult current_device(const bsk_driver *cu, int *arch, int *sms) {
  CUdevice device;
  int major = 0, minor = 0;
  CUresult err = cu->CtxGetDevice(&device);
  if (!err) err = cu->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  if (!err) err = cu->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  if (!err) err = cu->DeviceGetAttribute(sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
  *arch = 10 * major + minor;
  return err;
}

static int check_kind(const bsk_call *call, char *message, size_t size) {
  if (!call) return fail(message, size, BSK_ERR_INVALID, "call must not be NULL");
  if (call->product < BSK_FPROP || call->product > BSK_UPDAT || call->dtype < BSK_FP16 ||
      call->dtype > BSK_FP32)
    return fail(message, size, BSK_ERR_INVALID, "unknown product %d or dtype %d", call->product,
                call->dtype);
  return BSK_OK;
}

/* The driver, the stream's context entered (leave() it after), and its device's arch / SMs. */
static int open_device(void *stream, const bsk_driver **cu, int *pushed, int *arch, int *sms,
                       char *message, size_t size) {
  const char *why = NULL;
  *cu = bsk_driver_get(&why);
  if (!*cu) return fail(message, size, BSK_ERR_DRIVER, "%s", why);
  int status = enter(*cu, (CUstream)stream, pushed, message, size);
  if (status) return status;
  CUresult err = current_device(*cu, arch, sms);
  if (err) {
    leave(*cu, *pushed);
    return cuda_fail(message, size, "querying the device", err);
  }
  return BSK_OK;
}

/* Launch a checked specialisation in an entered context of a device of `arch`. */
static int run_opened(const bsk_driver *cu, int index, const bsk_call *call, void *stream, int arch,
                      char *message, size_t size) {
  if (!serves(bsk_specs[index].arch, arch))
    return fail(message, size, BSK_ERR_UNSUPPORTED, "%s was compiled for sm_%d; this GPU is sm_%d",
                bsk_specs[index].name, bsk_specs[index].arch, arch);
  return launch(cu, index, call, (CUstream)stream, message, size);
}

int bsk_run_spec(int index, const bsk_call *call, void *stream, char *message, size_t size) {
  int status = check_kind(call, message, size);
  if (status) return status;
  if (index < 0 || index >= bsk_specs_count)
    return fail(message, size, BSK_ERR_INVALID, "no specialisation %d (this build has %d)", index,
                bsk_specs_count);
  if ((status = check_call(&bsk_specs[index], call, message, size))) return status;
  const bsk_driver *cu;
  int pushed, arch = 0, sms = 0;
  if ((status = open_device(stream, &cu, &pushed, &arch, &sms, message, size))) return status;
  status = run_opened(cu, index, call, stream, arch, message, size);
  leave(cu, pushed);
  return status;
}

static int archs_text(char *out, size_t size) {
  size_t used = 0;
  int seen[16] = {0}, count = 0;
  out[0] = 0;
  for (int i = 0; i < bsk_specs_count; ++i) {
    int a = bsk_specs[i].arch, known = 0;
    for (int j = 0; j < count; ++j) known |= seen[j] == a;
    if (known || count == 16) continue;
    seen[count++] = a;
    used += (size_t)snprintf(out + used, used < size ? size - used : 0, "%ssm_%d",
                             count > 1 ? ", " : "", a);
  }
  return count;
}

int bsk_run(const bsk_call *call, void *stream, char *message, size_t size) {
  int status = check_kind(call, message, size);
  if (status) return status;
  const bsk_driver *cu;
  int pushed, arch = 0, sms = 0;
  if ((status = open_device(stream, &cu, &pushed, &arch, &sms, message, size))) return status;
  int index = bsk_select(call, arch, 0);
  bsk_call chosen = *call;
  if (index >= 0 && call->product == BSK_UPDAT) {
    if (!chosen.split) chosen.split = bsk_updat_split(index, call->n_tokens, call->table_rows, sms);
    if (chosen.split > 1) index = bsk_select(call, arch, 1);
  }
  if (index < 0) {
    char archs[128];
    archs_text(archs, sizeof(archs));
    status = fail(message, size, BSK_ERR_UNSUPPORTED,
                  "no compiled kernel for %s %s block_size=%d axis=%d G=%d on sm_%d (this build "
                  "has kernels for %s)", PRODUCTS[call->product], DTYPES[call->dtype],
                  call->block_size, call->axis, call->group, arch, archs);
  } else if (!(status = check_call(&bsk_specs[index], &chosen, message, size))) {
    status = run_opened(cu, index, &chosen, stream, arch, message, size);
  }
  leave(cu, pushed);
  return status;
}
