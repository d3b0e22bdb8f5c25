"""Spatial arithmetic of the block-sparse convolution: dimensions, padding and output sizes.

Every convolution here, and every transposed one, is described by the forward relation on each
spatial axis between an *image* of ``X`` positions and an *output* of ``Q`` positions: tap ``t``
(``0 <= t < S``) of output ``q`` reads image position ``q * stride - pad + t * dilate``; positions
outside ``[0, X)`` read zeros.  A convolution maps the image (its input, ``DHW``) to the output
(``MPQ``); a transposed convolution (deconvolution) maps the output side (its input, ``DHW``) back
to the image side (its output, ``MPQ``).

Padding (``S_eff = (S - 1) * dilate + 1``, the dilated filter's extent):

``"SAME"``   ``pad = (S_eff - 1) // 2`` before the image, ``Q = ceil(X / stride)``.  For odd
             ``S_eff`` this is the original package's symmetric padding (and PyTorch's
             ``padding=S_eff // 2``); an even ``S_eff`` pads one less before than after, so that
             "same" really keeps the size at stride 1 (TensorFlow's choice there).
``"VALID"``  no padding, ``Q = (X - S_eff) // stride + 1``.
explicit     ``p`` (both sides) or ``(before, after)`` per axis,
             ``Q = (X + before + after - S_eff) // stride + 1``.

A transposed convolution of input size ``Q`` can produce every image size ``X`` whose forward
convolution gives ``Q`` back (a range of ``stride`` sizes at most).  ``MPQ`` picks one; by default
the size nearest to ``Q * stride`` in that range (the input upsampled by the stride: TensorFlow's
``SAME``/``VALID`` transposed sizes, and PyTorch's for the usual ``kernel 4, stride 2, pad 1``).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["Axis", "Geometry", "make_geometry", "PADDING_MODES"]

PADDING_MODES = ("SAME", "VALID")
_MAX_DIMS = 3


@dataclass(frozen=True)
class Axis:
    """One spatial axis of the forward relation ``image (X) -> output (Q)`` (see the module)."""

    taps: int     # S
    image: int    # X
    out: int      # Q
    stride: int
    dilate: int
    pad: int      # zeros before the image

    @property
    def extent(self):
        """``S_eff``: positions one output's taps span."""
        return (self.taps - 1) * self.dilate + 1

    @property
    def span(self):
        """Length of the padded image the windows cover: ``(Q - 1) * stride + S_eff``."""
        return (self.out - 1) * self.stride + self.extent

    @property
    def pad_after(self):
        """Zeros the windows read after the image (negative: trailing positions no window reads)."""
        return self.span - self.pad - self.image

    def outside(self):
        """``(Q, S)`` bool: which taps of each output fall outside the image."""
        pos = np.arange(self.out)[:, None] * self.stride - self.pad + np.arange(self.taps) * self.dilate
        return (pos < 0) | (pos >= self.image)

    def outside_transposed(self):
        """``(X, S)`` bool: for each image position, the taps that would reach it from an output
        position outside ``[0, Q)`` (a tap that only lands between strided outputs does not count)."""
        j = np.arange(self.image)[:, None] + self.pad - np.arange(self.taps) * self.dilate
        q, hit = np.divmod(j, self.stride)
        return (hit == 0) & ((q < 0) | (q >= self.out))


@dataclass(frozen=True)
class Geometry:
    """The spatial side of a (transposed) convolution: one :class:`Axis` per spatial dimension."""

    axes: tuple
    transposed: bool

    @property
    def ndim(self):
        return len(self.axes)

    @property
    def TRS(self):
        return tuple(a.taps for a in self.axes)

    @property
    def DHW(self):
        """Spatial size of the op's input."""
        return tuple(a.out if self.transposed else a.image for a in self.axes)

    @property
    def MPQ(self):
        """Spatial size of the op's output."""
        return tuple(a.image if self.transposed else a.out for a in self.axes)

    @property
    def strides(self):
        return tuple(a.stride for a in self.axes)

    @property
    def dilates(self):
        return tuple(a.dilate for a in self.axes)

    @property
    def pads(self):
        """``(before, after)`` zeros per axis around the image (``after`` may be negative)."""
        return tuple((a.pad, a.pad_after) for a in self.axes)

    @property
    def trs(self):
        return int(np.prod(self.TRS))


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _sequence(value, name):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a tuple of 1 to {_MAX_DIMS} ints; got {value!r}")
    return tuple(value)


#: The largest size, stride, dilation or padding an axis takes (the kernels index in int32).
_MAX_SIZE = 2**31 - 1


def _dims(value, name):
    dims = _sequence(value, name)
    if not 1 <= len(dims) <= _MAX_DIMS:
        raise ValueError(f"{name} must have 1 to {_MAX_DIMS} dimensions; got {len(dims)}: {value!r}")
    for d in dims:
        if not _is_int(d):
            raise TypeError(f"{name} must hold ints; got {value!r}")
        if d < 1:
            raise ValueError(f"{name} must hold sizes >= 1; got {value!r}")
        if d > _MAX_SIZE:
            raise ValueError(f"{name} must hold sizes <= 2**31 - 1; got {value!r}")
    return tuple(int(d) for d in dims)


def _per_axis(value, name, ndim, neutral=None):
    """An int for every axis, or a sequence of ``ndim`` entries, or of 3 for fewer dimensions (the
    original's ``(1, 1, 1)`` defaults serve 1-D and 2-D convolutions too): the leading ``3 - ndim``
    entries belong to absent axes of size 1, where they must be ``neutral`` (when it is given)."""
    if _is_int(value):
        return (value,) * ndim
    items = _sequence(value, name)
    if len(items) == _MAX_DIMS and ndim < _MAX_DIMS:
        lead = items[:_MAX_DIMS - ndim]
        if neutral is not None and any(v != neutral and _pair(v) != (neutral, neutral) for v in lead):
            raise ValueError(f"{name} has {_MAX_DIMS} entries for a {ndim}-D convolution; the leading "
                             f"{_MAX_DIMS - ndim} must be {neutral}; got {value!r}")
        items = items[_MAX_DIMS - ndim:]
    if len(items) != ndim:
        raise ValueError(f"{name} must have {ndim} entries (one per spatial dimension of TRS), or "
                         f"{_MAX_DIMS}; got {len(items)}: {value!r}")
    return items


def _pair(value):
    """``value`` as a tuple where it is a list or tuple (``[0, 0]`` is the pair ``(0, 0)``), else itself."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _positive(value, name, ndim):
    """Strides or dilations.  Entries for absent axes only need to be valid: a stride or dilation
    along an axis of size 1 with a 1-tap filter changes nothing."""
    for v in (value,) if _is_int(value) else _sequence(value, name):
        if not _is_int(v):
            raise TypeError(f"{name} must be an int or a tuple of ints; got {value!r}")
        if v < 1:
            raise ValueError(f"{name} must be >= 1; got {value!r}")
        if v > _MAX_SIZE:
            raise ValueError(f"{name} must be <= 2**31 - 1; got {value!r}")
    return tuple(int(v) for v in _per_axis(value, name, ndim))


def _padding(value, ndim):
    """``"SAME"`` / ``"VALID"``, or ``((before, after), ...)`` per axis."""
    if isinstance(value, str):
        mode = value.upper()
        if mode not in PADDING_MODES:
            raise ValueError(f"padding must be 'SAME', 'VALID', an int or a tuple of ints; got {value!r}")
        return mode
    items = _per_axis(value, "padding", ndim, 0)
    pads = []
    for v in items:
        pair = (v, v) if _is_int(v) else v
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(_is_int(p) for p in pair)):
            raise TypeError(f"padding entries must be ints or (before, after) pairs of ints; got {value!r}")
        if min(pair) < 0:
            raise ValueError(f"padding must be >= 0; got {value!r}")
        if max(pair) > _MAX_SIZE:
            raise ValueError(f"padding must be <= 2**31 - 1; got {value!r}")
        pads.append((int(pair[0]), int(pair[1])))
    return tuple(pads)


def _forward_axis(i, taps, image, stride, dilate, padding):
    """The axis of a convolution with input size ``image``."""
    extent = (taps - 1) * dilate + 1
    if padding == "SAME":
        return Axis(taps, image, -(-image // stride), stride, dilate, (extent - 1) // 2)
    before, after = (0, 0) if padding == "VALID" else padding[i]
    room = image + before + after - extent
    if room < 0:
        raise ValueError(f"DHW[{i}] = {image} with padding ({before}, {after}) is smaller than the "
                         f"dilated filter (TRS[{i}] = {taps}, dilates[{i}] = {dilate}: {extent} positions)")
    return Axis(taps, image, room // stride + 1, stride, dilate, before)


def _image_range(i, taps, out, stride, dilate, padding):
    """``(lowest, highest)`` image size whose convolution has ``out`` positions, and the pad."""
    extent = (taps - 1) * dilate + 1
    if padding == "SAME":
        return (out - 1) * stride + 1, out * stride, (extent - 1) // 2
    before, after = (0, 0) if padding == "VALID" else padding[i]
    if max(before, after) >= extent:
        raise ValueError(f"padding ({before}, {after}) on axis {i} must be smaller than the dilated filter "
                         f"({extent} positions) for a transposed convolution")
    low = (out - 1) * stride + extent - before - after
    if low + stride - 1 < 1:
        raise ValueError(f"padding ({before}, {after}) on axis {i} leaves no output size for a "
                         f"transposed convolution of DHW[{i}] = {out} (TRS[{i}] = {taps}, strides[{i}] = "
                         f"{stride}, dilates[{i}] = {dilate})")
    return max(low, 1), low + stride - 1, before


def make_geometry(TRS, DHW, MPQ=None, strides=1, dilates=1, padding="SAME", transposed=False):
    """Validate the spatial arguments of ``BlocksparseConv`` / ``BlocksparseDeconv``.

    Parameters are the public ones (``DHW`` is always the op's input size, ``MPQ`` its output
    size); raises ``TypeError`` / ``ValueError`` naming the argument.  Returns a :class:`Geometry`.
    """
    TRS = _dims(TRS, "TRS")
    DHW = _dims(DHW, "DHW")
    ndim = len(TRS)
    if len(DHW) != ndim:
        raise ValueError(f"DHW must have as many dimensions as TRS ({ndim}); got {len(DHW)}: {DHW}")
    strides = _positive(strides, "strides", ndim)
    dilates = _positive(dilates, "dilates", ndim)
    padding = _padding(padding, ndim)
    if MPQ is not None:
        MPQ = _per_axis(MPQ, "MPQ", ndim, 1)
        if not all(_is_int(m) for m in MPQ):
            raise TypeError(f"MPQ must hold ints; got {MPQ!r}")
        if min(MPQ) < 1:
            raise ValueError(f"MPQ must hold sizes >= 1; got {MPQ!r}")
        if max(MPQ) > _MAX_SIZE:
            raise ValueError(f"MPQ must hold sizes <= 2**31 - 1; got {MPQ!r}")
    axes = []
    for i in range(ndim):
        if not transposed:
            axis = _forward_axis(i, TRS[i], DHW[i], strides[i], dilates[i], padding)
            if MPQ is not None and MPQ[i] != axis.out:
                raise ValueError(f"MPQ[{i}] must be {axis.out} for this convolution (DHW, TRS, strides, "
                                 f"dilates and padding fix it); got {MPQ[i]}")
        else:
            low, high, pad = _image_range(i, TRS[i], DHW[i], strides[i], dilates[i], padding)
            if MPQ is None:
                image = min(max(DHW[i] * strides[i], low), high)
            elif low <= MPQ[i] <= high:
                image = int(MPQ[i])
            else:
                raise ValueError(f"MPQ[{i}] must be in [{low}, {high}] for this transposed convolution "
                                 f"of DHW[{i}] = {DHW[i]}; got {MPQ[i]}")
            axis = Axis(TRS[i], image, DHW[i], strides[i], dilates[i], pad)
        axes.append(axis)
    return Geometry(tuple(axes), bool(transposed))
