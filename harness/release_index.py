"""What the package index already holds, so that re-running a release uploads only what is missing.

twine's ``--skip-existing`` works only for PyPI and TestPyPI; for any other index (pypiserver,
devpi, Artifactory, a rehearsal) the release reads the index's simple page (PEP 503) first and
leaves out the files already there.  On PyPI both apply.
"""
import base64
import html.parser
import urllib.error
import urllib.request
from urllib.parse import unquote, urljoin, urlsplit

__all__ = ["PYPI_UPLOAD_HOSTS", "is_pypi", "simple_index_url", "published_files"]

#: Upload hosts of the indexes twine's ``--skip-existing`` supports, and their simple indexes.
PYPI_UPLOAD_HOSTS = {"upload.pypi.org": "https://pypi.org/simple/",
                     "test.pypi.org": "https://test.pypi.org/simple/"}


def is_pypi(repository_url):
    """True for PyPI's and TestPyPI's upload URLs (where twine's ``--skip-existing`` works)."""
    return urlsplit(repository_url).hostname in PYPI_UPLOAD_HOSTS


def simple_index_url(repository_url, override=None):
    """The simple index that shows what ``repository_url`` holds.

    ``override`` (``INDEX_URL``) wins; PyPI's upload URLs map to their simple index; any other
    upload URL is assumed to serve ``<url>/simple/`` (pypiserver, Artifactory do).
    """
    if override:
        return override.rstrip("/") + "/"
    host = urlsplit(repository_url).hostname
    if host in PYPI_UPLOAD_HOSTS:
        return PYPI_UPLOAD_HOSTS[host]
    return repository_url.rstrip("/") + "/simple/"


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def published_files(index_url, project, *, username=None, password=None, timeout=15):
    """``{file name: sha256 or None}`` of ``project`` on the simple index at ``index_url``.

    A project the index does not know gives ``{}``.  When the index asks for credentials they
    are sent (basic auth) if given.

    Raises
    ------
    OSError
        The index cannot be read (connection refused, a status other than 200 / 404, ...).
    """
    page = urljoin(index_url, f"{project}/")
    request = urllib.request.Request(page, headers={"Accept": "text/html"})
    try:
        body = _read(request, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        if exc.code not in (401, 403) or username is None:
            raise
        token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            body = _read(request, timeout)
        except urllib.error.HTTPError as again:
            if again.code == 404:
                return {}
            raise
    links = _Links()
    links.feed(body)
    files = {}
    for href in links.hrefs:
        path, _, fragment = href.partition("#")
        name = unquote(path.rstrip("/").rsplit("/", 1)[-1])
        algo, _, digest = fragment.partition("=")
        files[name] = digest.lower() if algo == "sha256" and digest else None
    return files


def _read(request, timeout):
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode("utf-8", errors="replace")
