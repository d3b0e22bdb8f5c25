/* The LSTM family on the generic runtime: the gate kernels' spec selection, grids and arguments, as
 * blocksparse/torch/_lstm/launch.py computes them for the same tile.  Specs are read once from the
 * runtime's table (their keys are the fields of blocksparse/ops/lstm/aot.py). */
#include <pthread.h>
#include <stdlib.h>

#include "bsk_message.h"
#include "norms.h"
#include "spec_args.h"
#include "sum_rows.h"

static const char *const PRODUCTS[] = {"fwd", "bwd"};
static const char *const DTYPES[] = {"fp16", "bf16", "fp32"};
static const int ELEM_SIZE[] = {2, 2, 4};

enum {
  V_C, V_I, V_J, V_F, V_O, V_BIAS, V_C_NEXT, V_H_NEXT, V_DC_NEXT, V_DH_NEXT, V_DC, V_DI, V_DJ, V_DF, V_DO,
  V_DBIAS_PART, V_N, V_K, V_FORGET_BIAS,
  V_STRIDE_C, V_STRIDE_I, V_STRIDE_J, V_STRIDE_F, V_STRIDE_O, V_STRIDE_CN, V_STRIDE_HN, V_STRIDE_DCN,
  V_STRIDE_DHN, V_STRIDE_DC, V_STRIDE_DI, V_STRIDE_DJ, V_STRIDE_DF, V_STRIDE_DO, V_COUNT
};
static const char *const VALUE_NAMES[V_COUNT] = {
    "C", "I", "J", "F", "O", "BIAS", "C_NEXT", "H_NEXT", "DC_NEXT", "DH_NEXT", "DC", "DI", "DJ", "DF", "DO",
    "DBIAS_PART", "N", "K", "forget_bias",
    "stride_c", "stride_i", "stride_j", "stride_f", "stride_o", "stride_cn", "stride_hn", "stride_dcn",
    "stride_dhn", "stride_dc", "stride_di", "stride_dj", "stride_df", "stride_do"};

typedef struct {
  bsk_ops_args args;
  int backward, dtype, param, has_bias, bn, bk, programs_per_sm;
} gates_spec;

static gates_spec *table;
static int table_count;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void read_table(void) {
  int count = bsk_spec_count(), n = 0;
  for (int i = 0; i < count; ++i) n += bsk_ops_is_kernel(i, "lstm");
  table = calloc((size_t)n + 1, sizeof(gates_spec));
  if (!table) return;
  for (int i = 0; i < count; ++i) {
    if (!bsk_ops_is_kernel(i, "lstm")) continue;
    gates_spec *s = &table[table_count++];
    bsk_ops_read_args(i, VALUE_NAMES, V_COUNT, &s->args);
    s->backward = bsk_ops_text(i, "product", PRODUCTS, 2);
    s->dtype = bsk_ops_text(i, "dtype", DTYPES, 3);
    s->param = bsk_ops_text(i, "param", DTYPES, 3);
    if (s->backward < 0 || s->dtype < 0 || s->param < 0 || !bsk_ops_int(i, "has_bias", &s->has_bias) ||
        !bsk_ops_int(i, "bn", &s->bn) || !bsk_ops_int(i, "bk", &s->bk) ||
        !bsk_ops_int(i, "programs_per_sm", &s->programs_per_sm))
      s->args.problem = "its keys are not those of blocksparse/ops/lstm/aot.py fields()";
  }
}

/* configs.lstm_gates_config's tile, at least 16 features wide (the narrowest compiled) */
static int tile_for(int64_t k) {
  int bk = 16;
  while (bk < 128 && bk < k) bk *= 2;
  return bk;
}

static const gates_spec *choose(const bsk_lstm_gates_call *call, int backward, int arch) {
  if (!call || call->dtype < BSK_FP16 || call->dtype > BSK_FP32 || call->features < 16 || call->features % 16)
    return NULL;
  pthread_once(&table_once, read_table);
  const gates_spec *best = NULL;
  /* the bias's dtype: float32, or (params) the activations' own */
  int bk = tile_for(call->features), best_rank = 0, param = call->bias && call->params ? call->dtype : BSK_FP32;
  for (int i = 0; i < table_count; ++i) {
    const gates_spec *s = &table[i];
    int rank = bsk_ops_rank(s->args.index, arch);
    if (s->args.problem || s->backward != !!backward || s->dtype != call->dtype || s->has_bias != !!call->bias ||
        s->param != param || s->bk != bk || !rank)
      continue;
    if (rank > best_rank) best = s, best_rank = rank;
  }
  return best;
}

int bsk_lstm_gates_select(const bsk_lstm_gates_call *call, int backward, int arch) {
  const gates_spec *s = choose(call, backward, arch);
  return s ? s->args.index : -1;
}

static int64_t bwd_programs(const gates_spec *s, const bsk_lstm_gates_call *call, int sms) {
  int64_t n_tiles = bsk_ops_cdiv(call->n_tokens, s->bn), k_tiles = bsk_ops_cdiv(call->features, s->bk);
  if (!call->bias) return n_tiles;
  /* with a bias every program folds its tokens' dbias into one partial row: few programs */
  int64_t by_sms = (int64_t)s->programs_per_sm * sms / k_tiles;
  int64_t programs = n_tiles < by_sms ? n_tiles : by_sms;
  return programs < 1 ? 1 : programs;
}

static int device_spec(const bsk_lstm_gates_call *call, int backward, void *stream, const gates_spec **s,
                       int *arch, int *sms, char *message, size_t size) {
  int status = bsk_device_at(stream, call ? call->c : 0, arch, sms, message, size);
  if (status) return status;
  if (!(*s = choose(call, backward, *arch)))
    return bsk_fail(message, size, BSK_ERR_UNSUPPORTED,
                    "no compiled LSTM gates %s kernel for dtype %d K=%lld bias=%d on sm_%d (K must be a "
                    "multiple of 16)", PRODUCTS[!!backward], call ? call->dtype : -1,
                    call ? (long long)call->features : -1LL, call ? call->bias != 0 : -1, *arch);
  if ((*s)->args.problem)
    return bsk_fail(message, size, BSK_ERR_INVALID, "spec %s cannot run: %s", (*s)->args.name, (*s)->args.problem);
  if (call->n_tokens < 0 || call->n_tokens > INT32_MAX || 4 * call->features > INT32_MAX)
    return bsk_fail(message, size, BSK_ERR_INVALID, "N and 4K must be in [0, 2^31); got %lld and %lld",
                    (long long)call->n_tokens, (long long)(4 * call->features));
  return BSK_OK;
}

int bsk_lstm_gates_workspace(const bsk_lstm_gates_call *call, void *stream, size_t *bytes, char *message,
                             size_t size) {
  const gates_spec *s;
  int arch, sms, status = device_spec(call, 1, stream, &s, &arch, &sms, message, size);
  if (status) return status;
  *bytes = call->bias ? (size_t)bwd_programs(s, call, sms) * 4 * (size_t)call->features * 4 : 0;
  return BSK_OK;
}

/* The four gates (or their gradients) at `base`: one merged (N, 4K) tensor, or four (N, K) ones. */
static void gates(bsk_arg *v, bsk_arg *stride, const bsk_lstm_gates_call *call, const uint64_t four[4]) {
  int64_t k = call->features;
  for (int g = 0; g < 4; ++g) {
    bsk_ops_ptr(&v[g], call->merged ? four[0] + (uint64_t)(g * k * ELEM_SIZE[call->dtype]) : four[g]);
    bsk_ops_i32(&stride[g], call->merged ? 4 * k : k);
  }
}

int bsk_lstm_gates_run(const bsk_lstm_gates_call *call, int backward, void *stream, char *message, size_t size) {
  if (!call) return bsk_fail(message, size, BSK_ERR_INVALID, "call must not be NULL");
  const gates_spec *s;
  int arch, sms, status = device_spec(call, backward, stream, &s, &arch, &sms, message, size);
  if (status) return status;
  int64_t k = call->features;
  if (call->n_tokens == 0) /* nothing to compute; dbias is zero (4K float32 words, or 4K 16-bit ones: K is even) */
    return backward && call->bias ? bsk_memset32(call->dbias, 0, (size_t)(call->params ? 2 * k : 4 * k), stream,
                                                 message, size)
                                  : BSK_OK;
  bsk_arg v[V_COUNT];
  memset(v, 0, sizeof(v));
  const uint64_t in[4] = {call->i, call->j, call->f, call->o};
  bsk_ops_ptr(&v[V_C], call->c), bsk_ops_ptr(&v[V_BIAS], call->bias ? call->bias : call->c);
  gates(&v[V_I], &v[V_STRIDE_I], call, in);
  bsk_ops_i32(&v[V_N], call->n_tokens), bsk_ops_i32(&v[V_K], k), bsk_ops_f32(&v[V_FORGET_BIAS], call->forget_bias);
  bsk_ops_i32(&v[V_STRIDE_C], k);
  unsigned grid[3] = {(unsigned)bsk_ops_cdiv(call->n_tokens, s->bn), (unsigned)bsk_ops_cdiv(k, s->bk), 1};
  if (!backward) {
    bsk_ops_ptr(&v[V_C_NEXT], call->c_next), bsk_ops_ptr(&v[V_H_NEXT], call->h_next);
    bsk_ops_i32(&v[V_STRIDE_CN], k), bsk_ops_i32(&v[V_STRIDE_HN], k);
    return bsk_ops_launch(&s->args, grid, v, stream, message, size);
  }
  const uint64_t out[4] = {call->di, call->dj, call->df, call->d_o};
  bsk_ops_ptr(&v[V_DC_NEXT], call->dc_next), bsk_ops_ptr(&v[V_DH_NEXT], call->dh_next);
  bsk_ops_ptr(&v[V_DC], call->dc), gates(&v[V_DI], &v[V_STRIDE_DI], call, out);
  bsk_ops_ptr(&v[V_DBIAS_PART], call->bias ? call->workspace : call->c);
  bsk_ops_i32(&v[V_STRIDE_DCN], k), bsk_ops_i32(&v[V_STRIDE_DHN], k), bsk_ops_i32(&v[V_STRIDE_DC], k);
  int64_t programs = bwd_programs(s, call, sms);
  grid[0] = (unsigned)programs;
  if ((status = bsk_ops_launch(&s->args, grid, v, stream, message, size)) || !call->bias) return status;
  return bsk_sum_rows_run("lstm", arch, call->params ? call->dtype : BSK_FP32, call->workspace, 0, call->dbias, 0,
                          programs, 4 * k, stream, message, size);
}
