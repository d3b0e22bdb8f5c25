"""One rank of a data-parallel (DDP) or fully sharded (FSDP2) training run of a small
block-sparse MLP on the CPU (gloo).  Started by the tests (see blocksparse.testing.distributed);
runs unchanged under ``torchrun --nproc_per_node=2 train_worker.py MODE OUT``.

Rank 0 builds the layouts and sends them to every rank with ``broadcast_object_list`` (they
pickle); every rank builds the same model from the same seed, takes its shard of each batch and
trains; rank 0 saves the losses, the first step's gradients and the final parameters to OUT.
"""
import pickle
import sys

import numpy as np
import torch
import torch.distributed as dist

from blocksparse.layout import Layout
from blocksparse.testing.distributed import WORK_DONE
from blocksparse.torch import BlocksparseLinear

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mlp import STEPS, batches, make_model  # noqa: E402


def main(mode, out):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shared = [None]
    if rank == 0:
        with open(out + ".layouts", "rb") as f:
            shared = [pickle.load(f)]
    dist.broadcast_object_list(shared, src=0)
    layouts = shared[0]
    assert all(isinstance(lay, Layout) for lay in layouts)
    model = make_model(layouts)
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif mode == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch < 2.6: FSDP2 was still under _composable
            from torch.distributed._composable.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, BlocksparseLinear):
                fully_shard(layer)
        fully_shard(model)
    else:
        raise SystemExit(f"mode must be ddp or fsdp; got {mode}")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, first_grads = [], None
    for step, (x, y) in enumerate(batches()):
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        # mean over the local shard; DDP / FSDP average gradients over ranks -> the global mean
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        opt.zero_grad()
        loss.backward()
        if step == 0:
            first_grads = {n: _full(p.grad) for n, p in model.named_parameters()}
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    params = {n: _full(p.detach()) for n, p in model.named_parameters()}
    if rank == 0:
        np.savez(out, losses=np.array(losses),
                 **{"grad/" + _name(n): g for n, g in first_grads.items()},
                 **{"param/" + _name(n): p for n, p in params.items()})
    dist.barrier()
    assert len(losses) == STEPS
    print(WORK_DONE, flush=True)  # every rank's results are in: a hang tearing down is no failure
    dist.destroy_process_group()


def _full(t):
    """A parameter or gradient as a whole numpy array (FSDP2 holds DTensor shards)."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu().numpy()


def _name(n):
    return n.replace("module.", "").replace("_fsdp_wrapped_module.", "")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
