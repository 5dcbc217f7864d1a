"""A stand-in for the Hugging Face hub on 127.0.0.1, enough for huggingface_hub's file listing
(``/api/models/<repo>/tree/<rev>``) and downloads (``HEAD`` / ``GET /<repo>/resolve/<rev>/<file>``),
so the download path runs for real with no network. Every request is recorded (``requests``), so a
test can also show that nothing was asked."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        self.requests.append(f"{handler.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
            return self._tree(handler, "/".join(parts[2:4]), body)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(handler, "/".join(parts[:2]), "/".join(parts[4:]), body)
        self._send(handler, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, body)

    def _tree(self, handler, repo: str, body: bool) -> None:
        files = self.repos.get(repo)
        if files is None:
            return self._send(handler, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"},
                              body)
        listing = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                   for name, data in sorted(files.items())]
        self._send(handler, 200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body)

    def _file(self, handler, repo: str, name: str, body: bool) -> None:
        data = self.repos.get(repo, {}).get(name)
        if data is None:
            return self._send(handler, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, body)
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Content-Type": "application/octet-stream"}
        self._send(handler, 200, data, headers, body)

    @staticmethod
    def _send(handler, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)
