"""Every environment variable blocksparse reads, in one place.

``BLOCKSPARSE_BACKEND``  ``auto`` (default) | ``triton`` | ``reference`` -- which implementation
    serves the ops.  ``auto`` takes the fast GPU path where it can run (a CUDA device and the
    kernels available) and the reference path (framework ops only) everywhere else; the
    block-sparse linear products (TensorFlow's ``BlocksparseMatMul`` and the layers on it, PyTorch's
    ``BlocksparseLinear`` / ``PixelflyLinear``) let the dispatch cost model choose among those that
    can serve (kernels, dense masked product, portable, reference; :mod:`blocksparse.dispatch`).  ``triton``
    insists on the kernels (an error if they cannot run; with ``TRITON_INTERPRET=1`` they run on
    CPU tensors through Triton's interpreter) for the dtypes they take: float32 / float64
    attention, whose kernels are 16-bit, takes the reference path whatever this says.  ``reference`` always takes the reference path.
``BLOCKSPARSE_TF_OPS``  path of the compiled TensorFlow op library to load instead of the one
    shipped in the wheel (development and tests).
``BLOCKSPARSE_KERNELS``  the kernel library (``_kernels.so``) the PyTorch frontend launches
    ahead-of-time compiled kernels from: a path (e.g. one ``python -m blocksparse.aot --library``
    built), or ``jit`` to launch every kernel through Triton's JIT instead.  Unset: the library
    installed in the package (platform wheels), else the JIT.
``BLOCKSPARSE_TORCH_NATIVE``  ``auto`` (default) | ``off`` -- whether eager PyTorch calls that
    the kernel library serves run as one C++ autograd node (``blocksparse/torch/csrc``, compiled
    against the installed torch on first use, about 30 s, and cached) instead of a Python
    ``autograd.Function``.
``BLOCKSPARSE_CONV_WGRAD``  ``auto`` (default) | ``sparse`` | ``dense`` -- the filter gradient of
    the convolution's implicit-GEMM path: the measured table's choice
    (:data:`blocksparse.ops.conv.wgrad.SPARSE_WGRAD_MAX_DENSITY`), the Triton kernel over the present
    blocks, or cuDNN's dense masked one.
``BLOCKSPARSE_PERSISTENT``  ``auto`` (default) | ``off`` -- whether fprop / bprop of regular
    layouts (every output column holding equally many blocks) run persistent programs where the
    tile tables have them (:data:`blocksparse.ops.matmul.configs.PERSISTENT_XPROP`; none is
    shipped until measured on a GPU).
``BLOCKSPARSE_SPLIT_MIN_RUN``  a positive integer: blocks in series before the PyTorch matmul
    plans split a reduction over several programs (read when a call shape is first planned; default
    12 in 16 bits, 4 in float32; 1 splits every run).
``BLOCKSPARSE_ATTENTION_SDPA``  ``auto`` (default) | ``off`` -- whether fused-attention calls on
    layouts that keep every block (or every block up to the diagonal, causal) run PyTorch's dense
    ``scaled_dot_product_attention`` (read at every call).
``BLOCKSPARSE_CACHE_DIR``  where compiled artefacts are cached (default ``~/.cache/blocksparse``).
``TRITON_INTERPRET``  Triton's own switch; read here only to know that kernels may run on CPU.
``BLOCKSPARSE_CUDA_ARCHS``  build time only: the targets the kernel library's kernels are compiled
    for, cubins (``sm_XY``) and the pointer kernels' PTX (``compute_80``), e.g.
    ``sm_80,sm_90,sm_100,sm_120,compute_80`` (the matrix harness sets it per cell; default: the
    cell's ``archs`` in ``matrix.yaml``, else sm_80 and sm_90).
"""
import os
import sys

BACKENDS = ("auto", "triton", "reference")

# ``os.environ``'s own mapping (encoded keys and values): a plain dict lookup where
# ``os.environ.get`` costs microseconds, which the per-call reads of the launch path cannot afford.
_ENVIRON_DATA = getattr(os.environ, "_data", None)
_ENCODED_KEYS = {}
_DECODED = {}


def _compiling():
    """Whether ``torch.compile`` is tracing (its tracer then sees ``os.environ`` reads as such, where
    filling the caches below would make it guard on their contents and fail that guard at once)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def getenv(name, default=None):
    """``os.environ.get(name, default)``, fast: read at every call of the ops, so that a change of
    the environment takes effect at once."""
    if _ENVIRON_DATA is None or _compiling():  # not CPython's os.environ, or traced
        return os.environ.get(name, default)
    key = _ENCODED_KEYS.get(name)
    if key is None:
        key = _ENCODED_KEYS[name] = os.environ.encodekey(name)
    raw = _ENVIRON_DATA.get(key)
    if raw is None:
        return default
    value = _DECODED.get(raw)
    if value is None:
        value = _DECODED[raw] = os.environ.decodevalue(raw)
    return value


_parsed_backend = {}


def backend():
    """The requested backend, validated (read at every call: cheap, a parse per distinct value)."""
    raw = getenv("BLOCKSPARSE_BACKEND", "auto")
    value = _parsed_backend.get(raw)
    if value is None:
        value = raw.strip().lower() or "auto"
        if value not in BACKENDS:
            raise ValueError(f"BLOCKSPARSE_BACKEND must be one of {BACKENDS}; got {value!r}")
        if not _compiling():  # (no cache filled while traced: see _compiling)
            _parsed_backend[raw] = value
    return value


def triton_interpret():
    """True when Triton's interpreter is switched on (kernels run on CPU tensors)."""
    return getenv("TRITON_INTERPRET", "0").strip() not in ("", "0", "false", "False")


def tf_ops_path():
    """Override for the compiled TensorFlow op library, or None."""
    return os.environ.get("BLOCKSPARSE_TF_OPS") or None


#: ``BLOCKSPARSE_KERNELS`` value that switches the kernel library off.
KERNELS_OFF = "jit"


def kernels_path():
    """``BLOCKSPARSE_KERNELS``: a path, :data:`KERNELS_OFF`, or None when unset."""
    value = os.environ.get("BLOCKSPARSE_KERNELS", "").strip()
    return (KERNELS_OFF if value.lower() == KERNELS_OFF else value) or None


def torch_native():
    """``BLOCKSPARSE_TORCH_NATIVE``: True unless ``off`` (or ``0`` / ``false``)."""
    return getenv("BLOCKSPARSE_TORCH_NATIVE", "auto").strip().lower() not in ("off", "0", "false")


#: ``BLOCKSPARSE_CONV_WGRAD`` values.
CONV_WGRAD = ("auto", "sparse", "dense")


def conv_wgrad():
    """``BLOCKSPARSE_CONV_WGRAD``, validated (read at every call)."""
    value = getenv("BLOCKSPARSE_CONV_WGRAD", "auto").strip().lower() or "auto"
    if value not in CONV_WGRAD:
        raise ValueError(f"BLOCKSPARSE_CONV_WGRAD must be one of {CONV_WGRAD}; got {value!r}")
    return value


def attention_sdpa():
    """``BLOCKSPARSE_ATTENTION_SDPA``: True unless ``off`` (or ``0`` / ``false``): whether fused-attention
    calls on layouts that keep every block (or every block up to the diagonal, causal) run PyTorch's
    dense ``scaled_dot_product_attention`` (read at every call)."""
    return getenv("BLOCKSPARSE_ATTENTION_SDPA", "auto").strip().lower() not in ("off", "0", "false")


def persistent_xprop():
    """``BLOCKSPARSE_PERSISTENT``: True unless ``off`` (or ``0`` / ``false``): whether fprop / bprop
    of regular layouts take the persistent kernel where the tile table has one (read when a call's
    launch is planned)."""
    return getenv("BLOCKSPARSE_PERSISTENT", "auto").strip().lower() not in ("off", "0", "false")


def gluon_xprop():
    """``BLOCKSPARSE_GLUON``: True for ``on`` (or ``1`` / ``true``): whether 16-bit fprop / bprop of
    ``(N, F)`` activations on Hopper take the persistent Gluon kernel
    (:mod:`blocksparse.ops.matmul.xprop_gluon`) through Triton's JIT instead of the tables' tiles
    (read when a call's launch is planned; off by default)."""
    return getenv("BLOCKSPARSE_GLUON", "off").strip().lower() in ("on", "1", "true")


def cache_dir():
    """``BLOCKSPARSE_CACHE_DIR``, else ``~/.cache/blocksparse`` (``$XDG_CACHE_HOME`` honoured)."""
    given = os.environ.get("BLOCKSPARSE_CACHE_DIR", "").strip()
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "blocksparse")


def cuda_archs():
    """The architectures asked for by ``BLOCKSPARSE_CUDA_ARCHS`` (text), or None."""
    return os.environ.get("BLOCKSPARSE_CUDA_ARCHS", "").strip() or None
