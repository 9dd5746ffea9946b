"""A tiny stand-in for the Hugging Face Hub's HTTP API, served on 127.0.0.1.

No real network exists where the tests run, so ``huggingface_hub`` is pointed
at this server (``HfApi(endpoint=...)`` in-process, ``HF_ENDPOINT`` for the
CLI) and the test asserts on the recorded requests.  Only the endpoints the
publisher's calls reach are implemented, with the response shapes
``huggingface_hub`` 2.x parses:

- ``POST /api/repos/create``                         create_repo
- ``GET  /api/<type>s/<repo>/refs``                  list_repo_refs
- ``POST /api/<type>s/<repo>/branch/<branch>``       create_branch
- ``GET  /api/<type>s/<repo>/tree/<rev>``            list_repo_files
- ``POST /api/validate-yaml``                        create_commit's README.md check
- ``POST /api/<type>s/<repo>/preupload/<rev>``       upload modes (always "regular")
- ``POST /api/<type>s/<repo>/commit/<rev>``          the NDJSON commit

Files are held in memory per branch; a commit with ``create_pr=1`` is stored
as a pull request and leaves the branch unchanged, as on the Hub.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

GOOD_TOKEN = "hf_fake_write_token"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any  # parsed JSON, a list of NDJSON records, or None
    authorization: str | None


@dataclass
class Repo:
    repo_type: str
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {".gitattributes": b"*.so filter=lfs\n"}})
    pull_requests: list[dict[str, Any]] = field(default_factory=list)


class FakeHub:
    """Start with ``with FakeHub() as hub:``; ``hub.endpoint`` is the base URL."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def calls(self) -> list[str]:
        """The recorded requests as 'METHOD /path' (query dropped) in order."""
        return [f"{r.method} {r.path}" for r in self.requests]

    # -- request handling ---------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                hub._dispatch(self, "GET")

            def do_POST(self) -> None:
                hub._dispatch(self, "POST")

        return Handler

    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(handler.path)
        path = unquote(url.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        content_type = handler.headers.get("Content-Type", "")
        body: Any = None
        if raw and "ndjson" in content_type:
            body = [json.loads(line) for line in raw.splitlines() if line.strip()]
        elif raw:
            body = json.loads(raw)
        request = Request(method, path, parse_qs(url.query), body, handler.headers.get("Authorization"))
        with self._lock:
            self.requests.append(request)
            status, payload, headers = self._route(request)
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        if request.authorization != f"Bearer {GOOD_TOKEN}":
            return 401, {"error": "Invalid credentials in Authorization header"}, {"X-Error-Message": "Invalid credentials"}
        parts = request.path.strip("/").split("/")
        if request.path == "/api/repos/create" and request.method == "POST":
            return self._create_repo(request.body)
        if request.path == "/api/validate-yaml":
            return 200, {"errors": [], "warnings": []}, {}
        # /api/<type>s/<org>/<name>/<action>/<rest...>
        if len(parts) >= 5 and parts[0] == "api":
            repo_id = f"{parts[2]}/{parts[3]}"
            repo = self.repos.get(repo_id)
            if repo is None or f"{repo.repo_type}s" != parts[1]:
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            action, rest = parts[4], "/".join(parts[5:])
            if action == "refs":
                return 200, self._refs(repo), {}
            if action == "branch" and request.method == "POST":
                if rest in repo.branches:
                    return 409, {"error": "Reference already exists"}, {}
                start = (request.body or {}).get("startingPoint", "main")
                repo.branches[rest] = dict(repo.branches[start])
                return 200, {}, {}
            if action == "tree":
                revision = rest.split("/")[0]
                files = repo.branches.get(revision)
                if files is None:
                    return 404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}
                return 200, [
                    {"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for p, b in sorted(files.items())
                ], {}
            if action == "preupload":
                files = request.body["files"]
                return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}, {}
            if action == "commit":
                return self._commit(repo_id, repo, rest, request)
        return 404, {"error": f"fake hub: no route for {request.method} {request.path}"}, {}

    def _create_repo(self, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        repo_id = f"{body['organization']}/{body['name']}"
        repo_type = body.get("type", "model")
        url = f"{self.endpoint}/{'kernels/' if repo_type == 'kernel' else ''}{repo_id}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this repo", "url": url}, {}
        self.repos[repo_id] = Repo(repo_type=repo_type, private=body.get("visibility") == "private")
        return 200, {"url": url}, {}

    @staticmethod
    def _refs(repo: Repo) -> dict[str, Any]:
        def commit_of(files: dict[str, bytes]) -> str:
            return hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()

        return {
            "branches": [
                {"name": name, "ref": f"refs/heads/{name}", "targetCommit": commit_of(files)}
                for name, files in sorted(repo.branches.items())
            ],
            "converts": [],
            "tags": [],
        }

    def _commit(self, repo_id: str, repo: Repo, revision: str, request: Request) -> tuple[int, Any, dict[str, str]]:
        if revision not in repo.branches:
            return 404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}
        files = dict(repo.branches[revision])
        for record in request.body:
            if record["key"] == "file":
                files[record["value"]["path"]] = base64.b64decode(record["value"]["content"])
            elif record["key"] == "deletedFile":
                files.pop(record["value"]["path"], None)
        oid = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
        base = f"{self.endpoint}/kernels/{repo_id}"
        if request.query.get("create_pr") == ["1"]:
            number = len(repo.pull_requests) + 1
            repo.pull_requests.append({"num": number, "target": revision, "files": files})
            return 200, {"commitUrl": f"{base}/commit/{oid}", "commitOid": oid, "pullRequestUrl": f"{base}/discussions/{number}"}, {}
        repo.branches[revision] = files
        return 200, {"commitUrl": f"{base}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}, {}
