"""The matrix harness: matrix.yaml -> cells -> Dockerfiles -> wheels + test reports -> release.

Development tooling only: it is not part of the ``blocksparse`` wheel.

Modules
-------
``matrix``          ``matrix.yaml`` validated into frozen `Cell` records (TF x CUDA x Python).
``known_failures``  ``ci/known_failures.yaml`` validated; handed to the pytest plugin as JSON.
``pytest_known_failures``  the pytest plugin a cell loads (stdlib + pytest only).
``render``          Dockerfiles, the GPU workflow and the README table, from the cells (pure).
``executors``       ``local`` (a virtualenv per cell) and ``docker`` (docker SDK, a real
                    engine); both run ``scripts/run_cell.sh``, which calls
                    ``scripts/build_wheel.sh``.
``docker_base``     the local Debian base image (debootstrap from the machine's apt mirror).
``pip_settings``    the machine's pip settings, carried into the cell images.
``interpreters``    finding a cell's ``python3.X``; running a command line by line.
``run``             ``make matrix``: plan, check the executor, run the cells, write the reports.
``summary``         the report's schema (frozen `CellResult`, `Summary`), shared with the release.
``report``          cell results, ``summary.json``, ``matrix.md``, ``index.html``.
``templating``      the one jinja2 environment (``StrictUndefined``).
``git``             every git fact (commit, dirty tree, files, tags).
``errors``          the fatal errors and the one exit-code table (harness and release).
``versions``        TensorFlow versions, from ``blocksparse/_version.py``.
``cli``             ``python -m harness {render,matrix,report,docker-base}``.
``release*``        ``make release`` (``python -m harness.release``).

Output contract (what ``make release`` and CI read)
---------------------------------------------------
``dist/<cell>/blocksparse-*.whl``
    The wheel built in that cell (exactly one per built cell).
``reports/<cell>/``
    ``log.txt`` (everything the cell printed), ``junit.xml``, ``outcomes.json`` (every test's
    sorted outcome, from the plugin) and ``result.json`` (the cell's entry of the summary).
``reports/summary.json``
    ::

        {"commit": "<git rev-parse HEAD of the tested tree, or null outside git>",
         "dirty": <true when the tested tree differed from that commit (edits or untracked
                   files), null outside git>,
         "executor": "local" | "docker", "cells_selected": <CELLS regex or null>,
         "pytest_args": [<PYTEST_ARGS>], "archs": [<ARCHS>] or null (matrix.yaml's),
         "started": ISO-8601, "finished": ISO-8601, or null while running or when interrupted,
         "ok": <false when a gating cell failed>,
         "complete": <true when the report covers the whole matrix (below)>,
         "incomplete": [<why not, one sentence each; empty when complete>],
         "stale_entries": [<known-failure entries whose cells match no cell, with "why">],
         "cells": {"<cell>": {
             "status": "passed" | "built" | "regressed" | "known-fixed" | "build-failed"
                       | "error" | "skipped" | "allowed-failure",
             "outcome": <underlying status; only with "allowed-failure">,
             "reason": <one line, or null>,
             "passed": <count>, "skipped": <count>,
             "regressions": [node ids], "known": [...], "fixed": [...], "flaky": [...],
             "details": {<node id>: {"outcome", "message", "entry", "attempts"}},
             "fixed_entries": [<known-failure entries to delete>],
             "stale_entries": [<entries that matched no collected test here, with "why">],
             "tensorflow": "2.21", "python": "3.11", "cuda": "12.5", "cudnn": "9.3",
             "archs": [...], "image": "...", "matrix_status": "supported" | "compile-only"
                                                            | "allowed-to-fail",
             "gating": <bool>,
             "wheels": [{"path": "dist/<cell>/blocksparse-....whl", "sha256": "<hex>"}],
             "commit": <the tree this cell tested>, "dirty": <bool>,
             "pytest_args": [<the tests it ran; empty: the whole suite>],
             "log": "reports/<cell>/log.txt", "junit": <path or null>,
             "duration_s": <float>, "executor": "local" | "docker"}}}

    Paths are relative to the project root.  The report is *complete*
    (`harness.summary.coverage_gaps`) when the run finished and it has a result for every
    gating cell of matrix.yaml and no other, each made at the report's commit, for matrix.yaml's
    archs, with the whole suite.  A wheel is fit to publish when the report is complete, its
    ``commit`` is the release commit with ``dirty`` false, its cell's status is ``passed`` (with
    a test passed) or ``built`` (compile-only), ``gating`` is true, its version is final (not
    built for a TensorFlow pre-release), and the file still has the listed sha256.
"""
