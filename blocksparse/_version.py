"""Version scheme (the tensorflow-text convention) and the TensorFlow versions we support.

A wheel built against TensorFlow X.Y is versioned ``X.Y.PATCH`` and works with
``tensorflow>=X.Y,<X.(Y+1)``; ``PATCH`` counts our own releases for that TensorFlow minor.  A wheel
built against a pre-release of TensorFlow (``2.22.0rc0``; a nightly's ``2.22.0-dev20250101``) says
so: it is ``2.22.PATCHrc0`` and requires ``tensorflow>=2.22.0rc0,<2.23``, which admits the
pre-release it was built and tested with (a plain ``>=2.22`` would not); the release never
publishes such a wheel.

Standalone on purpose (no imports from the package): ``setup.py`` and the matrix harness read it
without importing blocksparse or TensorFlow.  The one place that parses TensorFlow versions.
"""
import re

#: Our release counter within one TensorFlow minor version; bump it for each release.
PATCH = 0

#: Oldest TensorFlow (major, minor) blocksparse supports.
MIN_TF = (2, 16)


def tf_minor(version):
    """``"2.16.1"`` / ``"2.17.0rc0"`` / ``"2.18.0-dev20240101"`` / ``"2.21"`` -> ``(2, 16)`` ...;
    None when ``version`` does not start with ``MAJOR.MINOR``.

    >>> tf_minor("2.21.0rc1"), tf_minor("nightly")
    ((2, 21), None)
    """
    match = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(match.group(1)), int(match.group(2))) if match else None


def minor_text(version):
    """``"2.21.3"`` -> ``"2.21"``; a version without ``MAJOR.MINOR`` is returned as it is."""
    parsed = tf_minor(version)
    return f"{parsed[0]}.{parsed[1]}" if parsed else str(version)


def _parsed(tf_version):
    parsed = tf_minor(tf_version)
    if parsed is None:
        raise ValueError(f"tf_version must start with MAJOR.MINOR (e.g. '2.21.0'); got {tf_version!r}")
    return parsed


def prerelease(tf_version):
    """The pre-release part of a TensorFlow version, normalized as PEP 440 writes it; ``""`` for
    a final release.

    >>> prerelease("2.22.0-rc0"), prerelease("2.22.0.dev20250101"), prerelease("2.21.1")
    ('rc0', '.dev20250101', '')
    """
    match = re.match(r"\s*\d+\.\d+(?:\.\d+)*[-_.]?(a|alpha|b|beta|rc|c|dev)[-_.]?(\d*)",
                     str(tf_version), re.IGNORECASE)
    if match is None:
        return ""
    kind = match.group(1).lower()
    kind = {"alpha": "a", "beta": "b", "c": "rc", "dev": ".dev"}.get(kind, kind)
    return f"{kind}{match.group(2) or 0}"


def wheel_version(tf_version):
    """Version of a wheel built against TensorFlow ``tf_version``: ``"2.21.0"`` -> ``"2.21.0"``,
    ``"2.22.0rc0"`` -> ``"2.22.0rc0"`` (with ``PATCH`` 0)."""
    major, minor = _parsed(tf_version)
    return f"{major}.{minor}.{PATCH}{prerelease(tf_version)}"


def tf_window(tf_version):
    """The requirement window of a wheel built against ``tf_version``: ``(">=2.21", "<2.22")``;
    from a pre-release on for one (``(">=2.22.0rc0", "<2.23")``)."""
    major, minor = _parsed(tf_version)
    pre = prerelease(tf_version)
    return f">={major}.{minor}" + (f".0{pre}" if pre else ""), f"<{major}.{minor + 1}"
