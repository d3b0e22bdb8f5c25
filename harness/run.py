"""``make matrix``: every selected cell built and tested by an executor, then the report.

Everything is checked before anything runs (matrix, known failures, pins, the cell selection,
and for docker the freshness of the rendered Dockerfiles); ``dry_run`` stops there and prints
the plan.  Cells run one after another; a failing cell never stops the others.
"""
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import report
from .environment import cell_requirements, read_pins
from .errors import ConfigError, StaleFilesError
from .executors import EXECUTORS, STEP_MARKER, CellJob, make_executor
from .known_failures import load_known_failures, plugin_json
from .matrix import load_matrix, select_cells
from .progress import Progress
from .render import GENERATED_DIR, generated_files, stale_generated
from .source import git_state, stage_tree

__all__ = ["RunOptions", "Paths", "plan", "run_matrix", "rebuild_report"]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What ``make matrix`` was asked to do."""

    cells: str = None            # regex searched in cell names; None = all
    executor: str = "local"
    pytest_args: tuple = ()
    dry_run: bool = False
    fresh: bool = False
    test_timeout: int = 900      # per test, seconds
    run_timeout: int = 7200      # per cell's test run, seconds


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
    known_failures: tuple
    pins: dict
    pytest_args: tuple


def plan(paths, options):
    """Load and check everything a run needs; raises a `FatalError` on any problem."""
    cells = select_cells(load_matrix(paths.matrix), options.cells)
    known = load_known_failures(paths.known_failures)
    pins = read_pins(paths.pins)
    if options.executor not in EXECUTORS:
        raise ConfigError(f"EXECUTOR must be one of {', '.join(EXECUTORS)}; "
                          f"got {options.executor!r}")
    if options.executor == "docker":
        readme = (paths.root / "README.md").read_text(encoding="utf-8")
        files = generated_files(cells, pins, readme_text=readme)
        wanted = {k: v for k, v in files.items() if k.startswith(GENERATED_DIR)}
        stale = [p for p in stale_generated(paths.root, wanted) if p in wanted]
        if stale:
            raise StaleFilesError(f"stale generated Dockerfiles ({', '.join(stale)}): "
                                  f"run `make render` and commit the result")
    return Plan(cells=cells, known_failures=known, pins=pins,
                pytest_args=_normalize_pytest_args(options.pytest_args, paths.root))


def _describe(the_plan, options, out):
    print(f"matrix: {len(the_plan.cells)} cell(s), executor {options.executor}, "
          f"known-failure entries: {len(the_plan.known_failures)}", file=out)
    for cell in the_plan.cells:
        if options.executor == "local":
            how = " ".join(cell_requirements(cell, "cpu", the_plan.pins))
        else:
            how = f"{GENERATED_DIR}/Dockerfile.{cell.name} (FROM {cell.image})"
        print(f"  {cell.name:26} {cell.status:16} {how}", file=out)
    args = shlex.join(the_plan.pytest_args) if the_plan.pytest_args else "(the whole suite)"
    print(f"  tests: {args}", file=out)


def _line_sink(log_file, progress):
    def log(line):
        log_file.write(line + "\n")
        log_file.flush()
        if line.startswith(STEP_MARKER):
            progress.step(line[len(STEP_MARKER):].strip())
    return log


def _one_cell(executor, job, paths, options, progress):
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
    entry = report.cell_result(cell, run, root=paths.root, reports=job.reports, dist=job.dist,
                               duration=time.monotonic() - start,
                               run_timeout=options.run_timeout)
    entry["executor"] = executor.name
    (job.reports / "result.json").write_text(json.dumps(entry, indent=1) + "\n", encoding="utf-8")
    return entry


def _finish_line(entry):
    if entry["status"] in ("skipped", "error", "build-failed") or entry.get("outcome"):
        return entry["reason"] or ""
    parts = [f"{entry['passed']} passed", f"{entry['skipped']} skipped"]
    parts += [f"{len(entry[k])} {k}" for k in ("regressions", "known", "fixed", "flaky")
              if entry[k]]
    return ", ".join(parts)


def _notes(entry, progress, log_path, tail=15):
    """What to read at once about a finished cell: the log's end if it broke, what to fix."""
    if entry["status"] in ("build-failed", "error") or entry.get("outcome") in (
            "build-failed", "error"):
        try:
            lines = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines[-tail:]:
            progress.message(f"    | {line}")
    for nodeid in entry["regressions"]:
        progress.message(f"    regression: {nodeid}: {entry['details'][nodeid]['message']}")
    for known in entry["fixed_entries"]:
        progress.message(f"    fixed: delete entry {known['entry']} ({known['test']}) "
                         f"from ci/known_failures.yaml")


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
                                         pins=the_plan.pins, fresh=options.fresh)
    commit, dirty = git_state(paths.root)
    stage = paths.work / "stage"
    stage_tree(paths.root, stage / "src")
    (stage / "known_failures.json").write_text(
        plugin_json(the_plan.known_failures, source="ci/known_failures.yaml"), encoding="utf-8")
    info = {"executor": executor.name, "cells_selected": options.cells,
            "pytest_args": list(the_plan.pytest_args),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    progress = progress or Progress()
    progress.start(len(the_plan.cells))
    results = {}
    try:
        for i, cell in enumerate(the_plan.cells, start=1):
            progress.start_cell(i, cell.name)
            job = CellJob(cell=cell, stage=stage, dist=paths.dist(cell),
                          reports=paths.cell_reports(cell), pytest_args=the_plan.pytest_args,
                          test_timeout=options.test_timeout, run_timeout=options.run_timeout)
            entry = _one_cell(executor, job, paths, options, progress)
            results[cell.name] = entry
            progress.finish_cell(entry["status"], _finish_line(entry))
            _notes(entry, progress, job.reports / "log.txt")
            summary = report.summarize(results, commit=commit, dirty=dirty, **info)
            report.write_reports(paths.reports, summary)
    finally:
        progress.close()
    summary = report.summarize(results, commit=commit, dirty=dirty, **info,
                               finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    report.write_reports(paths.reports, summary)
    verdict = "OK" if summary["ok"] else "FAILED"
    print(f"matrix: {verdict}; reports in {os.path.relpath(paths.reports)}/ "
          f"(summary.json, matrix.md, index.html)", file=out)
    return report.exit_code(summary)


def rebuild_report(root, *, out=None):
    """Rebuild the summary from ``reports/<cell>/result.json`` (merging CI's per-cell jobs)."""
    out = out or sys.stdout
    paths = Paths(Path(root).resolve())
    order = [c.name for c in load_matrix(paths.matrix)]
    results = report.load_results(paths.reports, order)
    commit, dirty = git_state(paths.root)
    executors = sorted({r.get("executor") or "unknown" for r in results.values()})
    summary = report.summarize(results, commit=commit, dirty=dirty,
                               executor=", ".join(executors) or "none")
    report.write_reports(paths.reports, summary)
    print(f"report: {len(results)} cell(s), {'OK' if summary['ok'] else 'FAILED'}", file=out)
    return report.exit_code(summary)
