"""The one place that decides, for any op family, whether the compiled GPU kernels serve an op.

A family's frontend asks :func:`gpu_library` when it builds an op and takes the reference path
(TensorFlow ops) when it gets None; the choice made then holds for the op's gradient too.
``BLOCKSPARSE_BACKEND`` (see :mod:`blocksparse._env`): ``reference`` never loads the op library;
``auto`` takes the GPU path where TensorFlow sees a GPU the library has kernels for (outside XLA
and CPU device scopes), with one warning when the library cannot be used; ``triton`` insists and
raises :class:`BackendUnavailableError` where the GPU path cannot serve.
"""
from __future__ import annotations

from .. import _env
from . import device, loader

__all__ = ["BackendUnavailableError", "gpu_implementation", "gpu_library", "no_kernels"]

class BackendUnavailableError(RuntimeError):
    """``BLOCKSPARSE_BACKEND`` asks for an implementation this installation cannot provide."""


def _unavailable(why):
    return BackendUnavailableError(
        f"BLOCKSPARSE_BACKEND=triton asks for the GPU kernels (the compiled TensorFlow op "
        f"library), which cannot serve here: {why}. Unset BLOCKSPARSE_BACKEND, or set it to "
        "'auto' or 'reference', to use the reference path (TensorFlow ops only).")


def gpu_library(eligible=True):
    """``(OpLibrary, arch)`` when an op built now may run on the GPU kernels, else None.

    ``eligible``: whether the family has kernels for this call at all (block size, dtype); when
    false the reference path serves silently, whatever the backend.
    """
    choice = _env.backend()
    if choice == "reference" or not eligible:
        return None
    arch = device.device_arch()
    why_not = device.no_gpu_here(arch)
    if why_not:  # the library is not even loaded: it could not serve
        if choice == "auto":
            return None
        raise _unavailable(why_not)
    library = loader.library(warn=choice == "auto")
    if library is None:
        if choice == "triton":
            raise _unavailable(f"the op library is not used: {loader.unavailable_reason()}")
        return None
    return library, arch


def no_kernels(library, arch, what):
    """The library has no kernel for ``what`` (a description) on ``sm_{arch}``: raise under
    ``BLOCKSPARSE_BACKEND=triton``, else warn once per architecture (the reference path serves)."""
    archs = ", ".join([*(f"sm_{a}" for a in library.archs), *(f"compute_{a} (PTX)" for a in library.ptx)])
    why = f"{library.path} has no kernels for this GPU (sm_{arch}) and {what}; it was built for {archs}"
    if _env.backend() == "triton":
        raise _unavailable(why)
    loader.warn_once(("arch", arch), f"blocksparse: the reference path (TensorFlow ops) computes "
                     f"the products: {why}", stacklevel=4)


def gpu_implementation(eligible, what, build):
    """A family's GPU implementation of an op built now, or None for the reference path:
    :func:`gpu_library` with the call's ``eligible``, then ``build(library, arch)``, which makes it
    or returns None where the library has no kernels for it (:func:`no_kernels` then says so about
    ``what``, a description)."""
    found = gpu_library(eligible)
    if found is None:
        return None
    library, arch = found
    impl = build(library, arch)
    if impl is None:
        no_kernels(library, arch, what)
    return impl
