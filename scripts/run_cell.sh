#!/usr/bin/env bash
# One matrix cell, inside its environment: build the wheel -> install it -> run the library test
# suite against the installed wheel.  Both executors run this script (the local executor in a
# virtualenv, the docker executor in the cell's container); the environment only provides Python,
# TensorFlow, pytest, pytest-timeout and Triton (the kernels' ahead-of-time compiler).
#
# Usage: scripts/run_cell.sh [PYTEST ARGS...]      (arguments select tests, as for pytest)
#
# Environment (set by the harness; see harness/executors/__init__.py):
#   CELL                 the cell's name, e.g. tf2.21-cu12.5-py3.11
#   CELL_PYTHON          the environment's interpreter
#   CELL_SRC             the source tree to build and take the tests from (not modified)
#   CELL_DIST            where the wheel goes (emptied first)
#   CELL_REPORTS         where junit.xml and outcomes.json go
#   CELL_KNOWN_FAILURES  known-failure entries as JSON (optional)
#   CELL_COMPILE_ONLY    1: build and install only, run no tests
#   CELL_TEST_TIMEOUT    default per-test timeout in seconds (default 900)
#   CELL_RUN_TIMEOUT     wall-clock limit of the whole test run in seconds (default 7200)
#
# Progress lines "::cell-step:: <step>" mark build, install, test.  Exit status: pytest's;
# 10 when the wheel does not build; 11 when it does not install; 12 when pytest was killed by a
# signal (e.g. out of memory); 124 when the run timed out.  So a status above 128 always means
# the script itself was killed (docker kill, the OOM killer ...).
set -euo pipefail

: "${CELL:?}" "${CELL_PYTHON:?}" "${CELL_SRC:?}" "${CELL_DIST:?}" "${CELL_REPORTS:?}"
step() { echo "::cell-step:: $1"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/blocksparse-cell.XXXXXX")
trap 'rm -rf "$work"' EXIT

step build
# Build from a copy: the build writes build/ and *.egg-info next to the sources.
cp -a "$CELL_SRC" "$work/src"
rm -rf "$CELL_DIST" && mkdir -p "$CELL_DIST" "$CELL_REPORTS"
if [[ -z "${BLOCKSPARSE_TF_VERSION:-}" ]]; then
    # setup.py versions the wheel after `tensorflow` / `tensorflow-cpu`; the nightly is
    # another distribution, so name its version here.
    nightly=$("$CELL_PYTHON" -c 'from importlib import metadata as m
for d in ("tf-nightly", "tf-nightly-cpu"):
    try:
        print(m.version(d)); break
    except m.PackageNotFoundError:
        pass')
    if [[ -n "$nightly" ]]; then export BLOCKSPARSE_TF_VERSION=$nightly; fi
fi
(cd "$work/src" && PYTHON="$CELL_PYTHON" scripts/build_wheel.sh "$CELL_DIST") || exit 10
wheels=("$CELL_DIST"/blocksparse-*.whl)
if [[ ${#wheels[@]} -ne 1 || ! -f ${wheels[0]} ]]; then
    echo "run_cell: expected one blocksparse wheel in $CELL_DIST, found: ${wheels[*]}" >&2
    exit 10
fi

step install
# --force-reinstall: a reused environment may hold an older build of the same version.
pip=("$CELL_PYTHON" -m pip install --disable-pip-version-check)
"${pip[@]}" --force-reinstall --no-deps "${wheels[0]}" && "${pip[@]}" "${wheels[0]}" || exit 11
if [[ "${CELL_COMPILE_ONLY:-0}" == 1 ]]; then
    echo "run_cell: compile-only cell, no tests"
    exit 0
fi

step test
# The suite runs from a copy outside the source tree, so `import blocksparse` is the wheel.
mkdir -p "$work/tests" "$work/plugins"
cp -a "$CELL_SRC/test" "$work/tests/test"
rm -rf "$work/tests/test/harness"           # the harness's own tests are development-only
cp "$CELL_SRC/pyproject.toml" "$work/tests/" # pytest settings: markers, warnings, addopts
cp "$CELL_SRC/README.md" "$work/tests/"      # its examples are tested (test/test_readme*.py)
cp "$CELL_SRC/harness/pytest_known_failures.py" "$work/plugins/"
for arg in "$@"; do  # a test module named outside test/ comes along too
    path=${arg%%::*}
    if [[ "$path" == *.py && "$path" != /* && "$path" != *..* && -f "$CELL_SRC/$path" \
          && ! -e "$work/tests/$path" ]]; then
        mkdir -p "$(dirname "$work/tests/$path")" && cp "$CELL_SRC/$path" "$work/tests/$path"
    fi
done
cd "$work/tests"
"$CELL_PYTHON" -c 'import blocksparse; print("run_cell: testing", blocksparse.__file__)' || true
known=()
if [[ -n "${CELL_KNOWN_FAILURES:-}" ]]; then known=("--known-failures=$CELL_KNOWN_FAILURES"); fi
# Options take their values with "=": pytest picks its rootdir before it knows the plugin's
# options, and would take a separate value (a path under the source tree) for a test path.
# A module that fails to import is recorded (a regression, or known when an entry names it)
# and the cell's other modules still run: --continue-on-collection-errors.
set +e
started=$SECONDS
PYTHONPATH="$work/plugins" timeout --kill-after=30 "${CELL_RUN_TIMEOUT:-7200}" \
    "$CELL_PYTHON" -m pytest --rootdir="$work/tests" -c "$work/tests/pyproject.toml" \
    -p no:cacheprovider -p pytest_known_failures --continue-on-collection-errors \
    "--cell=$CELL" "${known[@]}" "--known-failures-report=$CELL_REPORTS/outcomes.json" \
    "--junitxml=$CELL_REPORTS/junit.xml" -o "junit_suite_name=$CELL" \
    "--timeout=${CELL_TEST_TIMEOUT:-900}" "$@"
status=$?
set -e
echo "run_cell: pytest exit status $status"
if ((status == 124 || (status > 128 && SECONDS - started >= ${CELL_RUN_TIMEOUT:-7200}))); then
    echo "run_cell: the test run exceeded its limit of ${CELL_RUN_TIMEOUT:-7200} s"
    exit 124  # timeout stopped it (or killed it after the grace period: 137)
elif ((status > 128)); then
    echo "run_cell: pytest was killed by signal $((status - 128))"
    exit 12
fi
exit $status
