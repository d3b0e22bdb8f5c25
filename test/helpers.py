"""Small helpers shared by the tests (import as ``from helpers import ...``)."""
import numpy as np


def random_layout(rng, CB, KB, density, *, empty_rows=0, empty_cols=0):
    """A random 0/1 layout with at least one block and the requested number of empty rows/cols."""
    while True:
        lay = (rng.random((CB, KB)) < density).astype(np.int32)
        if empty_rows:
            lay[rng.choice(CB, empty_rows, replace=False), :] = 0
        if empty_cols:
            lay[:, rng.choice(KB, empty_cols, replace=False)] = 0
        if lay.any():
            return lay
