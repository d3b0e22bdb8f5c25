"""Relative error against a float64 reference, and the bound each dtype must meet."""
import numpy as np

__all__ = ["TOLERANCE", "rel_error", "rounded_once_bound", "tolerance"]

#: Bounds of ``||out - ref|| / ||ref||`` per dtype name (float32 products are exact, no TF32).
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
#: float32 products on TF32 tensor cores (``allow_tf32=True``).
TF32_TOLERANCE = 3e-3
#: Significand bits (the implicit one included) and least normal exponent of each dtype.
_FORMATS = {"float16": (11, -14), "bfloat16": (8, -126), "float32": (24, -126), "float64": (53, -1022)}


def _name(dtype):
    """``torch.bfloat16`` / ``tf.bfloat16`` / ``np.float32`` / ``"bf16"`` -> canonical name."""
    short = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
    text = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    text = short.get(text, text)
    if text not in TOLERANCE:
        try:
            text = np.dtype(dtype).name
        except TypeError:
            pass
    if text not in TOLERANCE:
        raise ValueError(f"dtype must be one of {sorted(TOLERANCE)}; got {dtype!r}")
    return text


def tolerance(dtype, tf32=False):
    """The relative-error bound of results computed in ``dtype`` (any framework's dtype or name)."""
    name = _name(dtype)
    return TF32_TOLERANCE if tf32 and name == "float32" else TOLERANCE[name]


def _numpy(t):
    if hasattr(t, "detach"):  # torch: any device, any dtype (bfloat16 has no numpy twin)
        t = t.detach().double().cpu()
    return np.asarray(t, dtype=np.float64)


def rel_error(out, ref):
    """``||out - ref|| / ||ref||`` in float64 (``||out||`` when ``ref`` is all zeros).

    Raises ``AssertionError`` when the shapes differ or ``out`` holds NaN / inf, so a poisoned
    output that a kernel never wrote can never pass.
    """
    out, ref = _numpy(out), _numpy(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference shape {ref.shape}"
    assert np.all(np.isfinite(out)), "non-finite values in the output"
    scale = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (scale if scale > 0 else 1.0))


def rounded_once_bound(exact, got, magnitude, terms, dtype):
    """Per element, how far ``got`` -- a float32 sum of ``terms`` products rounded once to ``dtype``
    -- may lie from the ``exact`` sum: half an ulp of ``dtype`` at ``max(|exact|, |got|)`` (the one
    rounding, subnormals included) plus ``terms * 2**-24 * magnitude``, what a float32 sum may lose
    in any order (``magnitude``: the sum of the products' absolute values).  Cancelling sums lose
    more than the last bit of their result, so on them the second term dominates: the bound catches
    errors of the products' scale (a product rounded to ``dtype`` before the sum), not every second
    rounding of the result."""
    digits, least = _FORMATS[_name(dtype)]
    exact, got, magnitude = _numpy(exact), _numpy(got), _numpy(magnitude)
    exponent = np.maximum(np.frexp(np.maximum(np.abs(exact), np.abs(got)))[1] - 1, least)
    return 2.0 ** (exponent - digits) + terms * 2.0 ** -24 * magnitude
