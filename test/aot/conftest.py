"""The generic AOT tests.  Their toy family imports Triton; folders collected after this one run
kernels through Triton's interpreter, which must be switched on before Triton is first imported:
``torch_setup`` does that (where torch runs without a GPU), so it is imported here first."""
import torch_setup  # noqa: F401
