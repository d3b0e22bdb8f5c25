"""Run a worker script as ``world_size`` processes of one ``torch.distributed`` job on this
machine (the CPU tests of data-parallel and sharded training, and the multi-GPU benchmark).

Each process gets the environment ``torchrun`` would give it (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so a worker written for this runs unchanged
under ``torchrun --nproc_per_node=N``.
"""
import os
import socket
import subprocess
import sys

__all__ = ["TEARDOWN_S", "WORK_DONE", "free_port", "run_workers"]

#: What a worker prints (alone on a line, flushed) once its work is done and every rank has passed
#: a final barrier, before it tears its process group down.
WORK_DONE = "blocksparse-worker: work done"
#: Seconds the other ranks get to exit once one has printed :data:`WORK_DONE`.
TEARDOWN_S = 30


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(script, args=(), world_size=2, timeout=300, env=None):
    """Start ``python script *args`` ``world_size`` times as ranks of one job; wait for all.

    Returns the completed processes (stdout / stderr captured).  Raises ``RuntimeError`` with
    every rank's output when one fails or they do not finish within ``timeout`` seconds (a
    rank waiting for a dead peer would otherwise hang).  A rank that printed :data:`WORK_DONE`
    counts as finished whatever happens after it: a rank's teardown of a gloo process group on a
    2-core CPU machine aborted ("terminate called without an active exception") in about 1 run in
    8, and hung in about 1 in 10 until stopped, each time after every rank's results were in.  Once a
    rank has printed it, the others get :data:`TEARDOWN_S` seconds more at most.
    """
    port = free_port()
    procs = []
    for rank in range(world_size):
        child = dict(os.environ, **(env or {}), RANK=str(rank), WORLD_SIZE=str(world_size),
                     LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)], env=child,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs, failed, limit = [], False, timeout
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, err = proc.communicate()
        done = proc.returncode == 0 or WORK_DONE in out.splitlines()
        if WORK_DONE in out.splitlines():  # every rank is past the final barrier: the rest is teardown
            limit = min(limit, TEARDOWN_S)
        outputs.append((proc.returncode, out, err))
        failed |= not done
    if failed:
        report = "\n".join(f"--- rank {r} (exit {code})\n{out[-2000:]}\n{err[-4000:]}"
                           for r, (code, out, err) in enumerate(outputs))
        raise RuntimeError(f"{script} failed on at least one of {world_size} ranks:\n{report}")
    return outputs
