"""bench/tune_norms.py's ``--install`` rule and the measured tile table it writes, without a GPU."""
import importlib
import random
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import common  # noqa: E402
import tune_norms  # noqa: E402

from blocksparse.ops.norms import configs  # noqa: E402
from blocksparse.ops.norms.configs import NormConfig  # noqa: E402


def _row(ms, n=16384, c=4096, dtype="bf16", kernel="fwd", table=False, ok=True, **tile):
    cfg = dict(BN=2, BC=c, num_warps=8, programs_per_sm=1) | tile
    return dict(op="layer_norm", dtype=dtype, N=n, C=c, axis=1, kernel=kernel, table=table, ok=ok, ms=ms, **cfg)


def test_a_variant_enters_where_it_beats_the_table_by_the_margin_at_the_largest_token_count():
    rng = random.Random()
    base = rng.uniform(0.05, 0.2)
    rows = [
        _row(base, table=True),
        _row(base / 1.10, BN=4, num_warps=16),  # the winner at 16384 tokens
        _row(base / 1.5, n=4096, BN=1, num_warps=4),  # faster, but at fewer tokens: not the case
        _row(base / 2.0, BN=8, num_warps=16, ok=False),  # inaccurate: never
        _row(base, dtype="fp32", table=True),
        _row(base / (tune_norms.MARGIN - 0.01), dtype="fp32", BN=4),  # inside the margin: the rule stays
        _row(base, kernel="bwd", table=True),
        _row(base * 1.2, kernel="bwd", BN=4),
    ]
    kept = {(0, 1024, 2, False): NormConfig(BN=32, BC=512, num_warps=8, programs_per_sm=0)}
    table = tune_norms.suggested_tiles(rows, kept)
    assert table == {(0, 1024, 2, False): kept[(0, 1024, 2, False)],
                     (1, 4096, 2, False): NormConfig(BN=4, BC=4096, num_warps=16, programs_per_sm=1)}


def test_install_writes_a_table_the_config_lookup_serves(tmp_path, monkeypatch):
    target = tmp_path / "configs.py"
    shutil.copy(configs.__file__, target)
    tiles = {(1, 4096, 4, True): NormConfig(BN=2, BC=4096, num_warps=8, programs_per_sm=4),
             (1, 1024, 2, False): NormConfig(BN=8, BC=1024, num_warps=8, programs_per_sm=8)}
    common.install_literal(target, "MEASURED", tune_norms.measured_source(tiles))
    name = "blocksparse.ops.norms._installed"
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    # (the installed module has its own NormConfig class: compared as text)
    assert repr(module.MEASURED) == repr(dict(sorted(tiles.items())))
    # the measured tile for its features (rounded up to a power of two), dtype size and direction
    assert repr(module.layer_norm_config(1, 3000, 4, backward=True)) == repr(tiles[(1, 4096, 4, True)])
    assert repr(module.layer_norm_config(1, 1024, 2)) == repr(tiles[(1, 1024, 2, False)])
    # elsewhere the rule, as before
    for args in ((1, 4096, 2, True), (1, 1024, 4, False), (0, 1024, 2, False)):
        assert repr(module.layer_norm_config(*args[:3], backward=args[3])) == repr(configs._rule(*args))
    # the relu table overrides for the relu kernels only
    relu_tile = NormConfig(BN=1, BC=4096, num_warps=16, programs_per_sm=2)
    common.install_literal(target, "MEASURED_RELU",
                           tune_norms.measured_source({(1, 4096, 4, True): relu_tile}, "MEASURED_RELU"))
    spec.loader.exec_module(module)
    assert repr(module.layer_norm_config(1, 4096, 4, backward=True, relu=True)) == repr(relu_tile)
    assert repr(module.layer_norm_config(1, 4096, 4, backward=True)) == repr(tiles[(1, 4096, 4, True)])
    assert repr(module.layer_norm_config(1, 1024, 2, relu=True)) == repr(tiles[(1, 1024, 2, False)])
    # a second install replaces the table, it does not add one
    common.install_literal(target, "MEASURED", tune_norms.measured_source({}))
    assert target.read_text().count("MEASURED = {") == 1
    with pytest.raises(RuntimeError, match="found 0 NOTHERE tables"):
        common.install_literal(target, "NOTHERE", "NOTHERE = {\n}")
