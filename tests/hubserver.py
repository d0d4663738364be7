"""A stand-in for the HuggingFace Hub's file API on 127.0.0.1, so that huggingface_hub's own client
code (HfApi.model_info, snapshot_download, hf_hub_download) runs against it through HF_ENDPOINT.

It speaks what that code asks for (read from huggingface_hub's sources, file_download.py,
_snapshot_download.py, hf_api.py, utils/_http.py):

  GET  /api/models/{repo}[/revision/{rev}]        repo info: "sha" (the commit) and "siblings"
  GET  /api/models/{repo}/tree/{rev}[/{path}]     file listing (recursive=...), with oid/size/lfs
  HEAD /{repo}/resolve/{rev}/{path}                X-Repo-Commit, ETag, Content-Length; for LFS
                                                   files a 302 to the storage server with
                                                   X-Linked-Etag (the sha256) and X-Linked-Size
  GET  /{repo}/resolve/{rev}/{path}                the bytes of a regular file
  GET  (storage server) /blobs/{sha256}?sig=...    the bytes of an LFS file, a signed URL needing
                                                   no token; Range requests get 206

Errors carry the hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound), which is what
huggingface_hub turns into its exception types; a private repo answers 401 without a valid
`Authorization: Bearer` token. The storage server is another origin, as the hub's CDN is (a second
port, reached as localhost where the hub is 127.0.0.1; both are bound to 127.0.0.1 only):
huggingface_hub then takes the file's metadata from the redirect and drops the token.

`cut_once(data)` makes the next transfer of that blob stop half-way (headers promise the whole
file, the connection closes early), as a network failure would. Every request is logged.
"""
import hashlib
import hmac
import json
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pth", ".pt", ".onnx", ".msgpack", ".h5")
_SECRET = b"not-a-secret"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Request:
    server: str          # "hub" or "storage"
    method: str
    path: str            # unquoted, without the query
    query: dict
    headers: dict        # lower-case names
    status: int = 0
    sent: int = 0        # body bytes written


class Repo:
    def __init__(self, repo_id, token=None):
        self.repo_id, self.token = repo_id, token
        self.commits = {}    # sha -> {path: bytes}
        self.refs = {}       # branch or tag -> sha

    def commit(self, files: dict, refs=("main",)) -> str:
        h = hashlib.sha1(self.repo_id.encode())
        for path in sorted(files):
            h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
        sha = h.hexdigest()
        self.commits[sha] = dict(files)
        for r in refs:
            self.refs[r] = sha
        return sha

    def resolve(self, rev):
        if rev in self.commits:
            return rev
        return self.refs.get(rev)


class HubServer:
    def __init__(self):
        self.repos = {}
        self.blobs = {}          # sha256 -> bytes
        self.log = []
        self._cut = set()
        self._lock = threading.Lock()
        self._servers = []

    # ------------------------------------------------------------ setup

    def add_repo(self, repo_id, token=None) -> Repo:
        repo = Repo(repo_id, token)
        self.repos[repo_id] = repo
        return repo

    def publish(self, repo: Repo, files: dict, refs=("main",)) -> str:
        for data in files.values():
            self.blobs[hashlib.sha256(data).hexdigest()] = data
        return repo.commit(files, refs)

    def cut_once(self, data: bytes):
        with self._lock:
            self._cut.add(hashlib.sha256(data).hexdigest())

    def start(self):
        hub = _make_server(self, "hub")
        storage = _make_server(self, "storage")
        self._servers = [hub, storage]
        self.url = f"http://127.0.0.1:{hub.server_address[1]}"
        # Another host name for the same loopback address: huggingface_hub versions differ in
        # whether another port alone makes another origin, all of them agree on another name.
        self.storage_url = f"http://localhost:{storage.server_address[1]}"
        for s in self._servers:
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self):
        for s in self._servers:
            s.shutdown()
            s.server_close()

    # ------------------------------------------------------------ what was asked

    def clear_log(self):
        with self._lock:
            self.log.clear()

    def requests(self, server=None, method=None, kind=None):
        """Logged requests; kind: 'api' (/api/...), 'resolve' (/{repo}/resolve/...), 'blob'."""
        out = []
        for r in list(self.log):
            k = "api" if r.path.startswith("/api/") else "blob" if r.server == "storage" else \
                "resolve" if "/resolve/" in r.path else "other"
            if (server is None or r.server == server) and (method is None or r.method == method) and \
                    (kind is None or k == kind):
                out.append(r)
        return out

    def files_requested(self):
        """Repo file paths named by any resolve request (HEAD or GET)."""
        names = set()
        for r in self.requests(kind="resolve"):
            parts = r.path.lstrip("/").split("/", 4)   # owner, name, "resolve", rev, path
            if len(parts) == 5:
                names.add(parts[4])
        return names


def _make_server(hub: HubServer, role: str):
    class Handler(_Handler):
        pass
    Handler.hub, Handler.role = hub, role
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, as the hub: every answer has a Content-Length
    timeout = 10                    # a stuck client cannot hold a thread for long
    hub: HubServer = None
    role = "hub"

    def log_message(self, *args):   # the request log replaces stderr chatter
        pass

    # ------------------------------------------------------------ plumbing

    def _record(self):
        url = urlsplit(self.path)
        req = Request(self.role, self.command, unquote(url.path), parse_qs(url.query),
                      {k.lower(): v for k, v in self.headers.items()})
        with self.hub._lock:
            self.hub.log.append(req)
        return req, url

    def _send(self, req, status, body=b"", headers=None, head=False):
        req.status = status
        self.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
            req.sent = len(body)

    def _json(self, req, obj, status=200, headers=None):
        self._send(req, status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, req, status, code, message, headers=None, head=False):
        h = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        h.update(headers or {})
        self._send(req, status, b"" if head else json.dumps({"error": message}).encode(), h, head=head)

    def do_HEAD(self):
        self._dispatch(head=True)

    def do_GET(self):
        self._dispatch(head=False)

    def _dispatch(self, head):
        req, url = self._record()
        try:
            if self.role == "storage":
                return self._blob(req, url, head)
            segs = [unquote(s) for s in url.path.lstrip("/").split("/")]
            if segs[:2] == ["api", "models"] and len(segs) >= 4:
                return self._api(req, segs[2:], parse_qs(url.query), head)
            if len(segs) >= 5 and segs[2] == "resolve":
                return self._resolve(req, segs, head)
            self._error(req, 404, "NotFound", "no such endpoint", head=head)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _repo(self, req, repo_id, head=False):
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(req, 404, "RepoNotFound", "Repository not found", head=head)
            return None
        if repo.token is not None and req.headers.get("authorization") != f"Bearer {repo.token}":
            # The hub answers 401 for a private repo whether the token is missing or wrong.
            self._error(req, 401, "RepoNotFound", "Invalid username or password.", head=head)
            return None
        return repo

    def _rev(self, req, repo, rev, head=False):
        sha = repo.resolve(rev)
        if sha is None:
            self._error(req, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
        return sha

    # ------------------------------------------------------------ /api/models

    def _entry(self, path, data, full):
        entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
        if path.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        if not full:
            entry = {"rfilename": path}
        return entry

    def _api(self, req, segs, query, head):
        repo = self._repo(req, f"{segs[0]}/{segs[1]}", head)
        if repo is None:
            return
        rest = segs[2:]
        if not rest or rest[0] == "revision":
            sha = self._rev(req, repo, "/".join(rest[1:]) if rest else "main", head)
            if sha is None:
                return
            files = repo.commits[sha]
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for p, d in sorted(files.items()):
                s = {"rfilename": p}
                if blobs:
                    s.update(size=len(d), blobId=git_blob_id(d))
                    if p.endswith(LFS_SUFFIXES):
                        s["lfs"] = {"size": len(d), "sha256": hashlib.sha256(d).hexdigest(), "pointerSize": 134}
                siblings.append(s)
            return self._json(req, {"_id": repo.repo_id, "id": repo.repo_id, "modelId": repo.repo_id, "sha": sha,
                                    "private": repo.token is not None, "gated": False, "disabled": False,
                                    "tags": ["gguf"] if any(p.endswith(".gguf") for p in files) else [],
                                    "lastModified": "2026-01-01T00:00:00.000Z", "siblings": siblings})
        if rest[0] == "tree" and len(rest) >= 2:
            sha = self._rev(req, repo, rest[1], head)
            if sha is None:
                return
            prefix = "/".join(rest[2:])
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            out, dirs = [], set()
            for p, d in sorted(repo.commits[sha].items()):
                if prefix and not p.startswith(prefix + "/"):
                    continue
                rel = p[len(prefix) + 1:] if prefix else p
                if "/" in rel:
                    top = (prefix + "/" if prefix else "") + rel.split("/")[0]
                    if top not in dirs:
                        dirs.add(top)
                        out.append({"type": "directory", "oid": hashlib.sha1(top.encode()).hexdigest(),
                                    "size": 0, "path": top})
                    if not recursive:
                        continue
                out.append(self._entry(p, d, True))
            return self._json(req, out)
        self._error(req, 404, "NotFound", "no such endpoint", head=head)

    # ------------------------------------------------------------ /{repo}/resolve/{rev}/{path}

    def _resolve(self, req, segs, head):
        repo = self._repo(req, f"{segs[0]}/{segs[1]}", head)
        if repo is None:
            return
        sha = self._rev(req, repo, segs[3], head)
        if sha is None:
            return
        path = "/".join(segs[4:])
        data = repo.commits[sha].get(path)
        if data is None:
            return self._error(req, 404, "EntryNotFound", f"{path} does not exist", {"X-Repo-Commit": sha}, head)
        common = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if path.endswith(LFS_SUFFIXES):
            digest = hashlib.sha256(data).hexdigest()
            sig = hmac.new(_SECRET, digest.encode(), "sha256").hexdigest()[:16]
            location = f"{self.hub.storage_url}/blobs/{digest}?sig={sig}&name={quote(path.split('/')[-1])}"
            return self._send(req, 302, b"", {**common, "Location": location, "ETag": f'"{git_blob_id(data)}"',
                                              "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(data))},
                              head=head)
        self._body(req, data, {**common, "ETag": f'"{git_blob_id(data)}"'}, head)

    # ------------------------------------------------------------ storage

    def _blob(self, req, url, head):
        parts = url.path.strip("/").split("/")
        digest = parts[1] if len(parts) == 2 and parts[0] == "blobs" else ""
        sig = parse_qs(url.query).get("sig", [""])[0]
        if digest not in self.hub.blobs or not hmac.compare_digest(
                sig, hmac.new(_SECRET, digest.encode(), "sha256").hexdigest()[:16]):
            return self._error(req, 403, "AccessDenied", "bad signature", head=head)
        self._body(req, self.hub.blobs[digest], {"ETag": f'"{digest}"', "Accept-Ranges": "bytes"}, head,
                   cut_key=digest)

    def _body(self, req, data, headers, head, cut_key=None):
        start, end, status = 0, len(data), 200
        rng = req.headers.get("range")
        if rng:
            spec = rng.replace("bytes=", "", 1).split(",")[0].strip()
            a, _, b = spec.partition("-")
            start = int(a) if a else max(0, len(data) - int(b))
            end = min(len(data), int(b) + 1) if (a and b) else len(data)
            if start >= len(data):
                return self._send(req, 416, b"", {"Content-Range": f"bytes */{len(data)}"}, head=head)
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        body = data[start:end]
        with self.hub._lock:
            cut = cut_key in self.hub._cut and not head
            if cut:
                self.hub._cut.discard(cut_key)
        if not cut:
            return self._send(req, status, body, headers, head=head)
        # Promise the whole body, send half, hang up.
        req.status = status
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        half = len(body) // 2
        self.wfile.write(body[:half])
        self.wfile.flush()
        req.sent = half
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
