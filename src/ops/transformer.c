/* The transformer family on the generic runtime: spec selection, grids and arguments of the
 * block-sparse attention kernels, as blocksparse/torch/_transformer/launch.py computes them.  Specs
 * are read once from the runtime's table (their keys are the fields of
 * blocksparse/ops/transformer/aot.py). */
#include <pthread.h>
#include <stdlib.h>

#include "bsk_message.h"
#include "spec_args.h"
#include "transformer.h"

/* The kernels (the specs' "product"), and the names of the calls' products. */
enum { K_NT, K_XN, K_SOFTMAX, K_SOFTMAX_GRAD };
static const char *const KERNELS[] = {"nt", "xn", "softmax", "softmax_grad"};
static const char *const PRODUCTS[] = {"nt", "nn", "tn", "softmax", "softmax_grad"};
static const char *const DTYPES[] = {"fp16", "bf16", "fp32"};
/* CUDA's limit of a grid's second axis, which holds one program row per (batch, head). */
#define MAX_ROWS 65535

enum {
  V_A, V_B, V_C, V_W, V_X, V_Y, V_DY, V_DX, V_COORDS, V_OFFSETS, V_BLOCK_IDS, V_ROW_OFFSETS, V_MASK_INDEX,
  V_MASK_BITS, V_BLOCKS, V_HEADS, V_LUT_HEADS, V_HEAD_DIM, V_OUT_BLOCKS, V_Q_BLOCKS, V_SCALE, V_AR_KEY,
  V_STRIDE_AN, V_STRIDE_AT, V_STRIDE_BN, V_STRIDE_BT, V_STRIDE_XN, V_STRIDE_XT, V_STRIDE_YN, V_STRIDE_YT, V_COUNT
};
static const char *const VALUE_NAMES[V_COUNT] = {
    "A", "B", "C", "W", "X", "Y", "DY", "DX", "COORDS", "OFFSETS", "BLOCK_IDS", "ROW_OFFSETS", "MASK_INDEX",
    "MASK_BITS", "blocks", "heads", "lut_heads", "head_dim", "out_blocks", "q_blocks", "scale", "ar_key",
    "stride_an", "stride_at", "stride_bn", "stride_bt", "stride_xn", "stride_xt", "stride_yn", "stride_yt"};

typedef struct {
  bsk_ops_args args;
  int kernel, dtype, block_size, bd, trans, has_mask, autoregress;
} bst_spec;

static bst_spec *table;
static int table_count;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void read_table(void) {
  int count = bsk_spec_count(), n = 0;
  for (int i = 0; i < count; ++i) n += bsk_ops_is_kernel(i, "transformer");
  table = calloc((size_t)n + 1, sizeof(bst_spec));
  if (!table) return;
  for (int i = 0; i < count; ++i) {
    if (!bsk_ops_is_kernel(i, "transformer")) continue;
    bst_spec *s = &table[table_count++];
    bsk_ops_read_args(i, VALUE_NAMES, V_COUNT, &s->args);
    s->kernel = bsk_ops_text(i, "product", KERNELS, 4);
    s->dtype = bsk_ops_text(i, "dtype", DTYPES, 3);
    if (s->kernel < 0 || s->dtype < 0 || !bsk_ops_int(i, "block_size", &s->block_size) ||
        !bsk_ops_int(i, "bd", &s->bd) || !bsk_ops_int(i, "trans", &s->trans) ||
        !bsk_ops_int(i, "has_mask", &s->has_mask) || !bsk_ops_int(i, "autoregress", &s->autoregress))
      s->args.problem = "its keys are not those of blocksparse/ops/transformer/aot.py fields()";
  }
}

static int is_product(const bsk_transformer_call *call) { return call->product <= BSK_BST_TN; }
static int64_t head_dim(const bsk_transformer_call *call) { return call->features / call->heads; }

/* aot.head_slice: the head dimension rounded up to a power of two, 16 to 128 (64 for 128-blocks) */
static int head_slice(int64_t d, int bs) {
  int bd = 16, widest = bs < 128 ? 128 : 64;
  while (bd < d && bd < widest) bd *= 2;
  return bd;
}

static const bst_spec *choose(const bsk_transformer_call *call, int arch) {
  if (!call || call->product < BSK_BST_NT || call->product > BSK_BST_SOFTMAX_GRAD || call->dtype < BSK_FP16 ||
      call->dtype > BSK_FP32 || call->heads < 1)
    return NULL;
  /* the products were compiled for head dimensions that are multiples of 16 */
  if (is_product(call) && (call->features < 1 || call->features % call->heads || head_dim(call) % 16)) return NULL;
  static const int KERNEL_OF[] = {K_NT, K_XN, K_XN, K_SOFTMAX, K_SOFTMAX_GRAD};
  int kernel = KERNEL_OF[call->product];
  int bd = is_product(call) ? head_slice(head_dim(call), call->block_size) : 0;
  pthread_once(&table_once, read_table);
  const bst_spec *best = NULL;
  int best_rank = 0;
  for (int i = 0; i < table_count; ++i) {
    const bst_spec *s = &table[i];
    int rank = bsk_ops_rank(s->args.index, arch);
    if (s->args.problem || s->kernel != kernel || s->dtype != call->dtype || s->block_size != call->block_size ||
        s->bd != bd || s->trans != (call->product == BSK_BST_TN) || !rank)
      continue;
    if (kernel == K_SOFTMAX && (s->has_mask != !!call->masked || s->autoregress != !!call->autoregress)) continue;
    if (rank > best_rank) best = s, best_rank = rank;
  }
  return best;
}

int bsk_transformer_select(const bsk_transformer_call *call, int arch) {
  const bst_spec *s = choose(call, arch);
  return s ? s->args.index : -1;
}

/* ---- checks --------------------------------------------------------------------------------- */

/* What is wrong with the call's sizes and buffers (a static string), or NULL. */
static const char *problem(const bsk_transformer_call *call) {
  if (call->product < BSK_BST_NT || call->product > BSK_BST_SOFTMAX_GRAD) return "product must be one of BSK_BST_*";
  if (call->dtype < BSK_FP16 || call->dtype > BSK_FP32) return "dtype must be BSK_FP16, BSK_BF16 or BSK_FP32";
  if (call->batch < 0 || call->heads < 1 || call->q_blocks < 1 || call->k_blocks < 1 || call->blocks < 1)
    return "batch must be >= 0 and heads, q_blocks, k_blocks and blocks >= 1";
  if (call->lut_heads != 1 && call->lut_heads != call->heads) return "lut_heads must be 1 or heads";
  if (call->blocks > call->q_blocks * call->k_blocks) return "blocks must be at most q_blocks * k_blocks";
  if (is_product(call) && (call->features < 1 || call->features % call->heads))
    return "features must be a positive multiple of heads (heads * head_dim)";
  int64_t ctx = (call->q_blocks > call->k_blocks ? call->q_blocks : call->k_blocks) * call->block_size;
  if (is_product(call) && ctx * call->features > INT32_MAX)
    return "ctx * features must be below 2^31 (the kernels' strides are int32)";
  if (!call->a || !call->out || (call->product != BSK_BST_SOFTMAX && !call->b)) return "a, b and out must be given";
  int needs_coords = call->product <= BSK_BST_TN || (call->product == BSK_BST_SOFTMAX &&
                                                      (call->masked || call->autoregress));
  if ((needs_coords && !call->coords) || (call->product == BSK_BST_TN && (!call->col_offsets || !call->col_blocks)) ||
      (call->product != BSK_BST_NT && call->product != BSK_BST_TN && !call->row_offsets) ||
      (call->product == BSK_BST_SOFTMAX && call->masked && (!call->mask_index || !call->mask_bits)))
    return "a table the product reads is missing (see transformer.h)";
  if (call->product == BSK_BST_SOFTMAX && call->autoregress && call->ar_key < 0) return "ar_key must be >= 0";
  return NULL;
}

/* ---- values and grids, as blocksparse/torch/_transformer/launch.py computes them ------------- */

/* Dense (N, ctx_blocks * bs, F) activations: batch and position strides into two slots. */
static void strides(bsk_arg *v, const bsk_transformer_call *call, int64_t ctx_blocks) {
  bsk_ops_i32(&v[0], ctx_blocks * call->block_size * call->features), bsk_ops_i32(&v[1], call->features);
}

int bsk_transformer_run(const bsk_transformer_call *call, void *stream, char *message, size_t size) {
  if (!call) return bsk_fail(message, size, BSK_ERR_INVALID, "call must not be NULL");
  const char *why = problem(call);
  if (why) return bsk_fail(message, size, BSK_ERR_INVALID, "transformer call: %s", why);
  int64_t rows = call->batch * call->heads;
  if (rows > MAX_ROWS)
    return bsk_fail(message, size, BSK_ERR_INVALID, "the transformer kernels take at most 65535 batch * heads; "
                    "got %lld * %lld: split the batch", (long long)call->batch, (long long)call->heads);
  int arch, sms, status = bsk_device(stream, &arch, &sms, message, size);
  if (status) return status;
  const bst_spec *s = choose(call, arch);
  if (!s)
    return bsk_fail(message, size, BSK_ERR_UNSUPPORTED,
                    "no compiled transformer %s kernel for %s block_size=%d head_dim=%lld masked=%d autoregress=%d "
                    "on sm_%d (the products take head dimensions that are multiples of 16)", PRODUCTS[call->product],
                    DTYPES[call->dtype], call->block_size, is_product(call) ? (long long)head_dim(call) : 0LL,
                    call->masked, call->autoregress, arch);
  if (s->args.problem)
    return bsk_fail(message, size, BSK_ERR_INVALID, "spec %s cannot run: %s", s->args.name, s->args.problem);
  if (!call->batch) return BSK_OK;
  bsk_arg v[V_COUNT];
  memset(v, 0, sizeof(v));
  bsk_ops_ptr(&v[V_COORDS], call->coords), bsk_ops_ptr(&v[V_ROW_OFFSETS], call->row_offsets);
  bsk_ops_i32(&v[V_BLOCKS], call->blocks), bsk_ops_i32(&v[V_HEADS], call->heads);
  bsk_ops_i32(&v[V_LUT_HEADS], call->lut_heads), bsk_ops_i32(&v[V_Q_BLOCKS], call->q_blocks);
  unsigned grid[3] = {(unsigned)call->q_blocks, (unsigned)rows, 1};
  switch (call->product) {
    case BSK_BST_NT:
      bsk_ops_ptr(&v[V_A], call->a), bsk_ops_ptr(&v[V_B], call->b), bsk_ops_ptr(&v[V_C], call->out);
      bsk_ops_i32(&v[V_HEAD_DIM], head_dim(call));
      strides(&v[V_STRIDE_AN], call, call->q_blocks), strides(&v[V_STRIDE_BN], call, call->k_blocks);
      grid[0] = (unsigned)call->blocks;
      break;
    case BSK_BST_NN:
    case BSK_BST_TN: {
      int trans = call->product == BSK_BST_TN;
      int64_t in_blocks = trans ? call->q_blocks : call->k_blocks, out_blocks = trans ? call->k_blocks : call->q_blocks;
      bsk_ops_ptr(&v[V_W], call->a), bsk_ops_ptr(&v[V_X], call->b), bsk_ops_ptr(&v[V_Y], call->out);
      bsk_ops_ptr(&v[V_OFFSETS], trans ? call->col_offsets : call->row_offsets);
      bsk_ops_ptr(&v[V_BLOCK_IDS], call->col_blocks);
      bsk_ops_i32(&v[V_OUT_BLOCKS], out_blocks), bsk_ops_i32(&v[V_HEAD_DIM], head_dim(call));
      strides(&v[V_STRIDE_XN], call, in_blocks), strides(&v[V_STRIDE_YN], call, out_blocks);
      grid[0] = (unsigned)out_blocks, grid[2] = (unsigned)bsk_ops_cdiv(head_dim(call), s->bd);
      break;
    }
    case BSK_BST_SOFTMAX:
      bsk_ops_ptr(&v[V_X], call->a), bsk_ops_ptr(&v[V_Y], call->out);
      bsk_ops_ptr(&v[V_MASK_INDEX], call->mask_index), bsk_ops_ptr(&v[V_MASK_BITS], call->mask_bits);
      bsk_ops_f32(&v[V_SCALE], call->scale), bsk_ops_i32(&v[V_AR_KEY], call->autoregress ? call->ar_key : 0);
      break;
    default:
      bsk_ops_ptr(&v[V_DY], call->a), bsk_ops_ptr(&v[V_Y], call->b), bsk_ops_ptr(&v[V_DX], call->out);
      bsk_ops_f32(&v[V_SCALE], call->scale);
      break;
  }
  return bsk_ops_launch(&s->args, grid, v, stream, message, size);
}
