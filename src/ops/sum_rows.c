/* Column sums of partial rows for any family that registers a sum_rows spec. */
#include "sum_rows.h"

#include "bsk_message.h"
#include "dtypes.h"
#include "spec_args.h"

enum { V_PART_A, V_PART_B, V_OUT_A, V_OUT_B, V_P, V_M, V_COUNT };
static const char *const VALUE_NAMES[V_COUNT] = {"PART_A", "PART_B", "OUT_A", "OUT_B", "P", "M"};

static const char *const OUT_DTYPES[] = {"fp16", "bf16", "fp32"};  /* by BSK_FP16, BSK_BF16, BSK_FP32 */

/* How well a spec of `bp` rows a step fits a call that wants `want` (blocksparse/ops/common/reduce.py
 * sum_rows_tile: all rows in one step where they fit): the tile itself, else the widest below it,
 * else the narrowest above. */
static int bp_fit(int bp, int want) { return bp <= want ? bp : -bp; }

/* The best sum_rows spec of `family` with (has_b, out_dtype) that serves `arch` and rows of
 * `aligned` (a multiple of 16 columns, which "aligned" specs need: their loads are vectors): the
 * runtime's rank, then alignment, then the tile for `want_bp` rows a step; or -1. */
static int select_spec(const char *family, int has_b, int out_dtype, int arch, int aligned, int want_bp) {
  int best = -1, best_rank = 0, best_aligned = 0, best_fit = 0, count = bsk_spec_count();
  for (int i = 0; i < count; ++i) {
    const char *product = NULL;
    int spec_has_b = -1, spec_aligned = -1, bp = 0, rank = bsk_ops_rank(i, arch);
    if (strcmp(bsk_spec_family(i), family)) continue;
    bsk_spec_key(i, "product", NULL, &product);
    if (!product || strcmp(product, "sum_rows") || !bsk_ops_int(i, "has_b", &spec_has_b) ||
        !bsk_ops_int(i, "aligned", &spec_aligned) || !bsk_ops_int(i, "bp", &bp) || spec_has_b != has_b ||
        bsk_ops_text(i, "out", OUT_DTYPES, 3) != out_dtype || !rank || (spec_aligned && !aligned))
      continue;
    int fit = bp_fit(bp, want_bp);
    if (best < 0 || rank > best_rank ||
        (rank == best_rank && (spec_aligned > best_aligned || (spec_aligned == best_aligned && fit > best_fit))))
      best = i, best_rank = rank, best_aligned = spec_aligned, best_fit = fit;
  }
  return best;
}

/* The partial rows a step the JIT's tile takes for `rows` rows: the next power of two, at most 512. */
static int wanted_bp(int64_t rows) {
  int bp = 1;
  while (bp < rows && bp < 512) bp *= 2;
  return bp;
}

/* A spec chosen and its arguments read: each thread remembers its last few (a backward pass asks for
 * the same one at every step, and choosing scans the whole table). */
typedef struct {
  char family[32];
  int has_b, out_dtype, arch, aligned, want_bp, index, bm;
  bsk_ops_args args;
} sum_rows_choice;
enum { RECENT = 4 };
static _Thread_local sum_rows_choice recent[RECENT];
static _Thread_local int recent_next;

static const sum_rows_choice *choose(const char *family, int has_b, int out_dtype, int arch, int aligned,
                                     int want_bp) {
  for (int i = 0; i < RECENT; ++i)
    if (recent[i].has_b == has_b && recent[i].out_dtype == out_dtype && recent[i].arch == arch &&
        recent[i].aligned == aligned && recent[i].want_bp == want_bp && !strcmp(recent[i].family, family))
      return &recent[i];
  sum_rows_choice *slot = &recent[recent_next++ % RECENT];
  memset(slot, 0, sizeof *slot);
  slot->has_b = has_b, slot->out_dtype = out_dtype, slot->arch = arch, slot->aligned = aligned;
  slot->want_bp = want_bp;
  slot->index = select_spec(family, has_b, out_dtype, arch, aligned, want_bp);
  if (slot->index >= 0) {
    bsk_ops_read_args(slot->index, VALUE_NAMES, V_COUNT, &slot->args);
    if (!slot->args.problem && !bsk_ops_int(slot->index, "bm", &slot->bm)) slot->args.problem = "it has no key bm";
  }
  if (strlen(family) < sizeof slot->family) strcpy(slot->family, family);  /* else never matched again */
  return slot;
}

int bsk_sum_rows_select(const char *family, int arch, int out_dtype, int has_b, int64_t rows, int64_t columns) {
  if (!family || out_dtype < BSK_FP16 || out_dtype > BSK_FP32) return -1;
  return choose(family, !!has_b, out_dtype, arch, columns % 16 == 0, wanted_bp(rows))->index;
}

int bsk_sum_rows_run(const char *family, int arch, int out_dtype, uint64_t part_a, uint64_t part_b,
                     uint64_t out_a, uint64_t out_b, int64_t rows, int64_t columns, void *stream, char *message,
                     size_t size) {
  int has_b = part_b != 0;
  if (out_dtype < BSK_FP16 || out_dtype > BSK_FP32)
    return bsk_fail(message, size, BSK_ERR_INVALID, "out_dtype must be BSK_FP16, BSK_BF16 or BSK_FP32; got %d",
                    out_dtype);
  const sum_rows_choice *c = choose(family, has_b, out_dtype, arch, columns % 16 == 0, wanted_bp(rows));
  if (c->index < 0)
    return bsk_fail(message, size, BSK_ERR_UNSUPPORTED,
                    "no compiled sum_rows kernel (%s, %s out, %lld columns) of family %s for sm_%d",
                    has_b ? "two buffers" : "one buffer", OUT_DTYPES[out_dtype], (long long)columns, family, arch);
  const bsk_ops_args a = c->args;
  const int bm = c->bm;
  if (a.problem) return bsk_fail(message, size, BSK_ERR_INVALID, "spec %s cannot run: %s", a.name, a.problem);
  if (rows < 1 || columns < 1 || rows > INT32_MAX || columns > INT32_MAX)
    return bsk_fail(message, size, BSK_ERR_INVALID, "sum_rows needs 1 to 2^31 - 1 rows and columns; got %lld x %lld",
                    (long long)rows, (long long)columns);
  bsk_arg v[V_COUNT];
  memset(v, 0, sizeof(v));
  /* without a second buffer the kernel never touches PART_B / OUT_B: any aligned address will do */
  bsk_ops_ptr(&v[V_PART_A], part_a), bsk_ops_ptr(&v[V_PART_B], has_b ? part_b : part_a);
  bsk_ops_ptr(&v[V_OUT_A], out_a), bsk_ops_ptr(&v[V_OUT_B], has_b ? out_b : out_a);
  bsk_ops_i32(&v[V_P], rows), bsk_ops_i32(&v[V_M], columns);
  unsigned grid[3] = {(unsigned)bsk_ops_cdiv(columns, bm), 1, 1};
  return bsk_ops_launch(&a, grid, v, stream, message, size);
}
