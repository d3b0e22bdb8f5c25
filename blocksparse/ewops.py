"""The original package's module name for the elementwise ops: ``import blocksparse.ewops as ew``
gives exactly :mod:`blocksparse.ew`."""
from .ew import *  # noqa: F401,F403
from .ew import __all__  # noqa: F401
