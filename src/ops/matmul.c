/* The matmul family on the generic runtime: choose a spec, compute its grid and arguments, launch.
 *
 * Grids, strides, descriptors and token splits are those of the JIT launches
 * (blocksparse/torch/_matmul/launch.py) for the same tile, so that both paths run the same
 * programs; scripts/verify_aot.py checks it on a GPU.  Only the public runtime API is used: the
 * specs are read once from the runtime's table (their keys are the fields of
 * blocksparse/ops/matmul/aot.py), their arguments matched by name. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bsk_message.h"
#include "matmul.h"

static const char *const PRODUCTS[] = {"fprop", "bprop", "updat"};
static const char *const DTYPES[] = {"fp16", "bf16", "fp32"};
static const int ELEM_SIZE[] = {2, 2, 4};

/* Every value a matmul kernel takes, named as the kernels name their parameters. */
enum {
  V_X, V_W, V_Y, V_DY, V_DW, V_HEADERS, V_ENTRIES, V_GROUPS,
  V_N, V_OUT_FEATURES, V_NUM_SEGMENTS, V_TOKENS_PER_SPLIT,
  V_STRIDE_XN, V_STRIDE_XF, V_STRIDE_YN, V_STRIDE_YF, V_STRIDE_DN, V_STRIDE_DF,
  V_X_DESC, V_W_DESC, V_Y_DESC, V_DY_DESC, V_BIAS, V_HAS_BIAS, V_WS, V_COUNTERS, V_OFFSETS, V_COUNT
};
static const char *const VALUE_NAMES[V_COUNT] = {
    "X", "W", "Y", "DY", "DW", "HEADERS", "ENTRIES", "GROUPS",
    "N", "OUT_FEATURES", "num_segments", "tokens_per_split",
    "stride_xn", "stride_xf", "stride_yn", "stride_yf", "stride_dn", "stride_df",
    "x_desc", "w_desc", "y_desc", "dy_desc", "BIAS", "has_bias", "WS", "COUNTERS", "OFFSETS"};

#define MAX_ARGS 32

/* A matmul spec as this file reads it from the runtime's table. */
typedef struct {
  int index, arch, product, dtype, block_size, axis, group, atomic, tma, bm, bk, bn, waves;
  int max_tokens; /* the few-token tiles: calls of at most this many tokens; 0: any */
  int n16;        /* a pointer kernel for token counts that are multiples of 16 */
  int dw16;       /* an updat writing 16-bit dW (the PyTorch plans'; these ops take float32 dW) */
  int ticket;     /* split reductions finished in the kernel (the PyTorch plans'; they need scratch) */
  int pack;       /* the weight's packing (Layout.packing: the PyTorch plans' refined layers); 1 here */
  int nargs, slots[MAX_ARGS]; /* value of each argument (V_*) */
  const char *name;
  const char *problem; /* why it cannot run (a static string), or NULL */
} mm_spec;

static mm_spec *table;
static int table_count;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static int find_index(const char *const *names, int count, const char *text) {
  for (int i = 0; text && i < count; ++i)
    if (!strcmp(names[i], text)) return i;
  return -1;
}

static int int_key(int spec, const char *key, int *out) {
  int64_t value;
  if (!bsk_spec_key(spec, key, &value, NULL)) return 0;
  *out = (int)value;
  return 1;
}

static void read_spec(int index, mm_spec *m) {
  const char *product = NULL, *dtype = NULL;
  memset(m, 0, sizeof(*m));
  m->index = index, m->arch = bsk_spec_arch(index), m->name = bsk_spec_name(index);
  bsk_spec_key(index, "product", NULL, &product);
  bsk_spec_key(index, "dtype", NULL, &dtype);
  m->product = find_index(PRODUCTS, 3, product);
  m->dtype = find_index(DTYPES, 3, dtype);
  if (m->product < 0 || m->dtype < 0 || !int_key(index, "block_size", &m->block_size) ||
      !int_key(index, "axis", &m->axis) || !int_key(index, "group", &m->group) ||
      !int_key(index, "atomic", &m->atomic) || !int_key(index, "tma", &m->tma) ||
      !int_key(index, "bm", &m->bm) || !int_key(index, "bk", &m->bk) || !int_key(index, "bn", &m->bn) ||
      !int_key(index, "waves", &m->waves))
    m->problem = "its keys are not those of blocksparse/ops/matmul/aot.py fields()";
  if (!int_key(index, "max_tokens", &m->max_tokens)) m->max_tokens = 0; /* builds before few-token tiles */
  if (!int_key(index, "n16", &m->n16)) m->n16 = 0;                      /* builds before n16 kernels */
  if (!int_key(index, "dw16", &m->dw16)) m->dw16 = 0;                   /* builds before dw16 kernels */
  if (!int_key(index, "ticket", &m->ticket)) m->ticket = 0;             /* builds before tickets */
  if (!int_key(index, "pack", &m->pack)) m->pack = 1;                   /* builds before packings */
  m->nargs = bsk_spec_nargs(index);
  if (m->nargs > MAX_ARGS) m->problem = "it takes more arguments than src/ops/matmul.c handles";
  for (int i = 0; i < m->nargs && i < MAX_ARGS; ++i) {
    const char *name = NULL;
    bsk_spec_arg(index, i, &name, NULL, NULL, NULL);
    if ((m->slots[i] = find_index(VALUE_NAMES, V_COUNT, name)) < 0)
      m->problem = "its kernel takes an argument src/ops/matmul.c does not know";
  }
}

static void read_table(void) {
  int count = bsk_spec_count(), n = 0;
  for (int i = 0; i < count; ++i) n += !strcmp(bsk_spec_family(i), "matmul");
  table = calloc((size_t)n + 1, sizeof(mm_spec));
  if (!table) return;
  for (int i = 0; i < count; ++i)
    if (!strcmp(bsk_spec_family(i), "matmul")) read_spec(i, &table[table_count++]);
}

static const mm_spec *find(int index) {
  pthread_once(&table_once, read_table);
  for (int i = 0; i < table_count; ++i)
    if (table[i].index == index) return &table[i];
  return NULL;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Whether tensor descriptors can address the activations: (F, N) rows must span a multiple of
 * 16 bytes ((N, F) rows always do: F is a multiple of the block size). */
static int rows_aligned(const bsk_matmul_call *call) {
  return call->axis == 1 || (call->n_tokens * ELEM_SIZE[call->dtype]) % 16 == 0;
}

static int matches(const mm_spec *s, const bsk_matmul_call *call) {
  return s->product == call->product && s->dtype == call->dtype && s->block_size == call->block_size &&
         s->axis == call->axis && s->group == call->group;
}

/* Whether `s` is tuned for the call's token count: a few-token tile for few tokens. */
static int fits(const mm_spec *s, const bsk_matmul_call *call) {
  return !s->max_tokens || call->n_tokens <= s->max_tokens;
}

/* Whether `s` (of rank `rank`, bsk_spec_rank) serves the call better than `best`: a cubin over PTX
 * and the newest arch first, then the few-token tile over the general one, then the TMA kernel
 * over the pointer one, then the pointer kernel for multiples of 16 tokens over the general one. */
static int better(const mm_spec *s, int rank, const mm_spec *best, int best_rank) {
  if (!best || rank != best_rank) return !best || rank > best_rank;
  if (!s->max_tokens != !best->max_tokens) return s->max_tokens != 0;
  if (s->tma != best->tma) return s->tma;
  return s->n16 && !best->n16;
}

int bsk_matmul_select(const bsk_matmul_call *call, int arch, int atomic) {
  if (!call || call->dtype < 0 || call->dtype > BSK_FP32) return -1;
  pthread_once(&table_once, read_table);
  const mm_spec *best = NULL;
  int best_rank = 0;
  for (int i = 0; i < table_count; ++i) {
    const mm_spec *s = &table[i];
    int rank = bsk_spec_rank(s->index, arch);
    if (s->problem || s->dw16 || s->ticket || s->pack != 1 || !matches(s, call) || s->atomic != !!atomic || !rank)
      continue;
    if ((s->tma && !rows_aligned(call)) || (s->n16 && call->n_tokens % 16) || !fits(s, call)) continue;
    if (better(s, rank, best, best_rank)) best = s, best_rank = rank;
  }
  return best ? best->index : -1;
}

int bsk_matmul_updat_split(int spec, int64_t n_tokens, int64_t table_rows, int sms) {
  /* configs.updat_split: about WAVES programs per SM, slices of at least 4 * BK tokens */
  const mm_spec *s = find(spec);
  if (!s || table_rows < 1 || sms < 1) return 1;
  int64_t by_waves = (int64_t)s->waves * sms / table_rows;
  int64_t by_tokens = cdiv(n_tokens, 4 * (int64_t)s->bk);
  int64_t split = by_waves < by_tokens ? by_waves : by_tokens;
  return split < 1 ? 1 : (int)split;
}

/* ---- checks ---------------------------------------------------------------------------- */

static int check_kind(const bsk_matmul_call *call, char *message, size_t size) {
  if (!call) return bsk_fail(message, size, BSK_ERR_INVALID, "call must not be NULL");
  if (call->product < BSK_FPROP || call->product > BSK_UPDAT || call->dtype < BSK_FP16 ||
      call->dtype > BSK_FP32)
    return bsk_fail(message, size, BSK_ERR_INVALID, "unknown product %d or dtype %d", call->product,
                    call->dtype);
  return BSK_OK;
}

static int check_call(const mm_spec *s, const bsk_matmul_call *call, char *message, size_t size) {
  if (s->problem)
    return bsk_fail(message, size, BSK_ERR_INVALID, "spec %s cannot run: %s", s->name, s->problem);
  if (s->ticket)
    return bsk_fail(message, size, BSK_ERR_INVALID,
                    "spec %s finishes split reductions in the kernel: it needs a zeroed workspace, which "
                    "these calls do not give", s->name);
  if (s->pack != 1)
    return bsk_fail(message, size, BSK_ERR_INVALID,
                    "spec %s reads weights packed %d x %d blocks a stored block; these calls pass (blocks, bs, "
                    "bs) weights", s->name, s->pack, s->pack);
  if (!matches(s, call))
    return bsk_fail(message, size, BSK_ERR_INVALID,
                    "specialisation %s serves %s %s bs=%d axis=%d G=%d; the call is %s %s bs=%d "
                    "axis=%d G=%d", s->name, PRODUCTS[s->product], DTYPES[s->dtype], s->block_size,
                    s->axis, s->group, PRODUCTS[call->product], DTYPES[call->dtype],
                    call->block_size, call->axis, call->group);
  if (call->n_tokens < 0 || call->n_tokens > INT32_MAX)
    return bsk_fail(message, size, BSK_ERR_INVALID, "n_tokens must be in [0, 2^31); got %lld",
                    (long long)call->n_tokens);
  int64_t bs = call->block_size;
  if (call->c_blocks < 1 || call->k_blocks < 1 || call->c_blocks * bs > INT32_MAX ||
      call->k_blocks * bs > INT32_MAX)
    return bsk_fail(message, size, BSK_ERR_INVALID,
                    "c_blocks and k_blocks must be >= 1 with C and K below 2^31; got %lld and %lld",
                    (long long)call->c_blocks, (long long)call->k_blocks);
  if (call->blocks < 1 || call->blocks > call->c_blocks * call->k_blocks)
    return bsk_fail(message, size, BSK_ERR_INVALID, "blocks must be in [1, %lld]; got %lld",
                    (long long)(call->c_blocks * call->k_blocks), (long long)call->blocks);
  if (call->table_rows < 1 || call->table_rows > INT32_MAX)
    return bsk_fail(message, size, BSK_ERR_INVALID, "table_rows must be in [1, 2^31); got %lld",
                    (long long)call->table_rows);
  if (s->tma && !rows_aligned(call))
    return bsk_fail(message, size, BSK_ERR_INVALID,
                    "%s uses tensor descriptors: (F, N) rows of %lld tokens are not a multiple of "
                    "16 bytes", s->name, (long long)call->n_tokens);
  if (s->n16 && call->n_tokens % 16)
    return bsk_fail(message, size, BSK_ERR_INVALID,
                    "%s was compiled for multiples of 16 tokens; got %lld", s->name, (long long)call->n_tokens);
  if (s->product == BSK_UPDAT && (call->split < 1 || (!s->atomic && call->split != 1)))
    return bsk_fail(message, size, BSK_ERR_INVALID,
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
      return bsk_fail(message, size, BSK_ERR_INVALID,
                      "%s must be a device address aligned to 16 bytes; got 0x%llx", b->name,
                      (unsigned long long)b->address);
  }
  return BSK_OK;
}

/* ---- values and grids, as blocksparse/torch/_matmul/launch.py computes them --------------- */

static void pointer(bsk_arg *v, uint64_t address) { v->kind = BSK_ARG_PTR, v->value.ptr = address; }
static void i32(bsk_arg *v, int64_t value) { v->kind = BSK_ARG_I32, v->value.i32 = (int32_t)value; }

/* 2-D activations in storage order: (N, F) for axis 1, (F, N) for axis 0 */
static void activations(bsk_arg *t, uint64_t base, int64_t n, int64_t features, int axis) {
  t->kind = BSK_ARG_TENSOR, t->rank = 2, t->value.ptr = base;
  t->shape[0] = axis == 1 ? n : features, t->shape[1] = axis == 1 ? features : n;
  t->strides[0] = t->shape[1], t->strides[1] = 1;
}

/* (token stride, feature stride) of dense activations in either layout */
static void strides(bsk_arg *stride_n, bsk_arg *stride_f, int64_t n, int64_t features, int axis) {
  i32(stride_n, axis == 1 ? features : 1);
  i32(stride_f, axis == 1 ? 1 : n);
}

static void xprop_values(const mm_spec *s, const bsk_matmul_call *call, bsk_arg *v, unsigned grid[3]) {
  int64_t bs = call->block_size, n = call->n_tokens;
  int64_t c = call->c_blocks * bs, k = call->k_blocks * bs;
  int fprop = call->product == BSK_FPROP;
  int64_t in_features = fprop ? c : k, out_features = fprop ? k : c;
  uint64_t in = fprop ? call->x : call->dy, out = fprop ? call->y : call->dx;
  pointer(&v[V_X], in), pointer(&v[V_W], call->w), pointer(&v[V_Y], out);
  pointer(&v[V_HEADERS], call->headers), pointer(&v[V_ENTRIES], call->entries);
  i32(&v[V_N], n), i32(&v[V_OUT_FEATURES], out_features), i32(&v[V_NUM_SEGMENTS], call->table_rows);
  strides(&v[V_STRIDE_XN], &v[V_STRIDE_XF], n, in_features, call->axis);
  strides(&v[V_STRIDE_YN], &v[V_STRIDE_YF], n, out_features, call->axis);
  activations(&v[V_X_DESC], in, n, in_features, call->axis);
  activations(&v[V_Y_DESC], out, n, out_features, call->axis);
  activations(&v[V_W_DESC], call->w, call->blocks * bs, bs, 1);
  pointer(&v[V_BIAS], in), i32(&v[V_HAS_BIAS], 0); /* the TensorFlow ops add no bias in the kernel */
  pointer(&v[V_WS], 0), pointer(&v[V_COUNTERS], 0), pointer(&v[V_OFFSETS], 0); /* no tickets here */
  int64_t programs = call->table_rows * cdiv(n, s->bm) * (bs / s->bn);
  grid[0] = (unsigned)programs, grid[1] = 1, grid[2] = 1;
}

static void updat_values(const mm_spec *s, const bsk_matmul_call *call, bsk_arg *v, unsigned grid[3]) {
  int64_t bs = call->block_size, n = call->n_tokens;
  int64_t c = call->c_blocks * bs, k = call->k_blocks * bs;
  int64_t per_split = cdiv(cdiv(n, call->split), s->bk) * s->bk;
  pointer(&v[V_X], call->x), pointer(&v[V_DY], call->dy), pointer(&v[V_DW], call->dw);
  pointer(&v[V_GROUPS], call->groups);
  i32(&v[V_N], n), i32(&v[V_TOKENS_PER_SPLIT], per_split);
  strides(&v[V_STRIDE_XN], &v[V_STRIDE_XF], n, c, call->axis);
  strides(&v[V_STRIDE_DN], &v[V_STRIDE_DF], n, k, call->axis);
  activations(&v[V_X_DESC], call->x, n, c, call->axis);
  activations(&v[V_DY_DESC], call->dy, n, k, call->axis);
  pointer(&v[V_WS], 0), pointer(&v[V_COUNTERS], 0); /* no tickets here */
  grid[0] = (unsigned)call->table_rows, grid[1] = (unsigned)cdiv(n, per_split), grid[2] = 1;
}

/* ---- running ------------------------------------------------------------------------------ */

static int launch(const mm_spec *s, const bsk_matmul_call *call, void *stream, char *message, size_t size) {
  int status;
  if (s->product == BSK_UPDAT && (s->atomic || call->n_tokens == 0)) {
    /* atomics add into zeros; no tokens: the gradient is zero */
    size_t words = (size_t)call->blocks * call->block_size * call->block_size;
    if ((status = bsk_memset32(call->dw, 0, words, stream, message, size))) return status;
  }
  if (call->n_tokens == 0) return BSK_OK;
  bsk_arg values[V_COUNT], args[MAX_ARGS];
  unsigned grid[3];
  memset(values, 0, sizeof(values));
  if (s->product == BSK_UPDAT) updat_values(s, call, values, grid);
  else xprop_values(s, call, values, grid);
  for (int i = 0; i < s->nargs; ++i) args[i] = values[s->slots[i]];
  return bsk_launch(s->index, grid, args, s->nargs, stream, message, size);
}

int bsk_matmul_run_spec(int index, const bsk_matmul_call *call, void *stream, char *message, size_t size) {
  int status = check_kind(call, message, size);
  if (status) return status;
  const mm_spec *s = find(index);
  if (!s)
    return bsk_fail(message, size, BSK_ERR_INVALID, "no matmul spec %d (this build has %d specs)", index,
                    bsk_spec_count());
  if ((status = check_call(s, call, message, size))) return status;
  return launch(s, call, stream, message, size);
}

static void archs_text(char *out, size_t size) {
  size_t used = 0;
  int seen[16] = {0}, count = 0;
  out[0] = 0;
  for (int i = 0; i < table_count; ++i) {
    int a = table[i].arch, image = bsk_spec_image(table[i].index), known = 0;
    for (int j = 0; j < count; ++j) known |= seen[j] == 4 * a + image;
    if (known || count == 16) continue;
    seen[count++] = 4 * a + image;
    used += (size_t)snprintf(out + used, used < size ? size - used : 0, "%s%s_%d%s", count > 1 ? ", " : "",
                             image == BSK_IMAGE_PTX ? "compute" : "sm", a, image == BSK_IMAGE_CUBIN_EXACT ? "a" : "");
  }
}

int bsk_matmul_run(const bsk_matmul_call *call, void *stream, char *message, size_t size) {
  int status = check_kind(call, message, size);
  if (status) return status;
  int arch = 0, sms = 0;
  if ((status = bsk_device(stream, &arch, &sms, message, size))) return status;
  int index = bsk_matmul_select(call, arch, 0);
  bsk_matmul_call chosen = *call;
  if (index >= 0 && call->product == BSK_UPDAT) {
    if (!chosen.split) chosen.split = bsk_matmul_updat_split(index, call->n_tokens, call->table_rows, sms);
    if (chosen.split > 1) index = bsk_matmul_select(call, arch, 1);
  }
  if (index < 0) {
    char archs[128];
    archs_text(archs, sizeof(archs));
    return bsk_fail(message, size, BSK_ERR_UNSUPPORTED,
                    "no compiled kernel for %s %s block_size=%d axis=%d G=%d on sm_%d (this build "
                    "has kernels for %s)", PRODUCTS[call->product], DTYPES[call->dtype], call->block_size,
                    call->axis, call->group, arch, archs);
  }
  return bsk_matmul_run_spec(index, &chosen, stream, message, size);
}
