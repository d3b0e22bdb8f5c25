"""blocksparse.testing.distributed.run_workers: every rank must finish; a rank that hangs or
crashes after it reported its work done counts as finished (stopped at the timeout where it hangs),
any other hang or failure fails."""
import sys
import time

import pytest

from blocksparse.testing.distributed import WORK_DONE, run_workers

WORKER = """
import os, sys, time
rank = int(os.environ["RANK"])
mode = sys.argv[1]
print("rank", rank, "of", os.environ["WORLD_SIZE"], flush=True)
if mode == "hang-after-done" and rank == 1:
    print({done!r}, flush=True)
    time.sleep(600)
if mode == "crash-after-done" and rank == 1:
    print({done!r}, flush=True)
    os.abort()
if mode == "hang" and rank == 1:
    time.sleep(600)
if mode == "fail" and rank == 1:
    sys.exit(3)
print({done!r}, flush=True)
"""


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER.format(done=WORK_DONE))
    return path


def test_every_rank_finishing_is_success(worker):
    outputs = run_workers(worker, ["ok"], world_size=3, timeout=60)
    assert [code for code, _, _ in outputs] == [0, 0, 0]
    assert [out.splitlines()[0] for _, out, _ in outputs] == [f"rank {r} of 3" for r in range(3)]


@pytest.mark.parametrize("mode", ["hang-after-done", "crash-after-done"])
def test_a_rank_hanging_or_crashing_after_its_work_is_done_passes(worker, mode, monkeypatch):
    from blocksparse.testing import distributed

    monkeypatch.setattr(distributed, "TEARDOWN_S", 2)  # a hang is stopped 2 s after rank 0 is done
    start = time.monotonic()
    outputs = run_workers(worker, [mode], world_size=2, timeout=120)
    assert time.monotonic() - start < 60
    assert outputs[0][0] == 0 and outputs[1][0] != 0  # stopped, or aborted
    assert WORK_DONE in outputs[1][1].splitlines()


@pytest.mark.parametrize("mode, why", [("hang", r"rank 1 \(exit -9\)"), ("fail", r"rank 1 \(exit 3\)")])
def test_a_rank_hanging_or_failing_before_it_is_done_fails(worker, mode, why):
    if mode == "hang" and sys.platform == "win32":
        pytest.skip("exit codes of killed processes differ on Windows")
    with pytest.raises(RuntimeError, match=why):
        run_workers(worker, [mode], world_size=2, timeout=5)
