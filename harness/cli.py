"""Command line of the harness: ``python -m harness {render,matrix,report,docker-base}``.

The Makefile's ``render``, ``matrix`` and ``docker-base`` targets call it.  `main` is the one
place that catches `FatalError`: it prints the message and exits with the error's code (the
table in `harness.errors`; 1 means "a cell failed").
"""
import argparse
import shlex
import signal
import sys
from pathlib import Path

from .environment import read_pins
from .errors import INTERRUPTED, ConfigError, FatalError, StaleFilesError
from .executors import EXECUTORS
from .executors.docker import BASES
from .matrix import arch_problem, load_matrix
from ._schema import parse_flag
from .render import ROOT, generated_files, read_readme, stale_generated, write_generated
from .run import Paths, RunOptions, rebuild_report, run_matrix

__all__ = ["main"]


def _render(args):
    paths = Paths(Path(args.root).resolve())
    cells = load_matrix(paths.matrix)
    files = generated_files(cells, read_pins(paths.pins), readme_text=read_readme(paths.root))
    if args.check:
        stale = stale_generated(paths.root, files)
        for rel in stale:
            print(f"stale: {rel}")
        if stale:
            raise StaleFilesError(f"{len(stale)} generated file(s) differ from matrix.yaml: run "
                                  f"`make render` and commit the result")
        return 0
    changed = write_generated(paths.root, files)
    print(f"render: {len(files)} file(s) from matrix.yaml; "
          + (f"updated {', '.join(changed)}" if changed else "all up to date"))
    return 0


def _pytest_args(text):
    try:
        return tuple(shlex.split(text or ""))
    except ValueError as e:  # shlex: "No closing quotation", "No escaped character"
        raise ConfigError(f"PYTEST_ARGS={text!r} is not valid shell syntax ({e}); quote it as "
                          f"in a shell, e.g. PYTEST_ARGS='-k \"not slow\"'") from None


def _archs(text):
    """``"sm_90,compute_80"`` -> ``("sm_90", "compute_80")``, each checked as matrix.yaml checks archs."""
    archs = tuple(a.strip() for a in text.split(",") if a.strip())
    problems = [arch_problem(a) for a in archs if arch_problem(a)]
    twice = sorted({a for a in archs if archs.count(a) > 1})
    problems += [f"listed twice: {', '.join(twice)}"] if twice else []
    if not archs or problems:
        raise argparse.ArgumentTypeError(f"ARCHS must be a comma-separated list of GPU targets like "
                                         f"sm_90,compute_80; got {text!r}"
                                         + "".join(f"; {p}" for p in problems))
    return archs


def _matrix(args):
    options = RunOptions(cells=args.cells or None, executor=args.executor,
                         docker_base=args.docker_base,
                         pytest_args=_pytest_args(args.pytest_args),
                         dry_run=args.dry_run, fresh=args.fresh,
                         test_timeout=args.test_timeout, run_timeout=args.run_timeout, archs=args.archs)
    return run_matrix(args.root, options)


def _report(args):
    return rebuild_report(args.root)


def _docker_base(args):
    from .executors.docker import DockerExecutor
    DockerExecutor(repo=Path(args.root).resolve(), base="local").check(sys.stdout)
    return 0


def _on_off(name):
    """An argparse type: a yes/no word (1/0, true/false, yes/no, on/off, any case), as the release tool reads
    its settings; the Makefile passes ``DRY_RUN`` / ``FRESH`` through as given."""
    def parse(text):
        try:
            return parse_flag(name, text, False)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def _positive_int(text):
    """An argparse type: an integer >= 1 (seconds); 0 or less would turn a limit off or break it."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of seconds >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of seconds >= 1, got {value}")
    return value


def _parser():
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(ROOT), help="project root (default: this checkout)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="write docker/generated/, the GPU workflow, the README table")
    p.add_argument("--check", action="store_true",
                   help="only report stale files (exit 10 if any, writing nothing)")
    p.set_defaults(func=_render)

    p = sub.add_parser("matrix", help="build and test the selected cells, write reports/")
    p.add_argument("--cells", help="regex searched in cell names (default: every cell; a report "
                                   "of fewer cells than the gating ones cannot be released)")
    p.add_argument("--executor", choices=EXECUTORS, default="local")
    p.add_argument("--docker-base", choices=BASES, default="auto",
                   help="docker: the images' base: cuda (the CUDA devel images, GPUs attached), "
                        "local (the Debian base, no GPU), auto (cuda where the engine has the "
                        "nvidia runtime)")
    p.add_argument("--pytest-args", default="",
                   help="pytest arguments for every cell, one string (default: the whole suite; a "
                        "report made with others cannot be released)")
    p.add_argument("--archs", type=_archs, default=None,
                   help="GPU targets of every cell's kernel build, e.g. sm_90 (default: matrix.yaml's; a smoke "
                        "run's smaller build, whose report cannot be released)")
    p.add_argument("--dry-run", nargs="?", const="1", default="0", type=_on_off("DRY_RUN"), metavar="1|0",
                   help="check and show the plan, run nothing")
    p.add_argument("--fresh", nargs="?", const="1", default="0", type=_on_off("FRESH"), metavar="1|0",
                   help="recreate local cell environments")
    p.add_argument("--test-timeout", type=_positive_int, default=900,
                   help="per-test timeout, seconds (default: %(default)s)")
    p.add_argument("--run-timeout", type=_positive_int, default=7200,
                   help="limit of one cell's whole test run, seconds (default: %(default)s)")
    p.set_defaults(func=_matrix)

    p = sub.add_parser("report", help="rebuild summary.json, matrix.md, index.html from "
                                      "reports/<cell>/result.json (exit 1 when a gating cell "
                                      "failed or the report does not cover the whole matrix)")
    p.set_defaults(func=_report)

    p = sub.add_parser("docker-base", help="make the local base image of the docker cells "
                                           "(needs the engine; reused when present)")
    p.set_defaults(func=_docker_base)
    return parser


def _stop(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (CI cancels, `kill`) cleans up as Ctrl-C does


def main(argv=None):
    args = _parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return args.func(args)
    except FatalError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
