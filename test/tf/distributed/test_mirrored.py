"""BlocksparseMatMul under tf.distribute.MirroredStrategy with 2 logical CPU devices: the trained
weight equals single-device training on the whole batch, and the (pickled) object reaches the
replicas."""
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from blocksparse.testing import rel_error
from blocksparse.testing.matmul import random_layout

tf = pytest.importorskip("tensorflow")
from blocksparse.matmul import BlocksparseMatMul  # noqa: E402

WORKER = Path(__file__).parent / "mirrored_worker.py"


def _run(path, strategy):
    done = subprocess.run([sys.executable, str(WORKER), str(path), strategy], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("feature_axis", [1, 0])
def test_mirrored_strategy_trains_like_one_device(tmp_path, rng, feature_axis):
    bsmm = BlocksparseMatMul(random_layout(rng, 4, 3, 0.5, empty_cols=1), block_size=16,
                             feature_axis=feature_axis)
    path = tmp_path / "bsmm.pkl"
    path.write_bytes(pickle.dumps(bsmm))
    mirrored, single = _run(path, "mirrored"), _run(path, "single")
    assert (mirrored["replicas"], single["replicas"]) == (2, 1)
    np.testing.assert_allclose(mirrored["losses"], single["losses"], rtol=1e-5)
    assert rel_error(np.array(mirrored["w"]), np.array(single["w"])) < 1e-5
    assert mirrored["losses"][-1] < mirrored["losses"][0]
