"""Version scheme (the tensorflow-text convention).

A wheel built against TensorFlow X.Y is versioned ``X.Y.PATCH`` and works with
``tensorflow>=X.Y,<X.(Y+1)``; ``PATCH`` counts our own releases for that TensorFlow minor.
"""
#: Our release counter within one TensorFlow minor version; bump it for each release.
PATCH = 0


def wheel_version(tf_version):
    """Version of a wheel built against TensorFlow ``tf_version`` (e.g. ``"2.21.0"`` -> ``"2.21.0"``)."""
    major, minor = tf_version.split(".")[:2]
    return f"{int(major)}.{int(minor)}.{PATCH}"


def tf_window(tf_version):
    """The requirement window of a wheel built against ``tf_version``: ``(">=2.21", "<2.22")``."""
    major, minor = (int(p) for p in tf_version.split(".")[:2])
    return f">={major}.{minor}", f"<{major}.{minor + 1}"
