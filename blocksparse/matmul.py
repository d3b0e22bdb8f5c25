"""Block-sparse matrix multiplication for TensorFlow (the original ``blocksparse.matmul`` API).

>>> import numpy as np, tensorflow as tf
>>> from blocksparse.matmul import BlocksparseMatMul
>>> bsmm = BlocksparseMatMul(np.eye(4, dtype=int), block_size=8)   # C = K = 32, 4 blocks
>>> w = tf.Variable(bsmm.identity_init()(bsmm.w_shape, tf.float32))
>>> x = tf.ones(bsmm.i_shape(2))
>>> y = bsmm(x, w)
>>> y.shape, bool(tf.reduce_all(y == x))
(TensorShape([2, 32]), True)

Works in TF2 eager mode, inside ``tf.function`` (the minibatch may be unknown) and in
``tf.compat.v1`` graphs.  Needs TensorFlow >= 2.16: ``pip install blocksparse[tensorflow]`` (or
``blocksparse[tensorflow-cpu]``).  The products run on the reference path (TensorFlow ops only)
unless a faster one is available; ``BLOCKSPARSE_BACKEND`` picks (see :mod:`blocksparse._env`).
"""
import numbers
from collections.abc import Iterable

import numpy as np

from ._checks import check_bool
from ._frontend import LayoutShapes, check_feature_axis
from ._initializers import identity_blocks, ortho_blocks
from ._tf import tf
from ._tf import checks
from ._tf.ew.args import channel_vector
from ._tf.device import in_xla
from ._tf.matmul import autodiff, backend, graph_edit, grouping, sparse_proj, weights
from .dispatch import check_cost_model, check_impl
from .layout import BLOCK_SIZES, Layout

__all__ = ["BlocksparseMatMul", "SparseProj", "add_control_input", "get_parents", "group_param_grads",
           "largest_block"]


def _check_int(value, name, low, high=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {value!r} of type {type(value).__name__}")
    value = int(value)
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be {allowed}; got {value}")
    return value


def _minibatch(N):
    """``N`` of the shape helpers: None, an int >= 0 or an integer scalar tensor (passed through)."""
    t = checks.tensor_like(N)
    if t is not None and t.dtype.is_integer and t.shape.rank == 0:
        return t
    return None if N is None else _check_int(N, "N", 0)


class BlocksparseMatMul(LayoutShapes):
    """``y = x @ W`` for a weight ``W`` of shape ``(C, K)`` made of ``bs x bs`` blocks.

    The object holds the layout only; weights are separate tensors, so several weights can
    share one object (and its layout).

    Parameters
    ----------
    layout : array_like, shape (CB, KB)
        0/1 (or boolean) block mask; ``layout[c, k] == 1`` where block ``(c, k)`` exists.
        ``C = CB * block_size`` inputs, ``K = KB * block_size`` outputs.
    block_size : int
        Block edge: 8, 16, 32, 64 or 128 (on either feature axis).
    feature_axis : {1, 0}
        1: activations are ``(N, C) -> (N, K)``; 0: ``(C, N) -> (K, N)``.
    z_order : bool
        Number the blocks of ``W`` in Morton order instead of row-major order.
    name : str, optional
        Name scope of the ops (default ``"BlocksparseMatMul"``).
    impl : str
        Which implementation computes the products: ``"auto"`` (default: the cost model of
        :mod:`blocksparse.dispatch` chooses when each op is built, on every device),
        ``"kernels"`` (the GPU op library), ``"portable"``, ``"dense"`` or ``"reference"``.
        :meth:`plan` says what runs and why.  ``BLOCKSPARSE_BACKEND=reference|triton`` wins.
    cost_model : blocksparse.dispatch.CostModel, optional
        The measured table ``impl="auto"`` chooses from (default: the shipped tables of
        :mod:`blocksparse.dispatch`, ``tensorflow-<device>``).

    Attributes
    ----------
    layout : blocksparse.layout.Layout
        The validated layout (block order, lookup tables).
    w_shape : tuple
        ``(blocks, block_size, block_size)``, the packed weight: ``W[b]`` is block
        ``block_coord(b)``, rows along ``C``.
    blocks, C, K, CB, KB, bsize, block_size, axis, z_order, name
        As above; ``bsize`` (the original's name) and ``block_size`` are the block size, ``axis`` the
        feature axis.
    sparsity : float
        Fraction of the layout's blocks present, ``blocks / (CB * KB)`` (the original's name).
    flops : int
        Multiply-adds times two of one product per minibatch row: ``2 * blocks * bs * bs``.
    """

    def __init__(self, layout, block_size=32, feature_axis=1, z_order=False, name=None, *, impl="auto",
                 cost_model=None):
        self.impl = check_impl(impl)
        self.cost_model = check_cost_model(cost_model)
        self.axis = check_feature_axis(feature_axis)
        check_bool(z_order, "z_order")
        self.layout = Layout(layout, block_size, z_order=bool(z_order))
        self.z_order = self.layout.z_order
        self.name = checks.op_name(name, "BlocksparseMatMul")
        self.bsize = self.block_size = self.layout.block_size
        self.blocks = self.layout.blocks
        self.CB, self.KB = self.layout.CB, self.layout.KB
        self.C, self.K = self.layout.C, self.layout.K
        self.w_shape = self.layout.w_shape
        self.sparsity = self.layout.density
        self.flops = 2 * self.blocks * self.bsize * self.bsize

    def __getstate__(self):
        return (self.layout.mask, self.bsize, self.axis, self.z_order, self.name, self.impl, self.cost_model)

    def __setstate__(self, state):
        # pickles made before impl= have 5 fields, before cost_model= 6
        mask, bsize, axis, z_order, name, *rest = state
        rest += ["auto", None][len(rest):]
        self.__init__(mask, bsize, axis, z_order, name, impl=rest[0], cost_model=rest[1])

    def __repr__(self):
        return (f"BlocksparseMatMul(C={self.C}, K={self.K}, block_size={self.bsize}, "
                f"blocks={self.blocks}, feature_axis={self.axis}, z_order={self.z_order}, "
                f"name={self.name!r}, impl={self.impl!r})")

    def i_shape(self, N):
        """Shape of the input activations: ``(N, C)`` (feature_axis=1) or ``(C, N)``.

        ``N``: the minibatch, an int >= 0, an integer scalar tensor (e.g. ``tf.shape(x)[0]``) or
        None (unknown, for placeholders and input signatures).
        """
        return super().i_shape(_minibatch(N))

    def o_shape(self, N):
        """Shape of the output activations: ``(N, K)`` (feature_axis=1) or ``(K, N)``; ``N`` as
        in :meth:`i_shape`."""
        return super().o_shape(_minibatch(N))

    def plan(self, N=None, dtype=tf.float32):
        """What computes a product of minibatch ``N`` in ``dtype``, and why: a
        :class:`blocksparse.dispatch.Plan` (``N=None``: the default minibatch of the model)."""
        dtype = checks.float_dtype(dtype, "dtype")
        if N is not None:
            N = _check_int(N, "N", 1)
        return backend.plan(self.layout, self.axis, dtype, N, self.impl, self.cost_model)[0]

    def ortho_init(self):
        """Initializer: random orthonormal columns within each layout column (see below).

        Returns a callable ``init(shape, dtype=tf.float32, partition_info=None)`` usable as
        ``tf.compat.v1.get_variable(..., initializer=init)`` or ``tf.Variable(init(w_shape))``.
        Seed it with ``np.random.seed``.  For a sparse layout the blocks of each layout column,
        stacked, have orthonormal columns; for a dense one the whole ``(C, K)`` matrix is
        semi-orthogonal.
        """
        return weights.NumpyInitializer(lambda: ortho_blocks(self.layout), self.w_shape,
                                        "ortho_init")

    def identity_init(self, gpu=False):
        """Initializer: identity blocks where ``c % KB == k % CB``, zeros elsewhere.

        ``gpu`` is accepted for compatibility; the values are the same wherever they are made.
        """
        check_bool(gpu, "gpu")
        return weights.NumpyInitializer(lambda: identity_blocks(self.layout), self.w_shape,
                                        "identity_init")

    def l2_normalize(self, W, gain=None, epsilon=1e-6, dtype=np.float32):
        """Weight normalisation: each output feature scaled to unit L2 norm (times ``gain``).

        Parameters
        ----------
        W : tensor, shape ``w_shape``
            Packed weight (float32, float16 or bfloat16).
        gain : tensor, shape ``(K,)``, optional
            Per-output-feature scale applied after normalising (any float dtype: numpy arrays and
            float64 tensors are converted to float32; shape ``(1, K)`` or ``(K, 1)`` is flattened).
        epsilon : float
            Lower bound of the squared norm (guards empty or zero columns).
        dtype : dtype
            Dtype of the result (float32, float16 or bfloat16).

        Returns
        -------
        tensor, shape ``w_shape``
            ``W[b, :, j] / max(||column k*bs + j of the dense W||, sqrt(epsilon))`` for block
            ``b`` in layout column ``k``; differentiable.
        """
        W = checks.float_tensor(W, "W")
        epsilon = checks.positive_float(epsilon, "epsilon")
        dtype = checks.float_dtype(dtype, "dtype")
        with tf.name_scope(self.name + "_l2_normalize"):
            W = checks.check_shape(W, self.w_shape, "W")
            if gain is not None:
                gain = channel_vector(gain, self.K, "gain", "K, the output features")
            return weights.l2_normalize(W, self.layout, gain, epsilon, dtype)

    def __call__(self, I, W, dw_dtype=tf.float32, name=None):
        """The product: ``I @ W`` (feature_axis=1) or ``W.T @ I`` (feature_axis=0).

        Parameters
        ----------
        I : tensor, shape ``i_shape(N)``
            Activations, float32 / float16 / bfloat16; ``N`` may be unknown in graphs.
        W : tensor or variable, shape ``w_shape``
            Packed weight, same dtype as ``I``.
        dw_dtype : dtype
            Dtype of the weight gradient: float32 (default), float16 or bfloat16.  Where ``W``
            also gets gradients from other ops (a regularizer, ``l2_normalize``, a use with another
            ``dw_dtype``), give ``W``'s own dtype: TensorFlow adds gradients of one dtype only.
            Under persistent or nested tapes and in higher-order gradients, the terms of ``W``'s
            gradient that come through ``dI`` are cast to ``dw_dtype`` too.
        name : str, optional
            Name scope of the ops (default: the object's ``name``).

        Returns
        -------
        tensor, shape ``o_shape(N)``, dtype of ``I``
            Accumulated in float32.  Gradients: ``dI`` in the dtype of ``I``, ``dW`` in
            ``dw_dtype``.
        """
        dw_dtype = checks.float_dtype(dw_dtype, "dw_dtype")
        I = checks.float_tensor(I, "I")
        W = checks.float_tensor(W, "W")
        checks.same_dtype(I, W, "I", "W")
        tokens = tf.compat.dimension_value(I.shape[1 - self.axis]) if I.shape.rank == 2 else None
        products = backend.choose(self.layout, self.axis, I.dtype, tokens, self.impl, self.cost_model)
        with tf.name_scope(checks.op_name(name, self.name)):
            hint = f" = {'(N, C)' if self.axis else '(C, N)'} for feature_axis={self.axis}"
            I = checks.check_shape(I, self.i_shape(None), "I", rank_hint=hint)
            W = checks.check_shape(W, self.w_shape, "W", rank_hint=" = (blocks, bs, bs)")
            return autodiff.matmul(I, W, self.layout, self.axis, dw_dtype, products)


def group_param_grads(param_grad, group_size=8, cast32=True):
    """Merge the per-use weight gradients of a block-sparse weight into fewer, larger products.

    When a weight is used by several block-sparse matmuls (an unrolled RNN uses it at every
    time step), its gradient is a sum of one dW product per use.  In graph mode
    (``tf.compat.v1`` graphs, ``tf.gradients``, ``tf.function``) this returns an equal gradient
    in which the products of each layout are merged ``group_size`` at a time (their activations
    and output gradients concatenated along the minibatch), which is faster on a GPU.  Nothing
    else in the graph changes.  A gradient with nothing to merge, or an eager value, is
    returned as it is.

    Parameters
    ----------
    param_grad : tf.Tensor
        The gradient of one weight, as returned by ``tf.gradients`` / ``GradientTape.gradient``.
    group_size : int
        How many products to merge into one, 1..8.
    cast32 : bool
        Return float16 / bfloat16 gradients (``dw_dtype``) cast to float32, as the original
        package did so that optimizers see float32; other dtypes are returned unchanged.

    Returns
    -------
    tf.Tensor
        A gradient equal to ``param_grad`` (up to float rounding of the regrouped sums).
    """
    # ValueError for any value outside 1..8, of any type, as before (callers catch that)
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) \
            or not 1 <= group_size <= 8:
        raise ValueError(f"group_size must be an int in 1..8; got {group_size!r}")
    check_bool(cast32, "cast32")
    if not isinstance(param_grad, tf.Tensor):
        raise TypeError(f"param_grad must be a dense tf.Tensor (the gradient of a block-sparse "
                        f"weight); got {type(param_grad).__name__}")
    return grouping.group_param_grads(param_grad, int(group_size), bool(cast32))


class SparseProj:
    """Dense-to-sparse and sparse-to-dense projections along the feature axis 0.

    A one-to-one map between ``nproj`` of the ``nhidden`` features (rows of a ``(nhidden, ...)``
    tensor) and the rows of a ``(nproj, ...)`` tensor.  Exactly one of ``nproj``,
    ``proj_stride`` or ``gather_lut`` chooses the features.

    Parameters
    ----------
    nhidden : int
        Size of the large feature axis.
    nproj : int, optional
        Pick ``nproj`` features at random (numpy's global generator), sorted.
    proj_stride : int, optional
        Pick every ``proj_stride``-th feature, keeping a multiple of ``block_size`` of them.
    block_size : int
        Granularity of ``proj_stride`` selections.
    gather_lut : array_like of int, optional
        The features to pick, distinct, in ``[0, nhidden)``; ``nproj = len(gather_lut)``.
    name : str, optional
        Name scope of the ops (default ``"SparseProj"``).

    Attributes
    ----------
    gather_lut : np.ndarray, shape (nproj,)
        Feature of ``nhidden`` behind each projected row.
    scatter_lut : np.ndarray, shape (nhidden,)
        Projected row of each feature, ``-1`` where none.
    """

    def __init__(self, nhidden, nproj=None, proj_stride=None, block_size=32, gather_lut=None,
                 name=None):
        self.nhidden = _check_int(nhidden, "nhidden", 1)
        block_size = _check_int(block_size, "block_size", 1)
        self.name = checks.op_name(name, "SparseProj")
        if gather_lut is not None:
            gather_lut = self._check_gather_lut(gather_lut)
            if nproj is not None and _check_int(nproj, "nproj", 1) != gather_lut.size:
                raise ValueError(f"nproj must equal len(gather_lut) = {gather_lut.size} when both "
                                 f"are given; got {nproj}")
            if proj_stride is not None:
                raise ValueError("give one of nproj, proj_stride or gather_lut; got proj_stride "
                                 "and gather_lut")
        elif nproj is not None:
            if proj_stride is not None:
                raise ValueError("give one of nproj, proj_stride or gather_lut; got nproj and "
                                 "proj_stride")
            nproj = _check_int(nproj, "nproj", 1, self.nhidden)
            gather_lut = np.sort(np.random.permutation(self.nhidden)[:nproj])
        elif proj_stride is not None:
            proj_stride = _check_int(proj_stride, "proj_stride", 1, self.nhidden)
            count = (self.nhidden // proj_stride) // block_size * block_size
            if count == 0:
                raise ValueError(f"proj_stride={proj_stride} with block_size={block_size} selects "
                                 f"no feature of nhidden={self.nhidden}: it needs nhidden >= "
                                 f"proj_stride * block_size = {proj_stride * block_size}")
            gather_lut = np.arange(count) * proj_stride
        else:
            raise ValueError("SparseProj needs one of nproj, proj_stride or gather_lut; got none")
        self.gather_lut = np.ascontiguousarray(gather_lut, dtype=np.int32)
        self.nproj = int(self.gather_lut.size)
        self.scatter_lut = np.full(self.nhidden, -1, dtype=np.int32)
        self.scatter_lut[self.gather_lut] = np.arange(self.nproj, dtype=np.int32)
        self.gather_lut.setflags(write=False)
        self.scatter_lut.setflags(write=False)

    def _check_gather_lut(self, gather_lut):
        lut = np.asarray(gather_lut)
        if lut.ndim != 1 or lut.size == 0:
            raise ValueError(f"gather_lut must be a non-empty 1-D array of feature indices; got "
                             f"shape {lut.shape}")
        if not np.issubdtype(lut.dtype, np.integer):
            raise TypeError(f"gather_lut must hold ints; got dtype {lut.dtype}")
        bad = (lut < 0) | (lut >= self.nhidden)
        if bad.any():
            raise ValueError(f"gather_lut values must be in [0, {self.nhidden}); got "
                             f"{lut[bad][:5].tolist()}")
        if np.unique(lut).size != lut.size:
            raise ValueError("gather_lut must not repeat a feature (the map is one-to-one); got "
                             f"{lut.size - np.unique(lut).size} repeat(s)")
        return lut

    def __getstate__(self):
        return (self.nhidden, self.nproj, self.gather_lut, self.name)

    def __setstate__(self, state):
        nhidden, nproj, gather_lut, name = state
        self.__init__(nhidden, nproj=nproj, gather_lut=gather_lut, name=name)

    def _arg(self, value, rows, name):
        x = checks.float_tensor(value, name)
        if x.shape.rank == 0:
            raise ValueError(f"{name} must have rank >= 1 with {rows} rows on axis 0; got a scalar")
        known = tf.compat.dimension_value(x.shape[0]) if x.shape.rank is not None else None
        if known is not None:
            if known != rows:
                raise ValueError(f"{name} must have {rows} rows on axis 0; got shape "
                                 f"{tuple(x.shape.as_list())}")
            return x
        if tf.executing_eagerly():
            return x
        message = f"{name} must have {rows} rows on axis 0"
        # (rank unknown: the shape padded with a zero, which slices whatever the rank, a scalar's to 0)
        size = tf.shape(x)[0] if x.shape.rank is not None else tf.pad(tf.shape(x), [[0, 1]])[0]
        x = checks.checked(x, [tf.debugging.assert_equal(size, rows, message=message)])
        if not in_xla():  # (an EnsureShape or a reshape here would let Grappler fold the assertion away)
            return x
        # XLA drops assertions: an EnsureShape, or (rank unknown) a reshape to `rows` rows, which
        # fails where the sizes differ
        if x.shape.rank is not None:
            return tf.ensure_shape(tf.identity(x, name=checks.node_name(name)), [rows] + [None] * (x.shape.rank - 1))
        return tf.reshape(x, tf.concat([[rows], tf.shape(x)[1:]], 0), name=checks.node_name(message))

    def _pair(self, x, y):
        x = self._arg(x, self.nhidden, "x")
        y = self._arg(y, self.nproj, "y")
        checks.same_dtype(x, y, "x", "y")
        if x.shape.rank is not None and y.shape.rank is not None \
                and not x.shape[1:].is_compatible_with(y.shape[1:]):
            raise ValueError(f"x and y must have the same shape after axis 0; got x "
                             f"{tuple(x.shape.as_list())} and y {tuple(y.shape.as_list())}")
        if not (x.shape[1:].is_fully_defined() and y.shape[1:].is_fully_defined()):
            y = checks.same_trailing(y, x, "y", "the shape of x after axis 0")  # else y would broadcast
        return x, y

    def gather(self, x):
        """``x[gather_lut]``: ``(nhidden, ...) -> (nproj, ...)``."""
        with tf.name_scope(self.name + "_gather"):
            return sparse_proj.gather(self._arg(x, self.nhidden, "x"), self.gather_lut, self.nhidden)

    def scatter(self, x):
        """``(nproj, ...) -> (nhidden, ...)``: row ``gather_lut[i]`` is ``x[i]``, others zero."""
        with tf.name_scope(self.name + "_scatter"):
            return sparse_proj.scatter(self._arg(x, self.nproj, "x"), self.gather_lut, self.nhidden)

    def scatter_add(self, x, y):
        """``x`` with ``y[i]`` added to row ``gather_lut[i]``; ``x``: (nhidden, ...), ``y``: (nproj, ...)."""
        with tf.name_scope(self.name + "_scatter_add"):
            x, y = self._pair(x, y)
            return sparse_proj.scatter_add(x, y, self.gather_lut, self.nhidden)

    def scatter_mul(self, x, y):
        """``x`` with row ``gather_lut[i]`` multiplied by ``y[i]``; other rows unchanged."""
        with tf.name_scope(self.name + "_scatter_mul"):
            x, y = self._pair(x, y)
            return sparse_proj.scatter_mul(x, y, self.gather_lut, self.nhidden)


def largest_block(dim, *, block_sizes=(32, 16, 8)):
    """The largest block size that divides ``dim``, and the number of blocks.

    Parameters
    ----------
    dim : int
        A feature dimension (> 0).
    block_sizes : sequence of int, keyword-only
        Candidates, tried largest first; the original's 32, 16, 8 by default (64 and 128 are
        also block sizes here: pass them to allow larger blocks).

    Returns
    -------
    (block_size, dim // block_size)

    >>> largest_block(96), largest_block(40)
    ((32, 3), (8, 5))
    """
    dim = _check_int(dim, "dim", 1)
    if isinstance(block_sizes, (str, bytes)) or not isinstance(block_sizes, Iterable):
        raise TypeError(f"block_sizes must be a sequence of ints (block sizes of {BLOCK_SIZES}); got "
                        f"{block_sizes!r}")
    sizes = sorted({_check_int(b, "block_sizes", 1) for b in block_sizes}, reverse=True)
    if not sizes or any(b not in BLOCK_SIZES for b in sizes):
        raise ValueError(f"block_sizes must be a non-empty subset of {BLOCK_SIZES}; got {tuple(block_sizes)}")
    for size in sizes:
        if dim % size == 0:
            return size, dim // size
    raise ValueError(f"dim must be a multiple of one of the block sizes {tuple(sizes)}; got {dim}")


def _graph_op(value, name):
    """The graph op of ``value`` (an op, a graph tensor or a variable update in a graph)."""
    if isinstance(value, tf.Operation):
        return value
    op = getattr(value, "op", None)  # graph tensors and variable updates; eager tensors have none
    if isinstance(op, tf.Operation):
        return op
    raise TypeError(f"{name} must be a graph tensor or op (tf.compat.v1 graphs, tf.function); got "
                    f"{type(value).__name__}: eager execution has no ops")


def get_parents(grad, op_type):
    """The ops of type ``op_type`` that the tensor ``grad`` is computed from.

    Walks back through data inputs, nearest ops first, and stops at each op found (the original's
    helper, e.g. ``get_parents(h_grad, "BlocksparseMatmulDX")`` to find the products behind a
    gradient).  ``BlocksparseMatmulDX`` / ``BlocksparseMatmulDW`` find the block-sparse matmul's
    gradient products on the GPU path (ops of those types) and on the reference path (``Identity``
    ops of those names that end them).

    Parameters
    ----------
    grad : graph tensor or tf.Operation
    op_type : str
        An op type, e.g. ``"MatMul"``.

    Returns
    -------
    list of tf.Operation
        ``[grad.op]`` when that op has the type; empty when none is found.
    """
    if not isinstance(op_type, str) or not op_type:
        raise TypeError(f"op_type must be a non-empty str; got {op_type!r}")
    return graph_edit.get_parents(_graph_op(grad, "grad"), op_type)


def add_control_input(op, control_input):
    """Make the existing op ``op`` run only after ``control_input`` (a control dependency added
    after the fact, as the original's examples do to delay a product until it is needed).

    Parameters
    ----------
    op, control_input : tf.Operation or graph tensor (its op)
        Of the same graph.  ``control_input`` must not depend on ``op`` (that would deadlock):
        ``ValueError`` says so.
    """
    op = _graph_op(op, "op")
    control_input = _graph_op(control_input, "control_input")
    if op.graph is not control_input.graph:
        raise ValueError(f"op and control_input must belong to the same graph; {op.name!r} and "
                         f"{control_input.name!r} do not")
    graph_edit.add_control_input(op, control_input)
