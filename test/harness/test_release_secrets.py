"""Credentials: where twine's come from, and that they are masked out of every printed line."""
import pytest

from harness.errors import ConfigError
from harness.release_secrets import (MASK, Credentials, Masker, check_url, pypirc_section,
                                     split_userinfo)

PYPI = "https://upload.pypi.org/legacy/"


def test_masker_hides_secrets_and_url_passwords():
    mask = Masker(["s3cr%21t", "", None])
    line = ("token s3cr%21t and s3cr!t, url https://bob:hunter2@example.org/legacy/ "
            "and http://alice:@host:8080/")
    shown = mask(line)
    assert "s3cr" not in shown and "hunter2" not in shown
    assert shown == (f"token {MASK} and {MASK}, url https://bob:{MASK}@example.org/legacy/ "
                     f"and http://alice:{MASK}@host:8080/")


def test_masker_masks_the_longest_secret_whole():
    assert Masker(["abc", "abcdef"])("xabcdefx abc") == f"x{MASK}x {MASK}"
    assert Masker(["abc"]).adding(["zz"])("abc zz") == f"{MASK} {MASK}"


def test_masker_keeps_ordinary_text():
    text = "Uploading blocksparse-2.21.0-py3-none-any.whl to https://upload.pypi.org/legacy/"
    assert Masker([])(text) == text


@pytest.mark.parametrize("url, expected", [
    ("https://upload.pypi.org/legacy/", ("https://upload.pypi.org/legacy/", None, None)),
    ("http://me:p%40ss@127.0.0.1:8080/", ("http://127.0.0.1:8080/", "me", "p@ss")),
    ("https://__token__:pypi-AgE@upload.pypi.org/legacy/",
     ("https://upload.pypi.org/legacy/", "__token__", "pypi-AgE")),
    ("http://me@[::1]:9/x", ("http://[::1]:9/x", "me", None)),
])
def test_split_userinfo(url, expected):
    assert split_userinfo(url) == expected


def write_pypirc(tmp_path, text):
    path = tmp_path / ".pypirc"
    path.write_text(text)
    return path


PYPIRC = """\
[distutils]
index-servers = pypi local

[pypi]
username = __token__
password = pypi-from-file

[local]
repository = http://127.0.0.1:8080
username = me
password = local-pass
"""


def test_pypirc_section_matches_the_url(tmp_path):
    path = write_pypirc(tmp_path, PYPIRC)
    assert pypirc_section(path, PYPI, PYPI) == ("pypi", "__token__", "pypi-from-file")
    assert pypirc_section(path, "http://127.0.0.1:8080/", PYPI) == ("local", "me", "local-pass")
    assert pypirc_section(path, "http://127.0.0.1:9999/", PYPI) is None
    assert pypirc_section(tmp_path / "missing", PYPI, PYPI) is None


def test_malformed_pypirc_error_does_not_quote_it(tmp_path):
    path = write_pypirc(tmp_path, "password = leaked-value\n[pypi\n")
    with pytest.raises(ConfigError, match="not a valid .pypirc") as info:
        pypirc_section(path, PYPI, PYPI)
    assert "leaked-value" not in str(info.value)


def test_pypirc_that_is_not_utf8_is_a_setting_error(tmp_path):
    path = tmp_path / ".pypirc"
    path.write_bytes(b"[pypi]\npassword = caf\xe9-leaked\n")
    with pytest.raises(ConfigError, match=r"not a valid .pypirc: expected UTF-8 text") as info:
        pypirc_section(path, PYPI, PYPI)
    assert "leaked" not in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("password", ["s3cr/et-xyz", "s3cr?et-xyz", "s3cr#et-xyz", "s3cr@Host9/et-xyz"])
def test_url_password_with_a_reserved_character_is_refused_unshown(password):
    url = f"https://user:{password}@upload.example/"
    with pytest.raises(ConfigError, match="ambiguous.*percent-encode") as info:
        check_url("REPOSITORY_URL", url)
    assert all(part not in str(info.value) for part in ("s3cr", "xyz", "Host9"))
    assert "https://user:****@upload.example/" in str(info.value)
    assert Masker()(f"see {url}") == f"see https://user:{MASK}@upload.example/"


@pytest.mark.parametrize("url", ["https://pkgs.dev.azure.com/org/proj/_packaging/feed@Release/pypi/upload/",
                                 "https://nexus.example.com/repository/pypi/?ref=a@b"])
def test_an_at_in_the_path_of_a_url_without_credentials_is_taken(url):
    check_url("REPOSITORY_URL", url)
    assert Masker()(url) == url


def test_credentials_from_the_url_go_to_twines_environment(tmp_path):
    creds = Credentials.resolve("http://me:p%40ss@127.0.0.1:8080/", {"TWINE_PASSWORD": "envpw"},
                                tmp_path / "none", PYPI)
    assert creds.twine_args == ("--repository-url", "http://127.0.0.1:8080/")
    assert creds.env == {"TWINE_USERNAME": "me", "TWINE_PASSWORD": "p@ss"}
    assert set(creds.secrets) == {"p@ss", "envpw"}
    assert "p@ss" not in creds.source and "p@ss" not in repr(creds)


def test_credentials_from_twine_environment(tmp_path):
    path = write_pypirc(tmp_path, PYPIRC)
    creds = Credentials.resolve(PYPI, {"TWINE_USERNAME": "__token__", "TWINE_PASSWORD": "tok"},
                                path, PYPI)
    assert creds.source == "TWINE_USERNAME / TWINE_PASSWORD"
    assert creds.twine_args == ("--repository-url", PYPI)
    assert creds.env == {"TWINE_USERNAME": "__token__", "TWINE_PASSWORD": "tok"}
    assert creds.secrets == ("tok",)


@pytest.mark.parametrize("url, section, password", [
    (PYPI, "pypi", "pypi-from-file"), ("http://127.0.0.1:8080/", "local", "local-pass")])
def test_credentials_from_pypirc_use_the_section(tmp_path, url, section, password):
    path = write_pypirc(tmp_path, PYPIRC)
    creds = Credentials.resolve(url, {}, path, PYPI)
    assert creds.twine_args == ("--config-file", str(path), "--repository", section)
    assert creds.secrets == (password,) and f"[{section}]" in creds.source
    assert creds.env == {} and creds.username in ("__token__", "me")


def test_no_credentials_uploads_anonymously(tmp_path):
    creds = Credentials.resolve("http://127.0.0.1:9/", {}, tmp_path / "none", PYPI)
    assert creds.source.startswith("none found") and creds.anonymous and creds.secrets == ()
    # Empty, not missing: twine then uploads without asking (missing ones fail non-interactively).
    assert creds.env == {"TWINE_USERNAME": "", "TWINE_PASSWORD": ""}
