"""The dispatch cost model on synthetic tables: exact lookups, the 5% margin, interpolation,
precision fallback, the default rule, table checks, leave-one-out; the shipped tables."""
import json
import math

import pytest

from blocksparse.dispatch import CostModel, Plan, Problem, Table, check_impl, model_for
from blocksparse.dispatch.model import EXPONENTS, WORK_EXPONENT, fit_work_exponent, leave_one_out
from blocksparse.dispatch.table import TABLES_DIR, shipped_table


def row(tokens, cin, cout, bs, density, times, dtype="float32", structured=False, fwd=None):
    return {"tokens": tokens, "in_features": cin, "out_features": cout, "block_size": bs,
            "density": density, "dtype": dtype, "structured": structured, "layout": "random",
            "fwd_ms": fwd or {k: v / 3 for k, v in times.items()}, "fwdbwd_ms": times}


def table(*rows, framework="torch", device="cpu", **fields):
    return Table.from_dict({"format": 1, "framework": framework, "device": device, "rows": list(rows), **fields})


def problem(tokens=1024, cin=1024, cout=1024, bs=32, density=0.25, dtype="float32", structured=False,
            backward=True, jit=False):
    return Problem(tokens, cin, cout, bs, density, dtype, structured, backward, jit)


ALL = ("kernels", "portable", "dense", "reference")


def test_exact_row_is_used_as_measured():
    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"dense": 10.0, "portable": 4.0, "reference": 7.0})))
    plan = model.choose(problem(), ALL)
    assert isinstance(plan, Plan) and plan.impl == "portable"
    assert dict(plan.times_ms) == pytest.approx({"dense": 10.0, "portable": 4.0, "reference": 7.0})
    assert "fastest" in plan.why and "kernels not measured" in plan.why and plan.source == "<memory>"
    assert model.choose(problem(backward=False), ALL).times_ms["dense"] == pytest.approx(10 / 3)


@pytest.mark.parametrize("portable_ms, chosen", [(9.6, "dense"), (9.55, "dense"), (9.5, "portable")],
                         ids=["dense-4pct-slower", "dense-4.7pct-slower", "dense-5.3pct-slower"])
def test_margin_prefers_dense_on_a_near_tie(portable_ms, chosen):
    """dense (10 ms) is taken while it is within 5% of the fastest."""
    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"dense": 10.0, "portable": portable_ms})))
    plan = model.choose(problem(), ("portable", "dense"))
    assert plan.impl == chosen
    times = plan.times_ms
    assert times[plan.impl] <= 1.05 * min(times.values())  # never more than 5% slower than the best
    if chosen == "dense" and portable_ms < 10:
        assert "within 5% of the fastest (portable" in plan.why


def test_margin_order_kernels_before_portable():
    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"kernels": 5.1, "portable": 5.0, "dense": 20.0})))
    assert model.choose(problem(), ALL).impl == "kernels"
    assert CostModel(model.table, margin=0.0).choose(problem(), ALL).impl == "portable"


def test_a_margin_or_table_set_later_takes_effect():
    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"kernels": 5.1, "portable": 5.0, "dense": 20.0})))
    assert model.choose(problem(), ALL).impl == "kernels"
    revision = model.revision
    model.margin = 0.0
    assert model.revision > revision and model.choose(problem(), ALL).impl == "portable"
    model.table = table(row(1024, 1024, 1024, 32, 0.25, {"dense": 1.0, "portable": 5.0}))
    assert model.choose(problem(), ALL).impl == "dense"


def test_only_candidates_are_considered():
    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"kernels": 1.0, "dense": 10.0, "portable": 5.0})))
    assert model.choose(problem(), ("portable", "dense")).impl == "portable"
    with pytest.raises(ValueError, match="candidates must name at least one"):
        model.choose(problem(), ("gpu",))


def test_interpolation_scales_with_work():
    """Between rows, each impl's time is carried by (work ratio) ** WORK_EXPONENT: with one row per
    impl, twice the tokens multiplies every expected time by 2 ** 0.6; density scales sparse impls
    only."""
    assert WORK_EXPONENT == pytest.approx(0.6)
    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"dense": 8.0, "portable": 4.0})))
    big = model.choose(problem(tokens=2048), ALL).times_ms
    assert big["dense"] == pytest.approx(8.0 * 2 ** 0.6) and big["portable"] == pytest.approx(4.0 * 2 ** 0.6)
    sparse = model.choose(problem(density=0.125), ALL)
    assert sparse.times_ms["dense"] == pytest.approx(8.0)
    assert sparse.times_ms["portable"] == pytest.approx(4.0 * 0.5 ** 0.6)


def test_interpolation_weights_nearer_rows_more():
    """Two rows at distances 1 and 2 (log2 tokens): the expected log time is their inverse-distance
    weighted mean, each carried to the problem's work first."""
    model = CostModel(table(row(512, 1024, 1024, 32, 0.25, {"dense": 3.0}),
                            row(4096, 1024, 1024, 32, 0.25, {"dense": 20.0})))
    got = model.expected_ms(problem(tokens=1024), "dense")[0]
    near, far = math.log(3.0 * 2 ** 0.6), math.log(20.0 * 0.25 ** 0.6)
    assert got == pytest.approx(math.exp((near / 1 + far / 2) / (1 / 1 + 1 / 2)))


def test_nearest_rows_win():
    """A query next to the rows where portable wins takes portable, next to those where dense wins
    takes dense (the crossover the tables exist to find)."""
    model = CostModel(table(
        row(1024, 1024, 1024, 32, 0.1, {"dense": 10.0, "portable": 2.0}),
        row(1024, 1024, 1024, 32, 0.5, {"dense": 10.0, "portable": 20.0}),
        row(1024, 1024, 1024, 128, 0.1, {"dense": 10.0, "portable": 1.5}),
        row(1024, 1024, 1024, 128, 0.5, {"dense": 10.0, "portable": 12.0})))
    assert model.choose(problem(density=0.12, bs=48), ALL).impl == "portable"
    assert model.choose(problem(density=0.45, bs=48), ALL).impl == "dense"


def test_structure_mismatch_counts_as_distance():
    model = CostModel(table(
        row(1024, 1024, 1024, 32, 0.25, {"dense": 10.0, "kernels": 12.0}),
        row(1024, 1024, 1024, 32, 0.25, {"dense": 10.0, "kernels": 5.0}, structured=True)))
    assert model.choose(problem(structured=True), ALL).impl == "kernels"
    assert model.choose(problem(structured=False), ALL).impl == "dense"


def test_precision_fallback_is_said():
    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"dense": 10.0, "portable": 4.0}, dtype="bfloat16")))
    plan = model.choose(problem(dtype="float16"), ALL)
    assert plan.impl == "portable" and "float16 not measured, bfloat16 figures used" in plan.why
    assert model.choose(problem(dtype="float32"), ALL).source == "default rule"  # no float32-like rows


def test_default_rule_without_table():
    model = CostModel(None)
    plan = model.choose(problem(), ALL)
    assert plan.impl == "kernels" and plan.source == "default rule" and "no measured table" in plan.why
    assert model.choose(problem(), ("portable", "dense")).impl == "portable"
    assert model.choose(problem(), ("dense",)).impl == "dense"
    assert str(plan).startswith("kernels: no measured table")


def test_leave_one_out():
    rows = [row(n, 1024, 1024, 32, d, {"dense": 10.0 * n / 1024, "portable": 40.0 * d * n / 1024})
            for n in (512, 1024, 2048) for d in (0.1, 0.2, 0.5, 0.8)]
    result = leave_one_out(table(*rows))
    assert len(result["rows"]) == len(rows) and result["margin"] == 0.05
    for r in result["rows"]:
        assert r["regret"] >= 0 and r["chosen"] in ("dense", "portable")
    assert result["max_regret"] < 0.6 and result["within_margin"] >= 0.75
    json.dumps(result)


def test_a_tables_work_exponent_carries_its_rows():
    """A table's ``work_exponent`` replaces the default: twice the tokens, 2 ** e the time."""
    rows = [row(1024, 1024, 1024, 32, 0.25, {"dense": 8.0})]
    for e in (1.0, 0.3):
        assert CostModel(table(*rows, work_exponent=e)).expected_ms(problem(tokens=2048), "dense")[0] \
            == pytest.approx(8.0 * 2 ** e)
    assert CostModel(table(*rows)).exponent == WORK_EXPONENT


@pytest.mark.parametrize("regrets, want", [
    ({0.4: 0.05, 0.6: 0.04, 0.9: 0.001, 1.0: 0.001}, 0.9),   # clearly best, tied with 1.0: nearer the default
    ({0.4: 0.031, 0.6: 0.032, 0.9: 0.05, 1.0: 0.06}, 0.6),   # within 0.2 points of the best: the default stays
    ({0.4: 0.01, 0.6: 0.03, 0.9: 0.05, 1.0: 0.06}, 0.4),
])
def test_fit_work_exponent_takes_the_least_mean_regret(monkeypatch, regrets, want):
    """The fit runs leave-one-out under each exponent and keeps the least mean regret, preferring the
    default among those within 0.2 points of it."""
    from blocksparse.dispatch import model

    seen = []

    def fake(tab, margin):
        seen.append(tab.work_exponent)
        return {"mean_regret": regrets[tab.work_exponent]}

    monkeypatch.setattr(model, "leave_one_out", fake)
    tab = table(row(1024, 1024, 1024, 32, 0.25, {"dense": 1.0, "portable": 2.0}))
    assert fit_work_exponent(tab, exponents=tuple(regrets)) == want and seen == list(regrets)


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(format=2), "format must be 1"),
    (lambda d: d.update(work_exponent=0), r"work_exponent must be a number in \(0, 2\]"),
    (lambda d: d.update(work_exponent="0.6"), r"work_exponent must be a number in \(0, 2\]"),
    (lambda d: d.update(rows=[]), "rows must be a non-empty list"),
    (lambda d: d["rows"][0]["fwdbwd_ms"].update(gpu=1.0), "unknown impl 'gpu'"),
    (lambda d: d["rows"][0]["fwdbwd_ms"].update(dense=-1.0), "positive number of milliseconds"),
    (lambda d: d["rows"][0].update(density=1.5), r"density must be in \(0, 1\]"),
    (lambda d: d["rows"][0].update(dtype="int8"), "dtype must be one of"),
    (lambda d: d["rows"][0].update(tokens=0), "tokens must be an int >= 1"),
    (lambda d: d["rows"][0].pop("block_size"), "missing"),
    (lambda d: d.update(framework=""), "framework must be a non-empty string"),
], ids=["format", "exponent-zero", "exponent-str", "no-rows", "impl", "negative", "density", "dtype", "tokens",
        "missing", "framework"])
def test_bad_tables(mutate, words):
    data = {"format": 1, "framework": "torch", "device": "cpu",
            "rows": [row(1024, 1024, 1024, 32, 0.25, {"dense": 1.0})]}
    mutate(data)
    with pytest.raises(ValueError, match=words):
        Table.from_dict(data)


@pytest.mark.parametrize("kwargs, words", [
    ({"dtype": "int8"}, "dtype must be one of"), ({"density": 0.0}, "density must be in"),
    ({"tokens": 0}, "tokens must be >= 1")], ids=["dtype", "density", "tokens"])
def test_bad_problems(kwargs, words):
    with pytest.raises(ValueError, match=words):
        problem(**kwargs)


def test_kernels_through_the_jit_take_at_least_its_host_time_a_launch():
    """Without the kernel library each launch costs JIT_LAUNCH_MS of host time: a host-bound call goes
    to dense, a call whose kernels take longer than that keeps them; the plan says why."""
    from blocksparse.dispatch.model import JIT_LAUNCH_MS

    small = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"kernels": 0.4, "dense": 0.55},
                                fwd={"kernels": 0.08, "dense": 0.1})))
    assert small.choose(problem(), ALL).impl == "kernels"
    plan = small.choose(problem(jit=True), ALL)
    assert plan.impl == "dense" and plan.times_ms["kernels"] == pytest.approx(3 * JIT_LAUNCH_MS)
    assert "Triton's JIT" in plan.why and "3 launches" in plan.why
    inference = small.choose(problem(jit=True, backward=False), ALL)
    assert inference.impl == "dense" and inference.times_ms["kernels"] == pytest.approx(JIT_LAUNCH_MS)
    large = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"kernels": 3 * JIT_LAUNCH_MS + 0.1, "dense": 2.0})))
    plan = large.choose(problem(jit=True), ALL)
    assert plan.impl == "kernels" and "JIT" not in plan.why
    assert plan.times_ms["kernels"] == pytest.approx(3 * JIT_LAUNCH_MS + 0.1)
    assert small.choose(problem(jit=True), ("portable", "dense")).times_ms == small.choose(
        problem(), ("portable", "dense")).times_ms  # no kernels among the candidates: nothing to raise


def test_check_impl_and_margin():
    assert check_impl("auto") == "auto" and check_impl("dense") == "dense"
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'kernels'"):
        check_impl("fast")
    with pytest.raises(ValueError, match=r"margin must be in \[0, 1\)"):
        CostModel(None, margin=1.5)


def test_shipped_tables_are_valid():
    """Every table shipped with the package loads, names its device, and its own grid is planned
    within the margin (the choice on a measured problem is never more than 5% slower)."""
    files = sorted(TABLES_DIR.glob("*.json"))
    assert files, "the package ships at least the CPU tables"
    for path in files:
        framework, device = path.stem.split("-", 1)
        tab = shipped_table(framework, device)
        assert (tab.framework, tab.device) == (framework, device) and tab.meta["device_name"]
        model = model_for(framework, device)
        for r in tab.rows:
            times = dict(r.fwdbwd_ms)
            if not times:
                continue
            plan = model.choose(r.problem, tuple(times))
            assert times[plan.impl] <= 1.05 * min(times.values()) * (1 + 1e-9), (path.name, r)
        # the exponent is the one fitted to the rows, and the stored validation ran under it
        assert tab.work_exponent == fit_work_exponent(tab), path.name
        assert tab.meta["validation"]["work_exponent"] == tab.work_exponent, path.name
        assert tab.meta["validation"]["mean_regret"] == pytest.approx(leave_one_out(tab)["mean_regret"]), path.name


def test_models_pickle_and_copy():
    """A layer holding a cost model pickles and deep-copies (the tables' read-only mappings do not
    pickle by themselves)."""
    import copy
    import pickle

    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"dense": 10.0, "portable": 4.0})), margin=0.1)
    for twin in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert twin.table == model.table and twin.margin == model.margin
        assert twin.choose(problem(), ALL).impl == model.choose(problem(), ALL).impl == "portable"
        with pytest.raises(TypeError):
            twin.table.rows[0].fwdbwd_ms["dense"] = 1.0   # still read-only


def test_plans_are_cached_until_the_model_changes(monkeypatch):
    """A model plans each (problem, candidates) once; setting its margin or table plans afresh;
    a full cache is emptied (bounded however many token counts a layer sees)."""
    import blocksparse.dispatch.model as model_module

    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"dense": 10.0, "portable": 9.7}),
                            row(4096, 1024, 1024, 32, 0.25, {"dense": 40.0, "portable": 30.0})))
    calls = []
    real = CostModel._choose
    monkeypatch.setattr(CostModel, "_choose", lambda self, p, c: calls.append(p) or real(self, p, c))
    first = model.choose(problem(), ALL)
    assert model.choose(problem(), list(ALL)) is first and len(calls) == 1
    assert first.impl == "dense"  # 3% slower than portable: within the 5% margin
    model.margin = 0.0
    assert model.choose(problem(), ALL).impl == "portable" and len(calls) == 2
    model.table = table(row(1024, 1024, 1024, 32, 0.25, {"dense": 1.0, "portable": 9.7}))
    assert model.choose(problem(), ALL).times_ms["dense"] == pytest.approx(1.0) and len(calls) == 3
    monkeypatch.setattr(model_module, "PLAN_CACHE_SIZE", 4)
    for n in range(100, 120):
        model.choose(problem(tokens=n), ALL)
    assert len(model._plans) <= 4


def test_cached_interpolation_matches_the_formula_on_a_shipped_table():
    """The model's vectorised neighbours give the module docstring's formula, row by row."""
    tab = shipped_table("torch", "cpu")
    model = CostModel(tab)
    q = problem(tokens=700, cin=640, cout=1536, bs=48, density=0.3)
    feats = lambda p: (math.log2(p.tokens), math.log2(p.in_features), math.log2(p.out_features),  # noqa: E731
                       math.log2(p.block_size), math.log2(p.density))
    for impl in ("dense", "portable", "reference"):
        rows = [r for r in tab.rows if r.problem.dtype == "float32" and impl in r.fwdbwd_ms]
        scored = sorted(((math.dist(feats(q), feats(r.problem)) + (r.problem.structured != q.structured),
                          math.log(r.fwdbwd_ms[impl]) + model.exponent * math.log(q.work(impl) / r.problem.work(impl)))
                         for r in rows), key=lambda s: s[0])[:6]
        want = math.exp(sum(t / d for d, t in scored) / sum(1 / d for d, _ in scored))
        assert model.expected_ms(q, impl) == (pytest.approx(want, rel=1e-12), "float32")


class Slower(CostModel):
    """A model of a user's: portable ten times slower than its table says."""

    def expected_ms(self, problem, impl):
        ms, dtype = super().expected_ms(problem, impl)
        return (ms * 10 if impl == "portable" else ms), dtype


def test_models_pickle_and_copy_without_their_caches():
    import copy
    import pickle

    model = CostModel(table(row(1024, 1024, 1024, 32, 0.25, {"dense": 10.0, "portable": 4.0})), margin=0.1)
    model.choose(problem(), ALL)
    for twin in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert twin.margin == 0.1 and twin._plans == {} and twin.choose(problem(), ALL) == model.choose(problem(), ALL)

    older = model.__getstate__()
    del older["revision"]  # pickled before models counted their revisions
    legacy = CostModel.__new__(CostModel)
    legacy.__setstate__(older)
    assert legacy.choose(problem(), ALL) == model.choose(problem(), ALL)
    legacy.margin = 0.0
    assert legacy.revision == 1 and legacy.choose(problem(), ALL).impl == "portable"

    sub = Slower(model.table)  # a subclass and a changed exponent survive the copy
    sub.exponent = 0.3
    for twin in (pickle.loads(pickle.dumps(sub)), copy.deepcopy(sub)):
        assert type(twin) is Slower and twin.exponent == 0.3 and twin.choose(problem(), ALL).impl == "dense"


def test_layers_share_one_shipped_model_and_model_for_gives_a_new_one():
    from blocksparse.dispatch import shared_model

    assert shared_model("torch", "cpu") is shared_model("torch", "cpu")
    mine = model_for("torch", "cpu")
    assert mine is not model_for("torch", "cpu") and mine is not shared_model("torch", "cpu")
    mine.margin = 0.5  # a user's own model: the layers' shared one is untouched
    assert shared_model("torch", "cpu").margin == 0.05
