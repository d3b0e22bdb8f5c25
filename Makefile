# blocksparse -- developer entry points.  A fresh clone needs nothing but `make`:
# every target that needs the environment creates it first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# `make matrix` options (see README "Build matrix"): CELLS=<regex> EXECUTOR=local|docker
# DOCKER_BASE=auto|local|cuda PYTEST_ARGS=... DRY_RUN=1 FRESH=1.
EXECUTOR ?= local
DOCKER_BASE ?= auto
CELLS ?=
shquote = '$(subst ','\'',$(1))'
# Set on the command line or in the environment only (a makefile default must not turn it on).
given = $(if $(filter command line environment,$(origin $(1))),$(strip $(value $(1))))
# Values are passed on as written: `$(value X)`, since make would expand a `$` in them (a regex's
# `py3\.11$$|py3\.12$$`, a password's).  The release's settings reach it through the environment:
# command-line ones are re-exported unexpanded.
RELEASE_ENV := REPOSITORY_URL INDEX_URL TWINE_USERNAME TWINE_PASSWORD TWINE_REPOSITORY TWINE_REPOSITORY_URL
$(foreach v,$(RELEASE_ENV),$(if $(filter command line,$(origin $(v))),$(eval override $(v) := $$(value $(v)))$(eval export $(v))))

# GNU make exits 2 whatever a recipe's status was: the harness's own exit code (README "Exit
# codes") is printed as the recipe's last line instead, and in make's "Error N" line.
harness_status = status=$$?; [ $$status = 0 ] || echo "make $@: exit code $$status (README: Exit codes)" >&2; exit $$status

.PHONY: install test compile render matrix release bench clean docker-engine docker-base

install: $(STAMP)  ## create .venv with the pinned development set (idempotent)

$(STAMP): requirements/dev.txt setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

test: install  ## the whole CPU test suite (what .ci/run calls)
	$(PY) -m pytest $(PYTEST_ARGS)

compile: install  ## build the wheel for the installed TensorFlow into dist/ (GPU kernels + op library)
	PYTHON=$(PY) scripts/build_wheel.sh dist

render: install  ## render docker/generated/, .github/workflows/gpu-matrix.yml and the README table from matrix.yaml
	$(PY) -m harness render; $(harness_status)

matrix: install  ## build + test every selected cell (CELLS=regex EXECUTOR=local|docker), write reports/
	$(PY) -m harness matrix --executor=$(call shquote,$(EXECUTOR)) \
	    --docker-base=$(call shquote,$(DOCKER_BASE)) \
	    --cells=$(call shquote,$(value CELLS)) --pytest-args=$(call shquote,$(value PYTEST_ARGS)) \
	    $(if $(call given,ARCHS),--archs=$(call shquote,$(value ARCHS))) \
	    $(if $(call given,DRY_RUN),--dry-run=$(call shquote,$(DRY_RUN))) \
	    $(if $(call given,FRESH),--fresh=$(call shquote,$(FRESH))); $(harness_status)

docker-engine:  ## install (docker.io, debootstrap) and start a Docker Engine when none answers (root)
	scripts/docker_engine.sh

docker-base: install  ## make the local Debian base image of the docker cells (cached; needs the engine)
	$(PY) -m harness docker-base; $(harness_status)

# DRY_RUN, RUN_MATRIX and REPOSITORY_URL reach harness/release.py through the environment (make
# exports command-line variables), so a password in REPOSITORY_URL is never on a command line.
# CELLS, ARCHS and PYTEST_ARGS do not reach the matrix run a release starts: it covers every cell.
release: install  ## gates + twine check + tag + upload; DRY_RUN=1 (default) only prints the plan
	@$(PY) -m harness.release; $(harness_status)

# The benchmark needs a CUDA build of torch and triton: BENCH_PYTHON=<such a python>, else .venv.
BENCH_PYTHON ?= $(PY)
bench:  ## every GPU benchmark (on a GPU machine): bench/results/*-h200.{json,md}, latency, the eager breakdown, the dispatch table
	$(if $(filter $(PY),$(BENCH_PYTHON)),$(MAKE) install)
	$(BENCH_PYTHON) bench/bsmm.py --out bench/results
	$(BENCH_PYTHON) bench/latency.py --out bench/results
	$(BENCH_PYTHON) bench/few_tokens.py --out bench/results/raw
	$(BENCH_PYTHON) bench/aot_vs_jit.py --out bench/results
	$(BENCH_PYTHON) bench/profile_eager.py --breakdown --out bench/results
	$(BENCH_PYTHON) bench/attention.py --out bench/results
	$(BENCH_PYTHON) bench/norms.py --out bench/results
	$(BENCH_PYTHON) bench/conv.py --out bench/results
	$(BENCH_PYTHON) bench/conv_implicit.py --out bench/results
	$(BENCH_PYTHON) bench/dispatch.py --out bench/results --install
	$(BENCH_PYTHON) bench/pixelfly.py --out bench/results

clean:
	rm -rf build dist reports *.egg-info .matrix blocksparse/_tf_ops.so blocksparse/_kernels.so blocksparse/_build_info.json
