"""A process's very first call of a layer may be a compiled one: reading the environment while
``torch.compile`` traces fills no cache (Dynamo guarded on such a cache's contents and failed that
guard at once: "Guard failed on the same frame it was created").  Fresh interpreters, one per case."""
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCRIPT = """
import numpy as np, torch
from blocksparse.torch import BlocksparseLinear, PixelflyLinear
torch.manual_seed(0)
layer = {case!r} == "pixelfly" and PixelflyLinear(32, 48, 8, 2, 1) or BlocksparseLinear(np.ones((4, 6), bool), 8)
x = torch.randn(4, 32)
y = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
torch.testing.assert_close(y, layer(x))
print("ok")
"""


@pytest.mark.parametrize("case", ["pixelfly", "blocksparse"])
def test_first_call_compiled_in_a_fresh_process(case, monkeypatch):
    monkeypatch.delenv("BLOCKSPARSE_BACKEND", raising=False)
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(case=case)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
