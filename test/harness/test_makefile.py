"""The Makefile passes values on as written: a `$` in a cell regex, in pytest arguments or in a
release setting is not expanded by make."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make(*args):
    done = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_matrix_passes_regexes_with_dollars_unchanged():
    out = make("-n", "-o", ".venv/.installed", "matrix", r"CELLS=py3\.11$|py3\.12$", 'PYTEST_ARGS=-k "a$b"',
               "ARCHS=sm_90")
    assert r"--cells='py3\.11$|py3\.12$'" in out and """--pytest-args='-k "a$b"'""" in out
    assert "--archs='sm_90'" in out


def test_release_settings_reach_the_environment_unexpanded():
    """Command-line release settings are exported as written (make would turn `pa$word` into `paord`)."""
    rule = 'showenv: ; @printf "%s|%s\\n" "$$REPOSITORY_URL" "$$TWINE_PASSWORD"'
    out = make("--eval", rule, "showenv", "REPOSITORY_URL=https://u:pa$word@h.example/", "TWINE_PASSWORD=x$y$$z")
    assert out.strip() == "https://u:pa$word@h.example/|x$y$$z"
