"""``make matrix``: every selected cell built and tested by an executor, then the report.

Everything is checked before anything runs or is written (matrix, known failures, pins, the
cell selection, for docker the freshness of the rendered Dockerfiles, then the executor itself,
e.g. that a Docker engine answers); ``dry_run`` stops before the executor and prints the plan.
Cells run one after another; a failing cell never stops the others.
"""
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from . import report
from .environment import cell_requirements, read_pins
from .errors import CELLS_FAILED, ConfigError, StaleFilesError, StaleReportError
from .executors import EXECUTORS, STEP_MARKER, CellJob, make_executor
from .known_failures import load_known_failures, plugin_json, stale_for_matrix
from .matrix import load_matrix, select_cells
from .progress import Progress
from .render import GENERATED_DIR, generated_files, read_readme, stale_generated
from .summary import TEST_LISTS
from . import git
from .source import stage_tree

__all__ = ["RunOptions", "Paths", "plan", "run_matrix", "rebuild_report"]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What ``make matrix`` was asked to do."""

    cells: str = None            # regex searched in cell names; None = all
    executor: str = "local"
    docker_base: str = "auto"    # docker: auto | local | cuda (see harness.executors.docker)
    pytest_args: tuple = ()
    dry_run: bool = False
    fresh: bool = False
    test_timeout: int = 900      # per test, seconds
    run_timeout: int = 7200      # per cell's test run, seconds
    archs: tuple = None          # GPU targets for every cell's kernel build instead of matrix.yaml's


@dataclass(frozen=True)
class Paths:
    """Where the inputs and outputs of a run live, under the project root."""

    root: Path

    @property
    def matrix(self):
        return self.root / "matrix.yaml"

    @property
    def known_failures(self):
        return self.root / "ci" / "known_failures.yaml"

    @property
    def pins(self):
        return self.root / "requirements" / "dev.txt"

    @property
    def work(self):
        return self.root / ".matrix"

    @property
    def reports(self):
        return self.root / "reports"

    def dist(self, cell):
        return self.root / "dist" / cell.name

    def cell_reports(self, cell):
        return self.reports / cell.name


def _normalize_pytest_args(args, root):
    """Paths inside the project become relative: the suite runs from a copy elsewhere."""
    out = []
    for arg in args:
        if not arg.startswith("-") and os.path.isabs(arg.split("::")[0]):
            path, sep, rest = arg.partition("::")
            try:
                rel = Path(path).resolve().relative_to(root.resolve())
            except ValueError:
                out.append(arg)
                continue
            arg = f"{rel.as_posix()}{sep}{rest}"
        out.append(arg)
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Plan:
    cells: tuple
    matrix: tuple                # every cell of matrix.yaml, as written there
    known_failures: tuple
    stale_entries: tuple         # known-failure entries that match no cell of matrix.yaml
    pins: dict
    pytest_args: tuple


def plan(paths, options):
    """Load and check everything a run needs; raises a `FatalError` on any problem."""
    every_cell = load_matrix(paths.matrix)
    cells = select_cells(every_cell, options.cells)
    known = load_known_failures(paths.known_failures)
    pins = read_pins(paths.pins)
    if options.executor not in EXECUTORS:
        raise ConfigError(f"EXECUTOR must be one of {', '.join(EXECUTORS)}; "
                          f"got {options.executor!r}")
    if options.executor == "docker":
        files = generated_files(cells, pins, readme_text=read_readme(paths.root))
        wanted = {k: v for k, v in files.items() if k.startswith(GENERATED_DIR)}
        stale = [p for p in stale_generated(paths.root, wanted) if p in wanted]
        if stale:
            raise StaleFilesError(f"stale generated Dockerfiles ({', '.join(stale)}): "
                                  f"run `make render` and commit the result")
    if options.archs:  # a smoke run's smaller kernel build; the images do not depend on it
        cells = tuple(replace(cell, archs=tuple(options.archs)) for cell in cells)
    return Plan(cells=cells, matrix=every_cell, known_failures=known, pins=pins,
                stale_entries=stale_for_matrix(known, every_cell),
                pytest_args=_normalize_pytest_args(options.pytest_args, paths.root))


def _describe(the_plan, options, out):
    print(f"matrix: {len(the_plan.cells)} cell(s), executor {options.executor}, "
          f"known-failure entries: {len(the_plan.known_failures)}", file=out)
    for cell in the_plan.cells:
        if options.executor == "local":
            how = " ".join(cell_requirements(cell, "cpu", the_plan.pins))
        else:
            how = f"{GENERATED_DIR}/Dockerfile.{cell.name} (base {options.docker_base}: " \
                  f"{cell.image} or the local Debian base)"
        print(f"  {cell.name:26} {cell.status:16} {how}", file=out)
    args = shlex.join(the_plan.pytest_args) if the_plan.pytest_args else "(the whole suite)"
    print(f"  tests: {args}", file=out)
    targets = sorted({",".join(cell.archs) for cell in the_plan.cells})
    note = " (ARCHS=: every cell; a smoke run, not releasable)" if options.archs else ""
    print(f"  GPU targets: {'; '.join(targets) or '-'}{note}", file=out)
    for entry in the_plan.stale_entries:
        print(f"  stale: ci/known_failures.yaml entry {entry['entry']} ({entry['test']}): "
              f"{entry['why']}; fix or delete it", file=out)


def _line_sink(log_file, progress):
    def log(line):
        log_file.write(line + "\n")
        log_file.flush()
        if line.startswith(STEP_MARKER):
            progress.step(line[len(STEP_MARKER):].strip())
    return log


def _one_cell(executor, job, paths, options, progress, tree):
    cell = job.cell
    for d in (job.dist, job.reports):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    start = time.monotonic()
    with open(job.reports / "log.txt", "w", encoding="utf-8") as log_file:
        log = _line_sink(log_file, progress)
        log(f"== cell {cell.name} ({cell.status}), executor {executor.name}, "
            f"started {datetime.now(timezone.utc).isoformat(timespec='seconds')}")
        run = executor.run(job, log)
        log(f"== executor result: {run}")
    result = report.cell_result(cell, run, root=paths.root, reports=job.reports, dist=job.dist,
                                duration=time.monotonic() - start,
                                run_timeout=options.run_timeout, commit=tree[0], dirty=tree[1],
                                pytest_args=job.pytest_args)
    result = replace(result, executor=executor.name)
    report.write_result(job.reports, result)
    return result


def _finish_line(result):
    if result.status in ("skipped", "error", "build-failed") or result.outcome:
        return result.reason or ""
    parts = [f"{result.passed} passed", f"{result.skipped} skipped"]
    parts += [f"{len(getattr(result, k))} {k}" for k in TEST_LISTS if getattr(result, k)]
    return ", ".join(parts)


def _notes(result, progress, log_path, tail=15):
    """What to read at once about a finished cell: the log's end if it broke, what to fix."""
    if "build-failed" in (result.status, result.outcome) or "error" in (result.status,
                                                                        result.outcome):
        try:
            lines = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines[-tail:]:
            progress.message(f"    | {line}")
    for nodeid in result.regressions:
        progress.message(f"    regression: {nodeid}: {result.details[nodeid]['message']}")
    for known in result.fixed_entries:
        progress.message(f"    fixed: delete entry {known['entry']} ({known['test']}) "
                         f"from ci/known_failures.yaml")
    for known in result.stale_entries:
        progress.message(f"    stale: entry {known['entry']} ({known['test']}): {known['why']}")


def run_matrix(root, options, *, executor=None, progress=None, out=None):
    """Run the selected cells and write the reports; returns the exit code (0 or 1).

    ``executor`` and ``progress`` default to the real ones; tests pass fakes.
    """
    out = out or sys.stdout
    paths = Paths(Path(root).resolve())
    the_plan = plan(paths, options)
    _describe(the_plan, options, out)
    if options.dry_run:
        print("dry run: nothing built, nothing written", file=out)
        return 0
    executor = executor or make_executor(options.executor, repo=paths.root, work_dir=paths.work,
                                         pins=the_plan.pins, fresh=options.fresh,
                                         docker_base=options.docker_base)
    # Before anything is written: an executor that cannot run here stops the run now.
    executor.check(out)
    commit, dirty = git.state(paths.root)
    stage = paths.work / "stage"
    stage_tree(paths.root, stage / "src")
    (stage / "known_failures.json").write_text(
        plugin_json(the_plan.known_failures, source="ci/known_failures.yaml"), encoding="utf-8")
    info = {"executor": executor.name, "cells_selected": options.cells,
            "pytest_args": list(the_plan.pytest_args), "archs": options.archs,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "stale_entries": the_plan.stale_entries}
    progress = progress or Progress()
    progress.start(len(the_plan.cells))
    results = {}
    try:
        for i, cell in enumerate(the_plan.cells, start=1):
            progress.start_cell(i, cell.name)
            job = CellJob(cell=cell, stage=stage, dist=paths.dist(cell),
                          reports=paths.cell_reports(cell), pytest_args=the_plan.pytest_args,
                          test_timeout=options.test_timeout, run_timeout=options.run_timeout)
            result = _one_cell(executor, job, paths, options, progress, (commit, dirty))
            results[cell.name] = result
            progress.finish_cell(result.status, _finish_line(result))
            _notes(result, progress, job.reports / "log.txt")
            summary = report.summarize(results, commit=commit, dirty=dirty, matrix=the_plan.matrix,
                                       **info)
            report.write_reports(paths.reports, summary)
    finally:
        progress.close()
    summary = report.summarize(results, commit=commit, dirty=dirty, matrix=the_plan.matrix, **info,
                               finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    report.write_reports(paths.reports, summary)
    verdict = "OK" if summary.ok else "FAILED"
    print(f"matrix: {verdict}; reports in {os.path.relpath(paths.reports)}/ "
          f"(summary.json, matrix.md, index.html)", file=out)
    _say_incomplete("matrix", summary, out)
    return report.exit_code(summary)


def _say_incomplete(what, summary, out):
    for gap in summary.incomplete:
        print(f"{what}: incomplete, not releasable: {gap}", file=out)


def _tested_tree(results):
    """``(commit, dirty)`` shared by every cell result; a `StaleReportError` names the cells of
    each commit when they differ (a report vouches for one tree)."""
    trees = {}
    for result in results.values():
        trees.setdefault(result.commit, []).append(result)
    if len(trees) > 1:
        raise StaleReportError(
            "the cell results were tested at different commits, so they make no one report: "
            + "; ".join(f"{commit or 'no commit recorded'}: {', '.join(r.name for r in cells)}"
                        for commit, cells in trees.items())
            + ". Re-run the other cells at one commit (make matrix CELLS=...)")
    commit = next(iter(trees), None)
    return commit, any(r.dirty for r in results.values()) if results else None


def rebuild_report(root, *, out=None):
    """Rebuild the summary from ``reports/<cell>/result.json`` of the cells of matrix.yaml
    (merging CI's per-cell jobs); returns 0, or `CELLS_FAILED` when a gating cell failed or the
    report does not cover the whole matrix (a cell's result missing, one made with ``ARCHS`` or
    ``PYTEST_ARGS``).  Results made at different commits are a `StaleReportError`: nothing is
    written."""
    out = out or sys.stdout
    paths = Paths(Path(root).resolve())
    matrix = load_matrix(paths.matrix)
    results = report.load_results(paths.reports, [c.name for c in matrix])
    for path in sorted(paths.reports.glob("*/result.json")):
        if path.parent.name not in results:
            print(f"report: ignored {os.path.relpath(path)}: {path.parent.name} is not a cell of "
                  "matrix.yaml", file=out)
    commit, dirty = _tested_tree(results)
    executors = sorted({r.executor or "unknown" for r in results.values()})
    known = load_known_failures(paths.known_failures)
    summary = report.summarize(results, commit=commit, dirty=dirty, matrix=matrix,
                               stale_entries=stale_for_matrix(known, matrix),
                               executor=", ".join(executors) or "none",
                               finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    report.write_reports(paths.reports, summary)
    print(f"report: {len(results)} cell(s), {'OK' if summary.ok else 'FAILED'}", file=out)
    _say_incomplete("report", summary, out)
    return report.exit_code(summary) or (CELLS_FAILED if summary.incomplete else 0)
