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

__all__ = ["free_port", "run_workers"]


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(script, args=(), world_size=2, timeout=300, env=None):
    """Start ``python script *args`` ``world_size`` times as ranks of one job; wait for all.

    Returns the completed processes (stdout / stderr captured).  Raises ``RuntimeError`` with
    every rank's output when one fails or they do not finish within ``timeout`` seconds (a
    rank waiting for a dead peer would otherwise hang).
    """
    port = free_port()
    procs = []
    for rank in range(world_size):
        child = dict(os.environ, **(env or {}), RANK=str(rank), WORLD_SIZE=str(world_size),
                     LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)], env=child,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs, failed = [], False
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, err = proc.communicate()
            failed = True
        outputs.append((proc.returncode, out, err))
        failed |= proc.returncode != 0
    if failed:
        report = "\n".join(f"--- rank {r} (exit {code})\n{out[-2000:]}\n{err[-4000:]}"
                           for r, (code, out, err) in enumerate(outputs))
        raise RuntimeError(f"{script} failed on at least one of {world_size} ranks:\n{report}")
    return outputs
