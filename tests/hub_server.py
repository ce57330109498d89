"""A stand-in for the Hugging Face Hub, for tests: the HTTP endpoints that huggingface_hub calls
to describe a model repo and download its files, over a threaded ``http.server``, with faults
to inject and a log of the requests.

- ``GET /api/models/{repo}[/revision/{rev}]``: the repo's commit and files (``siblings``, with
  size and LFS sha256, as the Hub gives them for ``?blobs=true``).
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: a file, with the headers huggingface_hub reads
  (``X-Repo-Commit``, ``ETag`` and ``X-Linked-Etag``: the LFS sha256, ``X-Linked-Size``,
  ``Content-Length``), and ``Range: bytes=N-`` answered by 206 Partial Content.
- Errors as the Hub gives them: an unknown repo is 401 (404 with a token) with
  ``X-Error-Code: RepoNotFound``; a gated repo's files are 401 ``GatedRepo`` without the token;
  an unknown file is 404 ``EntryNotFound``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

TOKEN = "hf_test_token"
"""The only token the stand-in accepts for a gated repo."""


@dataclass
class Repo:
    """A model repo: its files (path in the repo: bytes), and whether it is gated."""

    files: dict[str, bytes]
    gated: bool = False

    @property
    def commit(self) -> str:
        """A commit hash that changes with the files."""
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + self.files[path])
        return digest.hexdigest()


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class FakeHub:
    """The repos served, the faults to inject, and the requests received."""

    repos: dict[str, Repo]
    url: str = ""
    drop_after: dict[str, int] = field(default_factory=dict)
    """``repo/path`` of a file: bytes sent before the connection of its next GET is closed."""
    corrupt: set[str] = field(default_factory=set)
    """``repo/path`` of files served with a byte changed (with the right size and hash)."""
    requests: list[Request] = field(default_factory=list)

    def reset(self) -> None:
        """No faults, and an empty log."""
        self.drop_after.clear()
        self.corrupt.clear()
        self.requests.clear()

    def gets(self, repo: str, path: str) -> list[Request]:
        """The GET requests received for a file."""
        suffix = f"/{repo}/resolve/"
        return [
            r
            for r in self.requests
            if r.method == "GET" and r.path.startswith(suffix) and r.path.endswith(f"/{path}")
        ]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def serving(hub: FakeHub) -> Iterator[FakeHub]:
    """Serve ``hub`` on a free port of 127.0.0.1 (its ``url``) until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            authorization = self.headers.get("Authorization")
            hub.requests.append(
                Request(self.command, path, self.headers.get("Range"), authorization)
            )
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._repo_info("/".join(parts[2:4]), authorization)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._file("/".join(parts[:2]), "/".join(parts[4:]), authorization, body)
            else:
                self._error(404, "NotFound", "no such endpoint")

        def _repo_info(self, name: str, authorization: str | None) -> None:
            repo = hub.repos.get(name)
            if repo is None:
                self._repo_not_found(authorization)
                return
            siblings = []
            for path, data in sorted(repo.files.items()):
                sibling: dict[str, object] = {"rfilename": path, "size": len(data)}
                if path.endswith(".gguf"):  # stored with LFS, as the Hub stores GGUFs
                    lfs = {"size": len(data), "sha256": sha256(data), "pointerSize": 134}
                    sibling["lfs"] = lfs
                siblings.append(sibling)
            info = {
                "id": name,
                "sha": repo.commit,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "siblings": siblings,
            }
            self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode())

        def _file(self, name: str, path: str, authorization: str | None, body: bool) -> None:
            repo = hub.repos.get(name)
            if repo is None:
                self._repo_not_found(authorization)
                return
            if repo.gated and authorization != f"Bearer {TOKEN}":
                message = f"Access to model {name} is restricted. Please log in."
                self._error(401, "GatedRepo", message)
                return
            data = repo.files.get(path)
            if data is None:
                self._error(404, "EntryNotFound", f"{path} does not exist", repo.commit)
                return
            etag = f'"{sha256(data)}"'
            headers = {
                "X-Repo-Commit": repo.commit,
                "ETag": etag,
                "X-Linked-Etag": etag,
                "X-Linked-Size": str(len(data)),
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            key = f"{name}/{path}"
            if key in hub.corrupt:
                middle = len(data) // 2
                data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
            start = 0
            status = 200
            requested = self.headers.get("Range")
            if requested is not None and body:
                start = int(requested.removeprefix("bytes=").split("-")[0])
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            headers["Content-Length"] = str(len(data) - start)
            if not body:
                self._send(status, headers, b"")
                return
            cut = hub.drop_after.pop(key, None)
            if cut is None:
                self._send(status, headers, data[start:])
                return
            # Promise the whole file, send part of it, then hang up.
            self._send(status, headers, data[start : start + cut])
            self.close_connection = True

        def _repo_not_found(self, authorization: str | None) -> None:
            # The Hub answers 401 to anonymous requests for a repo it does not show.
            status = 404 if authorization else 401
            self._error(status, "RepoNotFound", "Repository not found")

        def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message}
            if commit is not None:
                headers["X-Repo-Commit"] = commit
            headers["Content-Type"] = "application/json"
            self._send(status, headers, json.dumps({"error": message}).encode())

        def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            """Answer with ``payload``: all of the body, unless ``headers`` give another
            ``Content-Length``."""
            self.send_response(status)
            headers.setdefault("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            self.wfile.flush()

    return Handler
