"""Block-sparse layers under PyTorch's data-parallel (DDP) and fully sharded (FSDP2) engines on
the CPU (gloo, 2 processes): the gradients and parameters equal single-process training on the
concatenated batch, and the layouts reach every rank by pickling."""
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from blocksparse.layout import Layout
from blocksparse.testing import rel_error
from blocksparse.testing.distributed import run_workers
from blocksparse.testing.matmul import random_layout
from blocksparse.torch import BlocksparseLinear, BlocksparseMatMul

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from mlp import batches, make_model  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or
                                not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _layouts(rng):
    return (Layout(random_layout(rng, 4, 6, 0.5, empty_cols=1), 16),
            Layout(random_layout(rng, 6, 3, 0.6), 16))


def _single_process(layouts):
    """Losses, first-step gradients and final parameters of the same training in one process."""
    model = make_model(layouts)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], None
    for step, (x, y) in enumerate(batches()):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step == 0:
            grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, grads, {n: p.detach().numpy() for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_train_like_one_process_on_the_whole_batch(tmp_path, rng, mode):
    if mode == "fsdp" and torch.__version__ < (2, 6):
        pytest.skip("FSDP2 (fully_shard) runs on CPU ranks from torch 2.6 on")
    layouts = _layouts(rng)
    out = tmp_path / "rank0.npz"
    (tmp_path / "rank0.npz.layouts").write_bytes(pickle.dumps(layouts))
    run_workers(HERE / "train_worker.py", [mode, out], world_size=2, timeout=240)
    got = np.load(out)
    losses, grads, params = _single_process(layouts)
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-10)
    for name, ref in grads.items():
        assert rel_error(got["grad/" + name], ref) < 1e-10, name
    for name, ref in params.items():
        assert rel_error(got["param/" + name], ref) < 1e-10, name
    assert not np.allclose(params["0.weight"], make_model(layouts)[0].weight.detach().numpy())


def test_a_pickled_matmul_finds_its_own_layout_in_another_process(rng):
    """The objects hold a per-process layout handle; unpickled elsewhere (a DDP / spawn worker,
    torch.save of a module) they must use *their* layout, whatever that process built first."""
    mask = random_layout(rng, 3, 2, 0.7)
    bsmm = BlocksparseMatMul(mask, block_size=16)
    lin = BlocksparseLinear(mask, block_size=16, dtype=torch.float64)
    w = torch.randn(bsmm.w_shape, dtype=torch.float64)
    x = torch.randn(5, bsmm.C, dtype=torch.float64)
    expect = (bsmm(x, w).numpy(), lin(x).detach().numpy())
    code = (
        "import pickle, sys, numpy as np, torch\n"
        "from blocksparse.torch import BlocksparseMatMul\n"
        "BlocksparseMatMul(np.ones((5, 7), int), block_size=32)  # takes the first handle\n"
        "bsmm, lin, w, x = pickle.loads(sys.stdin.buffer.read())\n"
        "sys.stdout.buffer.write(pickle.dumps((bsmm(x, w).numpy(), lin(x).detach().numpy())))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((bsmm, lin, w, x)),
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    got = pickle.loads(done.stdout)
    for g, e in zip(got, expect):
        assert rel_error(g, e) < 1e-12


def test_a_layer_that_ran_pickles(rng):
    """torch.save / DDP spawn of a model after a forward: per-process memos must not ride along."""
    lin = BlocksparseLinear(random_layout(rng, 3, 2, 0.7), block_size=16, dtype=torch.float64)
    x = torch.randn(5, lin.in_features, dtype=torch.float64)
    expect = lin(x).detach()
    again = pickle.loads(pickle.dumps(lin))
    assert rel_error(again(x).detach(), expect) < 1e-12
