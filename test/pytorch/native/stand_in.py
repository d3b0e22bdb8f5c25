"""The stand-in for the kernel library's runtime that the native ops' CPU tests launch: C functions
that record each launch and compute a known function of the pointers they were given, and the
records of them (built and loaded by ``conftest.py``'s ``native`` fixture)."""
import numpy as np
import torch

from blocksparse.torch import _native

FAKE_RUNTIME = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
/* words: [0] elements to write, [1] input (float*), [2] second operand (float*), [3] output
 * (float*), [4] input elements, [5] 1: add to the output (it must have been zero-filled), 2: copy
 * the second operand */
int launches[64], n_launches;
int misaligned;  /* launches given an operand or output not on a 16-byte boundary */
uint64_t memset_counts[64]; int n_memsets;
int fake_launch(int spec, const unsigned *grid, const uint64_t *w, int nargs, void *stream, char *msg, size_t size) {
  if (spec == 99) { snprintf(msg, size, "boom"); return 5; }
  launches[n_launches++ % 64] = spec;
  misaligned += ((w[1] | w[2] | w[3]) & 15) != 0;
  const float *in = (const float *)w[1], *b = (const float *)w[2];
  float *out = (float *)w[3];
  for (uint64_t i = 0; i < w[0]; ++i)
    out[i] = w[5] == 2 ? b[i] : (w[5] ? out[i] : 0.0f) + in[i % w[4]] * (float)spec + b[0];
  return 0;
}
/* tickets: words [0]-[5] as above (mode 0), [6] workspace (float*), [7] counters (int*), [8] / [9]
 * the elements the record asks for; counts a launch whose scratch was not all zero, remembers the
 * workspace's address, and dirties nothing (a real kernel leaves them zero) */
int dirty_scratch; uint64_t last_ws;
int fake_ticket_launch(int spec, const unsigned *grid, const uint64_t *w, int nargs, void *stream, char *msg,
                       size_t size) {
  const float *ws = (const float *)w[6];
  const int *counters = (const int *)w[7];
  for (uint64_t i = 0; i < w[8]; ++i) dirty_scratch += ws[i] != 0.0f;
  for (uint64_t i = 0; i < w[9]; ++i) dirty_scratch += counters[i] != 0;
  last_ws = w[6];
  return fake_launch(spec, grid, w, nargs, stream, msg, size);
}
int fake_memset(uint64_t address, uint32_t value, size_t count, void *stream, char *msg, size_t size) {
  uint32_t *p = (uint32_t *)address;
  for (size_t i = 0; i < count; ++i) p[i] = value;
  memset_counts[n_memsets++ % 64] = count;
  return 0;
}
"""


def record(lib, spec, out_shape, out_elems, in_elems, *, zero=False, dtype=torch.float32, cast_to=None, copy=False):
    """A record of the stand-in ``fake_launch`` (``spec`` its factor): operands 0, 1 and 2 in words
    1, 2 and 3; ``out_elems`` written of an ``out_shape`` output, ``in_elems`` read of operand 0;
    ``zero``: the output zero-filled first and added to, ``copy``: operand 1 copied."""
    words = torch.tensor([out_elems, 0, 0, 0, in_elems, 2 if copy else int(zero)], dtype=torch.int64)
    return torch.ops.blocksparse_native.add_record(
        _native._address(lib.fake_launch), _native._address(lib.fake_memset), spec, [3, 1, 1], words, 6,
        [1, 0, 2, 1, 3, 2], list(out_shape), dtype, zero, cast_to, False)


def expected(a, b, spec, shape):
    """What ``fake_launch`` writes (mode 0) for operands ``a`` and ``b``: ``a``'s elements in row-major
    order, repeated, times ``spec``, plus ``b``'s first element, as ``shape``."""
    flat = a.detach().reshape(-1)
    n = int(np.prod(shape))
    return (flat[torch.arange(n) % flat.numel()] * spec + b.detach().reshape(-1)[0]).reshape(shape)


#: A stand-in for the kernel library's layer-norm entry points (``src/ops/norms.h``, compiled
#: against that header): the float32 formulas on CPU pointers, in double precision, through the
#: workspace the op allocated; selection refuses ``refuse_features`` features, the run fails with
#: a message for float16 (which selection accepts).
FAKE_NORMS = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "norms.h"
int ln_runs[2], refuse_features = -1;
size_t ln_workspace_bytes;
bsk_layer_norm_call ln_last;
uint64_t device_address;  /* the address the last device query was given */
int fake_device(void *stream, uint64_t address, int *arch, int *sms, char *msg, size_t size) {
  device_address = address, *arch = 90, *sms = 4;
  return 0;
}
int fake_ln_select(const bsk_layer_norm_call *c, int backward, int arch) {
  return arch == 90 && c->features != refuse_features ? 3 + backward : -1;
}
int fake_ln_workspace(const bsk_layer_norm_call *c, void *stream, size_t *bytes, char *msg, size_t size) {
  *bytes = ln_workspace_bytes = 2 * sizeof(double) * (size_t)c->features;
  return 0;
}
static size_t at(const bsk_layer_norm_call *c, int64_t n, int64_t f) {
  return c->axis == 1 ? (size_t)(n * c->features + f) : (size_t)(f * c->n_tokens + n);
}
int fake_ln_run(const bsk_layer_norm_call *c, int backward, void *stream, char *msg, size_t size) {
  if (c->dtype != 2) { snprintf(msg, size, "the stand-in takes float32 only (dtype %d)", c->dtype); return 3; }
  ln_last = *c;
  ++ln_runs[!!backward];
  const float *x = (const float *)c->x, *g = (const float *)c->g, *b = (const float *)c->b;
  const int64_t N = c->n_tokens, C = c->features, S = c->segments, CS = C / S;
  double *dg = (double *)c->workspace, *db = dg + C;  /* the partial sums live in the workspace */
  if (backward) memset(dg, 0, 2 * sizeof(double) * (size_t)C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t f0 = s * CS;
      double mean = 0, var = 0, c1 = 0, c2 = 0;
      if (!backward) {
        for (int64_t f = f0; f < f0 + CS; ++f) mean += x[at(c, n, f)];
        mean /= CS;
        for (int64_t f = f0; f < f0 + CS; ++f) var += (x[at(c, n, f)] - mean) * (x[at(c, n, f)] - mean);
        double rstd = 1.0 / sqrt(var / CS + c->epsilon);
        ((float *)c->mean)[s * N + n] = (float)mean, ((float *)c->rstd)[s * N + n] = (float)rstd;
        for (int64_t f = f0; f < f0 + CS; ++f) {
          double y = (x[at(c, n, f)] - mean) * rstd * g[f] + b[f];
          ((float *)c->y)[at(c, n, f)] = (float)(c->relu && y < 0 ? 0 : y);
        }
        continue;
      }
      mean = ((const float *)c->mean)[s * N + n];
      double rstd = ((const float *)c->rstd)[s * N + n];
      const float *dy = (const float *)c->dy;
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t f = f0; f < f0 + CS; ++f) {
          double xhat = (x[at(c, n, f)] - mean) * rstd, d = dy[at(c, n, f)];
          if (c->relu && xhat * g[f] + b[f] <= 0) d = 0;
          if (pass == 0) { c1 += xhat * d * g[f] / CS; c2 += d * g[f] / CS; continue; }
          ((float *)c->dx)[at(c, n, f)] = (float)((d * g[f] - xhat * c1 - c2) * rstd);
          dg[f] += d * xhat, db[f] += d;
        }
    }
  if (backward)
    for (int64_t f = 0; f < C; ++f) ((float *)c->dg)[f] = (float)dg[f], ((float *)c->db)[f] = (float)db[f];
  return 0;
}
"""


def norms_entry(lib):
    """The native op's entry id of the stand-in ``lib`` (``FAKE_NORMS`` built)."""
    return torch.ops.blocksparse_native.norms_entry(
        *(_native._address(getattr(lib, name)) for name in ("fake_ln_run", "fake_ln_workspace", "fake_ln_select",
                                                             "fake_device")))


#: A stand-in for the kernel library's LSTM-gates entry points (``src/ops/norms.h``): the float32
#: formulas on CPU pointers, in double precision, the bias's gradient through the workspace.
FAKE_GATES = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "norms.h"
int gate_runs[2], refuse_gate_features = -1;
bsk_lstm_gates_call gates_last;
static double sig(double v) { return 1.0 / (1.0 + exp(-v)); }
int fake_gate_device(void *stream, uint64_t address, int *arch, int *sms, char *msg, size_t size) {
  *arch = 90, *sms = 4;
  return 0;
}
int fake_gates_select(const bsk_lstm_gates_call *c, int backward, int arch) {
  return c->features != refuse_gate_features ? 5 + backward : -1;
}
int fake_gates_workspace(const bsk_lstm_gates_call *c, void *stream, size_t *bytes, char *msg, size_t size) {
  *bytes = c->bias ? 4 * sizeof(double) * (size_t)c->features : 0;
  return 0;
}
/* gate g of token n, feature f: merged (N, 4K) at p[0], or four (N, K) tensors */
static size_t gate_at(const bsk_lstm_gates_call *c, int g, int64_t n, int64_t f) {
  return c->merged ? (size_t)(n * 4 * c->features + g * c->features + f) : (size_t)(n * c->features + f);
}
int fake_gates_run(const bsk_lstm_gates_call *c, int backward, void *stream, char *msg, size_t size) {
  if (c->dtype != 2) { snprintf(msg, size, "the stand-in takes float32 only (dtype %d)", c->dtype); return 3; }
  gates_last = *c;
  ++gate_runs[!!backward];
  const int64_t N = c->n_tokens, K = c->features;
  const uint64_t in[4] = {c->i, c->merged ? c->i : c->j, c->merged ? c->i : c->f, c->merged ? c->i : c->o};
  const uint64_t out[4] = {c->di, c->merged ? c->di : c->dj, c->merged ? c->di : c->df, c->merged ? c->di : c->d_o};
  const float *bias = (const float *)c->bias, *cs = (const float *)c->c;
  double *dbias = (double *)c->workspace;
  if (backward && c->bias) memset(dbias, 0, 4 * sizeof(double) * (size_t)K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < K; ++f) {
      double pre[4];
      for (int g = 0; g < 4; ++g)
        pre[g] = ((const float *)in[g])[gate_at(c, g, n, f)] + (bias ? bias[g * K + f] : 0.0);
      double i = sig(pre[0]), j = tanh(pre[1]), fg = sig(pre[2] + c->forget_bias), o = sig(pre[3]);
      double cc = cs[n * K + f], cn = fg * cc + i * j, t = tanh(cn);
      if (!backward) {
        ((float *)c->c_next)[n * K + f] = (float)cn, ((float *)c->h_next)[n * K + f] = (float)(o * t);
        continue;
      }
      double dh = ((const float *)c->dh_next)[n * K + f];
      double dcn = ((const float *)c->dc_next)[n * K + f] + dh * o * (1 - t * t);
      double d[4] = {dcn * j * i * (1 - i), dcn * i * (1 - j * j), dcn * cc * fg * (1 - fg), dh * t * o * (1 - o)};
      for (int g = 0; g < 4; ++g) {
        ((float *)out[g])[gate_at(c, g, n, f)] = (float)d[g];
        if (c->bias) dbias[g * K + f] += d[g];
      }
      ((float *)c->dc)[n * K + f] = (float)(dcn * fg);
    }
  if (backward && c->bias)
    for (int64_t f = 0; f < 4 * K; ++f) ((float *)c->dbias)[f] = (float)dbias[f];
  return 0;
}
"""


def gates_entry(lib):
    """The native op's entry id of the stand-in ``lib`` (``FAKE_GATES`` built)."""
    return torch.ops.blocksparse_native.lstm_gates_entry(
        *(_native._address(getattr(lib, name)) for name in ("fake_gates_run", "fake_gates_workspace",
                                                             "fake_gates_select", "fake_gate_device")))
