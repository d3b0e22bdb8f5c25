"""Credentials of the upload: where they come from, and masking them out of everything printed.

The release never puts a password on a command line or in a file it writes; it still passes every
line it prints (its own and the tools' it runs) through a :class:`Masker`, so a secret that turns
up in a URL or in a tool's message is replaced by ``****``.
"""
import configparser
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from .errors import ConfigError

__all__ = ["MASK", "Masker", "Credentials", "split_userinfo", "check_url", "pypirc_section"]

MASK = "****"
# The password runs to the *last* "@" of the URL: one with a raw "@", "/", "?" or "#" is masked
# whole (masking too much is harmless; showing part of a password is not).
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@\s:]*):\S*@")


class Masker:
    """Replace each secret (and any ``scheme://user:password@`` password) in text by ``****``."""

    def __init__(self, secrets=()):
        forms = set()
        for secret in secrets:
            if secret:
                forms.update({secret, unquote(secret)})
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted((s for s in forms if s), key=len, reverse=True)

    def adding(self, secrets):
        """A masker for these secrets and the new ones."""
        return Masker([*self._secrets, *secrets])

    def __call__(self, text):
        text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", str(text))
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text


def check_url(name, url):
    """Raise `ConfigError` (never quoting a password) unless ``url`` is an http(s) URL with a
    host, a numeric port if any, and no raw ``@``, ``/``, ``?`` or ``#`` inside its
    ``user:password`` (nor an ``@`` after the host where a ``user:password`` or a port could hide one)."""
    shown = Masker()(url)
    if not url.startswith(("https://", "http://")):
        raise ConfigError(f"{name} must be an http(s) URL; got {shown!r}")
    parts = urlsplit(url)
    if parts.netloc.count("@") > 1:
        raise ConfigError(f"{name}: the user:password part holds a raw '@'; write it as %40 "
                          f"(percent-encoded) in the URL, or pass the password in "
                          f"TWINE_PASSWORD; got {shown!r}")
    after_host = url[url.index("//") + 2 + len(parts.netloc):]
    if "@" in after_host and (":" in parts.netloc or "@" in parts.netloc):
        # Either the password holds a raw "/", "?" or "#" (urlsplit ended the host there: what it
        # calls the port or the host is part of the password), or the path holds an "@": the two
        # cannot be told apart, and none of a password may be quoted.  (An "@" in the path of a
        # URL with neither user:password nor port, an Azure feed's "feed@view", is no password's.)
        raise ConfigError(f"{name} is ambiguous: an '@' follows the host, and a user:password or a "
                          f"port comes before it; percent-encode a '/', '?', '#' or '@' of the "
                          f"password (%2F, %3F, %23, %40) and an '@' of the path (%40), or pass "
                          f"the password in TWINE_PASSWORD; got {shown!r}")
    try:
        parts.port
    except ValueError:
        port = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        raise ConfigError(f"{name}: the port must be a number from 1 to 65535; got {port!r} "
                          f"in {shown!r}") from None
    if not parts.hostname:
        raise ConfigError(f"{name} names no host; got {shown!r}")


def split_userinfo(url):
    """``(url without user:password@, username or None, password or None)`` (percent-decoded)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    bare = urlunsplit(parts._replace(netloc=netloc))
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return bare, user, password


def _same_url(a, b):
    return a.rstrip("/") == b.rstrip("/")


def pypirc_section(path, url, default_url):
    """The ``.pypirc`` section whose repository is ``url``: ``(name, username, password)`` or None.

    twine reads credentials from ``.pypirc`` only when it is given a section name (not a URL), so
    the release looks the URL up here.  A section without ``repository`` means ``default_url``
    for ``pypi`` (twine's rule).
    """
    path = Path(path)
    if not path.is_file():
        return None
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error:
        # configparser's message may quote the file's lines, passwords included.
        raise ConfigError(f"{path} is not a valid .pypirc (ini) file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not a valid .pypirc: expected UTF-8 text, found byte "
                          f"0x{exc.object[exc.start]:02x} at offset {exc.start}") from None
    for name in parser.sections():
        if name == "distutils":
            continue
        repo = parser.get(name, "repository", fallback=default_url if name == "pypi" else None)
        if repo and _same_url(repo, url):
            return (name, parser.get(name, "username", fallback=None),
                    parser.get(name, "password", fallback=None))
    return None


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """How twine will authenticate; ``source`` says where from (never the secret itself)."""

    source: str
    twine_args: tuple = ()
    username: str = field(default=None, repr=False)
    password: str = field(default=None, repr=False)
    #: True when twine gets them through its environment (not from a .pypirc).
    via_env: bool = False
    extra_secrets: tuple = field(default=(), repr=False)
    anonymous: bool = False

    @property
    def env(self):
        """Variables added to twine's environment."""
        if not self.via_env:
            return {}
        return {"TWINE_USERNAME": self.username or "", "TWINE_PASSWORD": self.password or ""}

    @property
    def secrets(self):
        """Every value to mask."""
        return tuple(s for s in (self.password, *self.extra_secrets) if s)

    @classmethod
    def resolve(cls, repository_url, environ, pypirc, default_url):
        """Pick the credentials twine will use for ``repository_url``.

        Order: a ``user:password@`` in the URL, then ``TWINE_USERNAME`` / ``TWINE_PASSWORD``,
        then the ``.pypirc`` section whose repository is the URL.
        """
        bare, user, password = split_userinfo(repository_url)
        env_user, env_password = environ.get("TWINE_USERNAME"), environ.get("TWINE_PASSWORD")
        if user is not None or password is not None:
            return cls(source="the user:password in REPOSITORY_URL",
                       twine_args=("--repository-url", bare), username=user, password=password,
                       via_env=True, extra_secrets=(env_password,))
        if env_user or env_password:
            return cls(source="TWINE_USERNAME / TWINE_PASSWORD",
                       twine_args=("--repository-url", bare), username=env_user,
                       password=env_password, via_env=True)
        section = pypirc_section(pypirc, bare, default_url)
        if section is not None:
            name, user, password = section
            return cls(source=f"{pypirc} [{name}]",
                       twine_args=("--config-file", str(pypirc), "--repository", name),
                       username=user, password=password)
        # Empty values (not missing ones) let twine upload to an index that asks for none.
        return cls(source="none found: uploading anonymously (set TWINE_USERNAME / "
                          "TWINE_PASSWORD or a .pypirc section for this URL if the index asks)",
                   twine_args=("--repository-url", bare), username="", password="",
                   via_env=True, anonymous=True)
