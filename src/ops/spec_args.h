/* What the families' C shares when it reads its specs from the runtime's table: keys, and the
 * slot of each kernel argument in a family's list of named values (the kernels' parameter
 * names), so that a launch fills the arguments in the compiled order whatever it is. */
#ifndef BLOCKSPARSE_OPS_SPEC_ARGS_H_
#define BLOCKSPARSE_OPS_SPEC_ARGS_H_

#include <string.h>

#include "bsk.h"

#define BSK_OPS_MAX_ARGS 40

typedef struct {
  int index, arch, nargs;
  int slots[BSK_OPS_MAX_ARGS]; /* the family's value of each argument */
  const char *name;
  const char *problem; /* why the spec cannot run (a static string), or NULL */
} bsk_ops_args;

static inline int bsk_ops_find(const char *const *names, int count, const char *text) {
  for (int i = 0; text && i < count; ++i)
    if (!strcmp(names[i], text)) return i;
  return -1;
}

/* An int / bool key into *out: 1 if present. */
static inline int bsk_ops_int(int spec, const char *key, int *out) {
  int64_t value;
  if (!bsk_spec_key(spec, key, &value, NULL)) return 0;
  *out = (int)value;
  return 1;
}

/* A text key as its index in `names`, or -1. */
static inline int bsk_ops_text(int spec, const char *key, const char *const *names, int count) {
  const char *text = NULL;
  bsk_spec_key(spec, key, NULL, &text);
  return bsk_ops_find(names, count, text);
}

/* Whether spec `index` is one of `family`'s own kernels (not its partial-row sums). */
static inline int bsk_ops_is_kernel(int index, const char *family) {
  const char *product = NULL;
  bsk_spec_key(index, "product", NULL, &product);
  return !strcmp(bsk_spec_family(index), family) && product && strcmp(product, "sum_rows");
}

static inline void bsk_ops_read_args(int index, const char *const *values, int count, bsk_ops_args *a) {
  memset(a, 0, sizeof(*a));
  a->index = index, a->arch = bsk_spec_arch(index), a->name = bsk_spec_name(index);
  a->nargs = bsk_spec_nargs(index);
  if (a->nargs > BSK_OPS_MAX_ARGS) a->problem = "it takes more arguments than its family's C handles";
  for (int i = 0; i < a->nargs && i < BSK_OPS_MAX_ARGS; ++i) {
    const char *name = NULL;
    bsk_spec_arg(index, i, &name, NULL, NULL, NULL);
    if ((a->slots[i] = bsk_ops_find(values, count, name)) < 0)
      a->problem = "its kernel takes an argument its family's C does not know";
  }
}

/* Launch spec `a` with the family's `values` placed in the compiled argument order. */
static inline int bsk_ops_launch(const bsk_ops_args *a, const unsigned grid[3], const bsk_arg *values,
                                 void *stream, char *message, size_t size) {
  bsk_arg args[BSK_OPS_MAX_ARGS];
  for (int i = 0; i < a->nargs; ++i) args[i] = values[a->slots[i]];
  return bsk_launch(a->index, grid, args, a->nargs, stream, message, size);
}

/* How well spec `spec` serves a GPU of `arch`: 0 not at all, else larger is better (the newest
 * compiled arch).  The one place the families' selections ask the runtime's rule. */
static inline int bsk_ops_rank(int spec, int arch) {
  return bsk_spec_rank(spec, arch);
}

static inline int64_t bsk_ops_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline void bsk_ops_ptr(bsk_arg *v, uint64_t address) { v->kind = BSK_ARG_PTR, v->value.ptr = address; }
static inline void bsk_ops_i32(bsk_arg *v, int64_t value) { v->kind = BSK_ARG_I32, v->value.i32 = (int32_t)value; }
static inline void bsk_ops_f32(bsk_arg *v, float value) { v->kind = BSK_ARG_F32, v->value.f32 = value; }

#endif /* BLOCKSPARSE_OPS_SPEC_ARGS_H_ */
