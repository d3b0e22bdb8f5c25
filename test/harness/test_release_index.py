"""Reading what a package index already holds (PEP 503 simple pages), against a local server."""
import base64
import http.server
import threading

import pytest

from harness.release_index import is_pypi, published_files, simple_index_url

PAGE = b"""<!DOCTYPE html><html><body>
<a href="/packages/blocksparse-2.21.0-py3-none-any.whl#sha256=ABCDEF">blocksparse-2.21.0-py3-none-any.whl</a>
<a href="../../packages/blocksparse-2.20.0.tar.gz#md5=0123">blocksparse-2.20.0.tar.gz</a>
<a href="https://files.example.org/x/blocksparse-2.19.0-py3-none-any.whl">old</a>
</body></html>"""


@pytest.mark.parametrize("url, override, expected", [
    ("https://upload.pypi.org/legacy/", None, "https://pypi.org/simple/"),
    ("https://test.pypi.org/legacy/", None, "https://test.pypi.org/simple/"),
    ("http://127.0.0.1:8080/", None, "http://127.0.0.1:8080/simple/"),
    ("http://127.0.0.1:8080", None, "http://127.0.0.1:8080/simple/"),
    ("http://devpi:3141/me/dev/", "http://devpi:3141/me/dev/+simple", "http://devpi:3141/me/dev/+simple/"),
])
def test_simple_index_url(url, override, expected):
    assert simple_index_url(url, override) == expected


def test_is_pypi():
    assert is_pypi("https://upload.pypi.org/legacy/") and is_pypi("https://test.pypi.org/legacy/")
    assert not is_pypi("http://127.0.0.1:8080/") and not is_pypi("https://pypi.example.org/")


@pytest.fixture
def server():
    """A simple index on 127.0.0.1 that knows 'blocksparse' (public) and 'private' (basic auth)."""
    token = "Basic " + base64.b64encode(b"me:pw").decode()
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/simple/blocksparse/" or (
                    self.path == "/simple/private/" and self.headers.get("Authorization") == token):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(PAGE)
            elif self.path == "/simple/private/":
                self.send_response(401)
                self.end_headers()
            elif self.path == "/simple/broken/":
                self.send_response(500)
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}/simple/", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_published_files_reads_names_and_sha256(server):
    index, seen = server
    assert published_files(index, "blocksparse") == {
        "blocksparse-2.21.0-py3-none-any.whl": "abcdef",
        "blocksparse-2.20.0.tar.gz": None,
        "blocksparse-2.19.0-py3-none-any.whl": None,
    }
    assert seen == [("/simple/blocksparse/", None)]  # no credentials sent when none are asked for


def test_unknown_project_is_empty(server):
    assert published_files(server[0], "nothing-here") == {}


def test_credentials_are_sent_only_when_asked(server):
    index, seen = server
    assert len(published_files(index, "private", username="me", password="pw")) == 3
    assert [auth for _, auth in seen] == [None, "Basic " + base64.b64encode(b"me:pw").decode()]
    with pytest.raises(OSError, match="401"):
        published_files(index, "private")
    with pytest.raises(OSError, match="401"):
        published_files(index, "private", username="me", password="wrong")


def test_unreadable_index_raises(server):
    with pytest.raises(OSError, match="500"):
        published_files(server[0], "broken")
    with pytest.raises(OSError):
        published_files("http://127.0.0.1:9/simple/", "blocksparse", timeout=5)
