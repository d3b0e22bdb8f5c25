/* The norms family on the generic runtime: layer norm's spec selection, grids and arguments, as
 * blocksparse/torch/_norms/launch.py computes them for the same tile.  Specs are read once from
 * the runtime's table (their keys are the fields of blocksparse/ops/norms/aot.py). */
#include <pthread.h>
#include <stdlib.h>

#include "bsk_message.h"
#include "norms.h"
#include "spec_args.h"
#include "sum_rows.h"

/* The one-launch forward and backward, the two kernels of the split backward
 * (blocksparse/ops/norms/split_bwd.py) and the three of the split forward (split_fwd.py). */
enum { P_FWD, P_BWD, P_PART, P_DX, P_STATS, P_MERGE, P_APPLY, P_COUNT };
static const char *const PRODUCTS[P_COUNT] = {"fwd", "bwd", "bwd_part", "bwd_dx", "fwd_stats", "fwd_merge",
                                              "fwd_apply"};
static const char *const DTYPES[] = {"fp16", "bf16", "fp32"};

enum {
  V_X, V_G, V_B, V_Y, V_MEAN, V_RSTD, V_DY, V_DX, V_DG_PART, V_DB_PART, V_N, V_CS, V_EPSILON,
  V_STRIDE_XN, V_STRIDE_XF, V_STRIDE_YN, V_STRIDE_YF, V_STRIDE_DYN, V_STRIDE_DYF, V_STRIDE_DXN, V_STRIDE_DXF,
  V_C1_PART, V_C2_PART, V_FS, V_PART, V_COUNT
};
static const char *const VALUE_NAMES[V_COUNT] = {
    "X", "G", "B", "Y", "MEAN", "RSTD", "DY", "DX", "DG_PART", "DB_PART", "N", "CS", "epsilon",
    "stride_xn", "stride_xf", "stride_yn", "stride_yf", "stride_dyn", "stride_dyf", "stride_dxn", "stride_dxf",
    "C1_PART", "C2_PART", "FS", "PART"};

typedef struct {
  bsk_ops_args args;
  int product, dtype, param, axis, aligned, relu, one_chunk, bn, bc, programs_per_sm, fs, min_fs;
  int64_t min_elements;
} ln_spec;

/* What runs a call: one kernel, the split backward's two (dx not NULL: spec computes the partial
 * sums) or the split forward's three (apply not NULL: spec computes the slices' statistics). */
typedef struct {
  const ln_spec *spec, *dx, *merge, *apply;
} ln_plan;

static ln_spec *table;
static int table_count;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void read_spec(int index, ln_spec *s) {
  bsk_ops_read_args(index, VALUE_NAMES, V_COUNT, &s->args);
  s->product = bsk_ops_text(index, "product", PRODUCTS, P_COUNT);
  s->dtype = bsk_ops_text(index, "dtype", DTYPES, 3);
  s->param = bsk_ops_text(index, "param", DTYPES, 3);
  if (s->product < 0 || s->dtype < 0 || s->param < 0 || !bsk_ops_int(index, "axis", &s->axis) ||
      !bsk_ops_int(index, "aligned", &s->aligned) || !bsk_ops_int(index, "relu", &s->relu) ||
      !bsk_ops_int(index, "one_chunk", &s->one_chunk) || !bsk_ops_int(index, "bn", &s->bn) ||
      !bsk_ops_int(index, "bc", &s->bc) || !bsk_ops_int(index, "programs_per_sm", &s->programs_per_sm) ||
      !bsk_ops_int(index, "fs", &s->fs) || !bsk_ops_int(index, "min_fs", &s->min_fs) ||
      !bsk_spec_key(index, "min_elements", &s->min_elements, NULL))
    s->args.problem = "its keys are not those of blocksparse/ops/norms/aot.py fields()";
}

static void read_table(void) {
  int count = bsk_spec_count(), n = 0;
  for (int i = 0; i < count; ++i) n += bsk_ops_is_kernel(i, "norms");
  table = calloc((size_t)n + 1, sizeof(ln_spec));
  if (!table) return;
  for (int i = 0; i < count; ++i)
    if (bsk_ops_is_kernel(i, "norms")) read_spec(i, &table[table_count++]);
}

static int64_t segment_features(const bsk_layer_norm_call *call) { return call->features / call->segments; }

/* Whether spec `s` (of rank `rank` on the GPU) is better for the call than `best` (both serve it):
 * the runtime's rank, then vector loads, then the narrowest tile holding a segment whole, else the
 * chunked tile. */
static int better(const ln_spec *s, int rank, const ln_spec *best, int best_rank) {
  if (!best) return 1;
  if (rank != best_rank) return rank > best_rank;
  if (s->aligned != best->aligned) return s->aligned;
  if (s->one_chunk != best->one_chunk) return s->one_chunk;
  return s->bc < best->bc;
}

/* What selects a spec, and the one selected: each thread remembers its last choice per direction
 * (an eager training loop asks about the same shapes at every step, and a pass over the table
 * costs microseconds). */
typedef struct {
  int valid, dtype, params, axis, relu, segments, rows_aligned, arch;
  int64_t features, n_tokens;
  ln_plan plan;
} ln_choice;
static _Thread_local ln_choice last_choice[2];

static int same_choice(const ln_choice *c, const bsk_layer_norm_call *call, int rows_aligned, int arch) {
  return c->valid && c->dtype == call->dtype && c->params == !!call->params && c->axis == call->axis &&
         c->relu == !!call->relu && c->segments == call->segments && c->features == call->features &&
         c->n_tokens == call->n_tokens && c->rows_aligned == rows_aligned && c->arch == arch;
}

static ln_plan scan_plan(const bsk_layer_norm_call *call, int backward, int arch, int rows_aligned);

static ln_plan choose(const bsk_layer_norm_call *call, int backward, int arch) {
  const ln_plan none = {NULL, NULL, NULL, NULL};
  if (!call || call->dtype < BSK_FP16 || call->dtype > BSK_FP32 || call->segments < 1 || call->features < 1 ||
      call->features % call->segments)
    return none;
  /* (N, C) specs assume rows of a multiple of 16 features.  "Aligned" specs also a multiple of 16
   * along the contiguous axis -- segments of (N, C), tokens of (C, N) -- where their loads are
   * vectors. */
  if (call->axis == 1 && call->features % 16) return none;
  int rows_aligned = (call->axis == 1 ? segment_features(call) : call->n_tokens) % 16 == 0;
  ln_choice *last = &last_choice[!!backward];
  if (!same_choice(last, call, rows_aligned, arch)) {
    ln_choice c = {1, call->dtype, !!call->params, call->axis, !!call->relu, call->segments, rows_aligned, arch,
                   call->features, call->n_tokens, scan_plan(call, backward, arch, rows_aligned)};
    *last = c;
  }
  return last->plan;
}

static const ln_spec *scan(const bsk_layer_norm_call *call, int product, int arch, int rows_aligned) {
  pthread_once(&table_once, read_table);
  const ln_spec *best = NULL;
  /* the split forward's statistics serve every relu and parameter dtype (compiled once) */
  const int generic = product == P_STATS || product == P_MERGE;
  int best_rank = 0, param = generic ? BSK_FP32 : call->params ? call->dtype : BSK_FP32, relu = generic ? 0 : !!call->relu;
  for (int i = 0; i < table_count; ++i) {
    const ln_spec *s = &table[i];
    int rank = bsk_ops_rank(s->args.index, arch);
    if (s->args.problem || s->product != product || s->dtype != call->dtype || s->param != param ||
        s->axis != call->axis || s->relu != relu || !rank)
      continue;
    if ((s->aligned && !rows_aligned) || (s->one_chunk && s->bc < segment_features(call)))
      continue;
    if (better(s, rank, best, best_rank)) best = s, best_rank = rank;
  }
  return best;
}

/* Whether the split forward's partial statistics (float32 (mean, M2) per token and slice, at most
 * C / min_fs slices a segment) fit in y, where they are staged. */
static int partials_fit(const ln_spec *stats, const bsk_layer_norm_call *call) {
  const int64_t slices = bsk_ops_cdiv(segment_features(call), stats->min_fs);
  return 8 * call->segments * slices <= call->features * (call->dtype == BSK_FP32 ? 4 : 2);
}

/* The backward of segments no one-chunk tile holds takes the split backward where both its kernels
 * serve the call (aligned (C, N) activations), as blocksparse/ops/norms/configs.py's
 * split_backward_config decides; the forward of such segments the split forward where its three
 * kernels serve the call and it holds min_elements tokens x segment features (split_forward_config). */
static ln_plan scan_plan(const bsk_layer_norm_call *call, int backward, int arch, int rows_aligned) {
  ln_plan plan = {scan(call, backward ? P_BWD : P_FWD, arch, rows_aligned), NULL, NULL, NULL};
  if (plan.spec && plan.spec->one_chunk) return plan;
  if (backward) {
    const ln_spec *part = scan(call, P_PART, arch, rows_aligned), *dx = scan(call, P_DX, arch, rows_aligned);
    if (part && dx) plan.spec = part, plan.dx = dx;
  } else {
    const ln_spec *stats = scan(call, P_STATS, arch, rows_aligned), *merge = scan(call, P_MERGE, arch, rows_aligned),
                  *apply = scan(call, P_APPLY, arch, rows_aligned);
    if (stats && merge && apply && call->n_tokens * segment_features(call) >= stats->min_elements &&
        partials_fit(stats, call))
      plan.spec = stats, plan.merge = merge, plan.apply = apply;
  }
  return plan;
}

int bsk_layer_norm_select(const bsk_layer_norm_call *call, int backward, int arch) {
  const ln_spec *s = choose(call, backward, arch).spec;
  return s ? s->args.index : -1;
}

/* ---- values and grids, as blocksparse/torch/_norms/launch.py computes them ----------------- */

static void strides(bsk_arg *stride_n, bsk_arg *stride_f, const bsk_layer_norm_call *call) {
  bsk_ops_i32(stride_n, call->axis == 1 ? call->features : 1);
  bsk_ops_i32(stride_f, call->axis == 1 ? 1 : call->n_tokens);
}

/* Programs per segment: one per token tile, or (programs_per_sm > 0) at most that many per SM,
 * each taking every P-th tile. */
static int64_t programs(const ln_spec *s, const bsk_layer_norm_call *call, int sms) {
  int64_t tiles = bsk_ops_cdiv(call->n_tokens, s->bn);
  if (s->programs_per_sm <= 0) return tiles < 1 ? 1 : tiles;
  int64_t by_sms = (int64_t)s->programs_per_sm * sms / call->segments;
  int64_t programs = tiles < by_sms ? tiles : by_sms;
  return programs < 1 ? 1 : programs;
}

/* One partial buffer (programs, C) of float32, rounded up to keep the second one aligned. */
static size_t part_bytes(int64_t programs, const bsk_layer_norm_call *call) {
  return ((size_t)programs * (size_t)call->features * 4 + 15) / 16 * 16;
}

/* The split backward's grid: token tiles, slices of a segment's features (halved from fs, down to
 * min_fs, until the grid holds programs_per_sm programs a SM: SplitConfig.slice_features), segments. */
typedef struct {
  int64_t tiles, fs, slices;
} ln_split;

static ln_split split_grid(const ln_spec *s, const bsk_layer_norm_call *call, int sms) {
  ln_split g = {bsk_ops_cdiv(call->n_tokens, s->bn), s->fs, 0};
  const int64_t cs = segment_features(call), tiles = g.tiles * call->segments;
  while (g.fs > s->min_fs && tiles * bsk_ops_cdiv(cs, g.fs) < (int64_t)s->programs_per_sm * sms) g.fs /= 2;
  while (bsk_ops_cdiv(cs, g.fs) > 65535) g.fs *= 2; /* the slices are the grid's y (MAX_GRID_Y) */
  g.slices = bsk_ops_cdiv(cs, g.fs);
  return g;
}

/* The split backward's float32 (segments * slices, N) partial c1 and c2, rounded up like part_bytes. */
static size_t stats_bytes(const ln_split *g, const bsk_layer_norm_call *call) {
  return ((size_t)call->segments * (size_t)g->slices * (size_t)call->n_tokens * 4 + 15) / 16 * 16;
}

static int device_spec(const bsk_layer_norm_call *call, int backward, void *stream, ln_plan *plan, int *arch,
                       int *sms, char *message, size_t size) {
  /* x's address: the context of its GPU where the thread has none (PyTorch's autograd worker) */
  int status = bsk_device_at(stream, call ? call->x : 0, arch, sms, message, size);
  if (status) return status;
  *plan = choose(call, backward, *arch);
  if (!plan->spec)
    return bsk_fail(message, size, BSK_ERR_UNSUPPORTED,
                    "no compiled layer_norm %s kernel for dtype %d axis=%d relu=%d C=%lld segments=%d N=%lld on "
                    "sm_%d", PRODUCTS[!!backward], call ? call->dtype : -1, call ? call->axis : -1,
                    call ? call->relu : -1, call ? (long long)call->features : -1LL, call ? call->segments : -1,
                    call ? (long long)call->n_tokens : -1LL, *arch);
  const ln_spec *kernels[4] = {plan->spec, plan->dx, plan->merge, plan->apply};
  for (int k = 0; k < 4; ++k)
    if (kernels[k] && kernels[k]->args.problem)
      return bsk_fail(message, size, BSK_ERR_INVALID, "spec %s cannot run: %s", kernels[k]->args.name,
                      kernels[k]->args.problem);
  if (call->n_tokens < 0 || call->n_tokens > INT32_MAX || call->features > INT32_MAX)
    return bsk_fail(message, size, BSK_ERR_INVALID, "N and C must be in [0, 2^31); got %lld and %lld",
                    (long long)call->n_tokens, (long long)call->features);
  return BSK_OK;
}

int bsk_layer_norm_workspace(const bsk_layer_norm_call *call, void *stream, size_t *bytes, char *message,
                             size_t size) {
  ln_plan plan;
  int arch, sms, status = device_spec(call, 1, stream, &plan, &arch, &sms, message, size);
  if (status) return status;
  if (plan.dx) {
    const ln_split g = split_grid(plan.spec, call, sms);
    *bytes = 2 * stats_bytes(&g, call) + 2 * part_bytes(g.tiles, call);
  } else {
    *bytes = 2 * part_bytes(programs(plan.spec, call, sms), call);
  }
  return BSK_OK;
}

static int run_forward(const ln_spec *s, const bsk_layer_norm_call *call, int sms, void *stream, char *message,
                       size_t size) {
  bsk_arg v[V_COUNT];
  memset(v, 0, sizeof(v));
  bsk_ops_ptr(&v[V_X], call->x), bsk_ops_ptr(&v[V_G], call->g), bsk_ops_ptr(&v[V_B], call->b);
  bsk_ops_ptr(&v[V_Y], call->y), bsk_ops_ptr(&v[V_MEAN], call->mean), bsk_ops_ptr(&v[V_RSTD], call->rstd);
  bsk_ops_i32(&v[V_N], call->n_tokens), bsk_ops_i32(&v[V_CS], segment_features(call));
  bsk_ops_f32(&v[V_EPSILON], call->epsilon);
  strides(&v[V_STRIDE_XN], &v[V_STRIDE_XF], call), strides(&v[V_STRIDE_YN], &v[V_STRIDE_YF], call);
  unsigned grid[3] = {(unsigned)programs(s, call, sms), (unsigned)call->segments, 1};
  return bsk_ops_launch(&s->args, grid, v, stream, message, size);
}

/* The split forward: the slices' partial statistics (staged in y), merged into mean and rstd, then y. */
static int run_split_forward(const ln_plan *plan, const bsk_layer_norm_call *call, int sms, void *stream,
                             char *message, size_t size) {
  const ln_split g = split_grid(plan->spec, call, sms);
  bsk_arg v[V_COUNT];
  memset(v, 0, sizeof(v));
  bsk_ops_ptr(&v[V_X], call->x), bsk_ops_ptr(&v[V_G], call->g), bsk_ops_ptr(&v[V_B], call->b);
  bsk_ops_ptr(&v[V_Y], call->y), bsk_ops_ptr(&v[V_MEAN], call->mean), bsk_ops_ptr(&v[V_RSTD], call->rstd);
  bsk_ops_ptr(&v[V_PART], call->y);
  bsk_ops_i32(&v[V_N], call->n_tokens), bsk_ops_i32(&v[V_CS], segment_features(call)), bsk_ops_i32(&v[V_FS], g.fs);
  bsk_ops_f32(&v[V_EPSILON], call->epsilon);
  strides(&v[V_STRIDE_XN], &v[V_STRIDE_XF], call), strides(&v[V_STRIDE_YN], &v[V_STRIDE_YF], call);
  unsigned grid[3] = {(unsigned)g.tiles, (unsigned)g.slices, (unsigned)call->segments};
  unsigned merge_grid[3] = {(unsigned)g.tiles, 1, (unsigned)call->segments};
  int status = bsk_ops_launch(&plan->spec->args, grid, v, stream, message, size);
  if (!status) status = bsk_ops_launch(&plan->merge->args, merge_grid, v, stream, message, size);
  if (!status) status = bsk_ops_launch(&plan->apply->args, grid, v, stream, message, size);
  return status;
}

/* The split backward: partial sums over feature slices, then dx; dg and db summed from the token
 * tiles' partial rows. */
static int run_split(const ln_plan *plan, const bsk_layer_norm_call *call, int arch, int sms, void *stream,
                     char *message, size_t size) {
  const ln_split g = split_grid(plan->spec, call, sms);
  const size_t stats = stats_bytes(&g, call), part = part_bytes(g.tiles, call);
  const uint64_t c1 = call->workspace, c2 = c1 + stats, dg_part = c2 + stats, db_part = dg_part + part;
  bsk_arg v[V_COUNT];
  memset(v, 0, sizeof(v));
  bsk_ops_ptr(&v[V_X], call->x), bsk_ops_ptr(&v[V_G], call->g), bsk_ops_ptr(&v[V_B], call->b);
  bsk_ops_ptr(&v[V_DY], call->dy), bsk_ops_ptr(&v[V_DX], call->dx);
  bsk_ops_ptr(&v[V_MEAN], call->mean), bsk_ops_ptr(&v[V_RSTD], call->rstd);
  bsk_ops_ptr(&v[V_C1_PART], c1), bsk_ops_ptr(&v[V_C2_PART], c2);
  bsk_ops_ptr(&v[V_DG_PART], dg_part), bsk_ops_ptr(&v[V_DB_PART], db_part);
  bsk_ops_i32(&v[V_N], call->n_tokens), bsk_ops_i32(&v[V_CS], segment_features(call)), bsk_ops_i32(&v[V_FS], g.fs);
  strides(&v[V_STRIDE_XN], &v[V_STRIDE_XF], call), strides(&v[V_STRIDE_DYN], &v[V_STRIDE_DYF], call);
  strides(&v[V_STRIDE_DXN], &v[V_STRIDE_DXF], call);
  unsigned grid[3] = {(unsigned)g.tiles, (unsigned)g.slices, (unsigned)call->segments};
  int status = bsk_ops_launch(&plan->spec->args, grid, v, stream, message, size);
  if (!status) status = bsk_ops_launch(&plan->dx->args, grid, v, stream, message, size);
  if (status) return status;
  return bsk_sum_rows_run("norms", arch, call->params ? call->dtype : BSK_FP32, dg_part, db_part, call->dg, call->db,
                          g.tiles, call->features, stream, message, size);
}

static int run_backward(const ln_plan *plan, const bsk_layer_norm_call *call, int arch, int sms, void *stream,
                        char *message, size_t size) {
  int status;
  if (call->n_tokens == 0) { /* no tokens: dg and db are zero */
    if ((status = bsk_memset32(call->dg, 0, (size_t)call->features, stream, message, size))) return status;
    return bsk_memset32(call->db, 0, (size_t)call->features, stream, message, size);
  }
  if (call->workspace % 16)
    return bsk_fail(message, size, BSK_ERR_INVALID, "workspace must be aligned to 16 bytes");
  if (plan->dx) return run_split(plan, call, arch, sms, stream, message, size);
  const ln_spec *s = plan->spec;
  int64_t n_programs = programs(s, call, sms);
  size_t part = part_bytes(n_programs, call);
  uint64_t dg_part = call->workspace, db_part = call->workspace + part;
  /* chunked tiles add into their partial rows: they start zeroed */
  if (!s->one_chunk && (status = bsk_memset32(call->workspace, 0, 2 * part / 4, stream, message, size)))
    return status;
  bsk_arg v[V_COUNT];
  memset(v, 0, sizeof(v));
  bsk_ops_ptr(&v[V_X], call->x), bsk_ops_ptr(&v[V_G], call->g), bsk_ops_ptr(&v[V_B], call->b);
  bsk_ops_ptr(&v[V_DY], call->dy), bsk_ops_ptr(&v[V_DX], call->dx);
  bsk_ops_ptr(&v[V_MEAN], call->mean), bsk_ops_ptr(&v[V_RSTD], call->rstd);
  bsk_ops_ptr(&v[V_DG_PART], dg_part), bsk_ops_ptr(&v[V_DB_PART], db_part);
  bsk_ops_i32(&v[V_N], call->n_tokens), bsk_ops_i32(&v[V_CS], segment_features(call));
  strides(&v[V_STRIDE_XN], &v[V_STRIDE_XF], call), strides(&v[V_STRIDE_DYN], &v[V_STRIDE_DYF], call);
  strides(&v[V_STRIDE_DXN], &v[V_STRIDE_DXF], call);
  unsigned grid[3] = {(unsigned)n_programs, (unsigned)call->segments, 1};
  if ((status = bsk_ops_launch(&s->args, grid, v, stream, message, size))) return status;
  /* dg and db in the parameters' dtype */
  return bsk_sum_rows_run("norms", arch, call->params ? call->dtype : BSK_FP32, dg_part, db_part, call->dg, call->db,
                          n_programs, call->features, stream,
                          message, size);
}

int bsk_layer_norm_run(const bsk_layer_norm_call *call, int backward, void *stream, char *message, size_t size) {
  if (!call) return bsk_fail(message, size, BSK_ERR_INVALID, "call must not be NULL");
  ln_plan plan;
  int arch, sms, status = device_spec(call, backward, stream, &plan, &arch, &sms, message, size);
  if (status) return status;
  if (!backward && !call->n_tokens) return BSK_OK;
  if (!backward && plan.apply) return run_split_forward(&plan, call, sms, stream, message, size);
  if (!backward) return run_forward(plan.spec, call, sms, stream, message, size);
  return run_backward(&plan, call, arch, sms, stream, message, size);
}
