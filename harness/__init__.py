"""The matrix harness: matrix.yaml -> cells -> Dockerfiles -> wheels + test reports -> release.

Development tooling only: it is not part of the ``blocksparse`` wheel.
"""
