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
