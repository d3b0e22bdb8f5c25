"""TensorFlow glue of the elementwise family (``blocksparse.ew`` / ``blocksparse.ewops``).

:mod:`.args`    argument checks shared with the norms family (operands, axes, channel vectors)
:mod:`.math`    unary and binary elementwise ops and ``add_n8``, computed in float32
:mod:`.cast`    ``float_cast`` (its gradient rounded to ``dx_dtype``)
:mod:`.dropout` ``dropout`` with a reusable mask

Elementwise ops stay TensorFlow ops on every device: TensorFlow's own kernels stream them at
memory speed, and XLA fuses them.
"""
