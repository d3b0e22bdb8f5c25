"""Fixes for Triton's CPU interpreter, applied only when it runs (``TRITON_INTERPRET=1``).

Triton 3.6's interpreter stores bfloat16 as raw ``uint16`` and its ``tl.dot`` multiplies those
integers, so a bfloat16 dot returns garbage instead of failing.  The kernels are unchanged; this
widens bfloat16 dot operands to float32 (exact: bfloat16 is the top half of a float32) before the
interpreter multiplies them.  Its builder also lacks the tensor descriptors' reduce-add
(``desc.atomic_add``, a bulk copy-engine reduction on the GPU): here it is the masked element
atomics of the same tile.  GPU compilation never goes through this code.
"""
import numpy as np


def patch_bf16_dot():
    """Idempotently wrap the interpreter's ``create_dot`` so bfloat16 operands are widened."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_blocksparse_bf16", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (_widen(t, interpreter) for t in (a, b))
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._blocksparse_bf16 = True
    builder.create_dot = create_dot


def patch_descriptor_reduce():
    """Idempotently give the interpreter's builder ``create_descriptor_reduce`` (add only)."""
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if hasattr(builder, "create_descriptor_reduce"):
        return

    def create_descriptor_reduce(self, kind, desc, value, indices):
        if kind != ir.DESCRIPTOR_REDUCE_KIND.ADD:
            raise NotImplementedError(f"descriptor reduce {kind} in the interpreter")
        ptrs, mask = desc.materialize_pointers(indices)
        return self.create_atomic_rmw(ir.ATOMIC_OP.FADD if value.dtype.scalar.is_floating() else ir.ATOMIC_OP.ADD,
                                      ptrs, value, mask, ir.MEM_SEMANTIC.RELAXED, ir.MEM_SYNC_SCOPE.GPU)

    builder.create_descriptor_reduce = create_descriptor_reduce


def _widen(handle, interpreter):
    import triton.language as tl

    if handle.dtype.scalar != tl.bfloat16:
        return handle
    bits = handle.data.astype(np.uint32) << np.uint32(16)
    return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
