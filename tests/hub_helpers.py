"""A local Hugging Face hub for download tests: the subset of the hub API huggingface_hub uses to
download a model (read from huggingface_hub's hf_api.model_info, file_download.get_hf_file_metadata
and http_get), served by FastAPI/uvicorn on a free loopback port, pointed to with HF_ENDPOINT.

  GET  /api/models/{org}/{name}/revision/{rev}?blobs=true   model info: sha (the commit) and
       siblings with size, blobId and, for LFS files (*.safetensors), lfs {sha256, size, pointerSize};
       an unknown revision answers 404 with X-Error-Code: RevisionNotFound, as the hub does.
  HEAD/GET /{org}/{name}/resolve/{rev}/{path}   ETag (the LFS sha256, else the git blob id),
       X-Repo-Commit, X-Linked-Size/X-Linked-Etag for LFS files, Accept-Ranges; GET honours
       `Range: bytes=N-` with 206 and Content-Range.

Faults a test can set: `drop_after[path] = n` (the first GET of `path` sends n bytes and drops the
connection), `corrupt.add(path)` (every GET serves one byte changed; the published hash stays),
`fail_with[path] = status` (every GET of `path` answers that HTTP status),
`pause_after[path] = n` (the first GET sends n bytes, sets `paused`, and waits for `release`),
`before_get` (called with the path before a GET is answered). `log` records every request.

Misbehaving hubs (each held at most `hold_for` seconds, so a client without bounds ends in a wrong
result instead of hanging the test): `silent_listing` (the listing is never answered),
`drip_listing` (the listing's body comes one byte per `drip_interval`), `silent` (a GET of the
path is never answered), `drip` (a GET sends its headers, then one byte per `drip_interval`),
`endless` (a GET sends a chunked body, no Content-Length, that repeats the file and never ends;
ENDLESS_SAFETY bytes at most), `listed_size[path]` (the size the listing gives, the bytes served stay).
`sent[path]` counts the body bytes a GET of the path handed to the server.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest
from fastapi import FastAPI, Request, Response      # at module level: FastAPI resolves the annotations here
from fastapi.responses import JSONResponse, StreamingResponse

REPO = "MiniMaxAI/MiniMax-H3"
COMMIT = hashlib.sha1(b"h3bridge test hub").hexdigest()
READY_TIMEOUT = 60.0     # a safety net on a loaded machine, not an expected time
HOLD_TIMEOUT = 900.0     # pause_after's hold: ends when the test or the hub's exit releases it
# an endless body stops here: a client without a bound ends (wrongly) instead of filling a disk
ENDLESS_SAFETY = 64 << 20


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class ServedFile:
    path: str
    data: bytes

    @property
    def lfs(self) -> bool:
        return self.path.endswith(".safetensors")

    @property
    def etag(self) -> str:
        return hashlib.sha256(self.data).hexdigest() if self.lfs else git_blob_id(self.data)


@dataclass
class TestHub:
    __test__ = False     # not a test class (pytest collects names starting with Test)

    files: dict[str, ServedFile]
    repo: str = REPO
    commit: str = COMMIT
    drop_after: dict[str, int] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    fail_with: dict[str, int] = field(default_factory=dict)     # path -> HTTP status of every GET
    pause_after: dict[str, int] = field(default_factory=dict)
    paused: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    before_get: Callable[[str], None] | None = None
    log: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""
    silent_listing: bool = False
    drip_listing: bool = False
    silent: set[str] = field(default_factory=set)
    drip: set[str] = field(default_factory=set)
    endless: set[str] = field(default_factory=set)
    listed_size: dict[str, int] = field(default_factory=dict)
    drip_interval: float = 0.2
    hold_for: float = HOLD_TIMEOUT
    sent: dict[str, int] = field(default_factory=dict)

    def dripped(self, body: bytes, path: str) -> Iterator[bytes]:
        """`body` one byte per drip_interval, until hold_for has passed (then the rest at once)."""
        import time
        until = time.monotonic() + self.hold_for
        for index in range(len(body)):
            if time.monotonic() >= until or self.release.is_set():
                self.sent[path] = self.sent.get(path, 0) + len(body) - index
                yield body[index:]
                return
            self.sent[path] = self.sent.get(path, 0) + 1
            yield body[index:index + 1]
            self.release.wait(self.drip_interval)

    def gets(self, path: str) -> list[str | None]:
        """The Range header of every GET of `path` (None: the whole file)."""
        return [r for method, p, r in self.log if method == "GET" and p == path]

    def app(self) -> FastAPI:
        app = FastAPI()
        hub = self

        def unknown_revision(revision: str) -> Response:
            return JSONResponse({"error": f"Invalid rev id: {revision}"}, status_code=404,
                                headers={"X-Error-Code": "RevisionNotFound"})

        @app.get("/api/models/{org}/{name}/revision/{revision}")
        def model_info(org: str, name: str, revision: str) -> Response:
            if f"{org}/{name}" != hub.repo:
                return JSONResponse({"error": "Repository not found"}, status_code=404,
                                    headers={"X-Error-Code": "RepoNotFound"})
            if revision not in ("main", hub.commit):
                return unknown_revision(revision)
            if hub.silent_listing:
                hub.release.wait(hub.hold_for)
            siblings = []
            for item in hub.files.values():
                size = hub.listed_size.get(item.path, len(item.data))
                entry: dict[str, object] = {"rfilename": item.path, "size": size,
                                            "blobId": git_blob_id(item.data)}
                if item.lfs:
                    entry["lfs"] = {"sha256": item.etag, "size": size, "pointerSize": 134}
                siblings.append(entry)
            answer = {"_id": "0" * 24, "id": hub.repo, "modelId": hub.repo, "sha": hub.commit,
                                 "private": False, "gated": False, "disabled": False, "tags": [],
                                 "siblings": siblings}
            if hub.drip_listing:
                import json
                return StreamingResponse(hub.dripped(json.dumps(answer).encode(), "(listing)"),
                                         media_type="application/json")
            return JSONResponse(answer)

        @app.api_route("/{org}/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
        def resolve(org: str, name: str, revision: str, path: str, request: Request) -> Response:
            hub.log.append((request.method, path, request.headers.get("range")))
            if revision not in ("main", hub.commit):
                return unknown_revision(revision)
            item = hub.files.get(path)
            if item is None or f"{org}/{name}" != hub.repo:
                return JSONResponse({"error": "Entry not found"}, status_code=404,
                                    headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": hub.commit})
            headers = {"ETag": f'"{item.etag}"', "X-Repo-Commit": hub.commit, "Accept-Ranges": "bytes"}
            if item.lfs:
                headers.update({"X-Linked-Size": str(len(item.data)), "X-Linked-Etag": f'"{item.etag}"'})
            if request.method == "HEAD":
                headers["Content-Length"] = str(len(item.data))
                return Response(status_code=200, headers=headers)
            if hub.before_get is not None:
                hub.before_get(path)
            if path in hub.fail_with:
                return JSONResponse({"error": "test hub: failing on purpose"}, status_code=hub.fail_with[path])
            if path in hub.silent:
                hub.release.wait(hub.hold_for)      # never answers (until hold_for, or the hub stops)
            if path in hub.endless:
                def endless() -> Iterator[bytes]:
                    sent = 0
                    while sent < ENDLESS_SAFETY and not hub.release.is_set():
                        piece = item.data or b"\0"
                        sent += len(piece)
                        hub.sent[path] = sent
                        yield piece
                # no Content-Length: a chunked body whose end never comes
                return StreamingResponse(endless(), status_code=200, headers={k: v for k, v in headers.items()})
            data = item.data
            if path in hub.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            start, status = 0, 200
            wanted = request.headers.get("range")
            if wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
                start, status = int(wanted[len("bytes="):-1]), 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            headers["Content-Length"] = str(len(body))
            drop = hub.drop_after.pop(path, None)
            pause = hub.pause_after.pop(path, None)

            def stream() -> Iterator[bytes]:
                if path in hub.drip:
                    yield from hub.dripped(body, path)
                    return
                if drop is not None:
                    yield body[:drop]
                    raise ConnectionAbortedError("test hub: connection dropped on purpose")
                if pause is not None:
                    yield body[:pause]
                    hub.paused.set()
                    # held until the test releases it (or the hub stops, which releases it): a
                    # hold that ended by itself let a client on a busy machine finish the file
                    # before the test had looked (HOLD_TIMEOUT only bounds a forgotten hold)
                    hub.release.wait(HOLD_TIMEOUT)
                    yield body[pause:]
                    return
                yield body

            return StreamingResponse(stream(), status_code=status, headers=headers)

        return app


def serve_folder(root: Path) -> dict[str, ServedFile]:
    return {str(p.relative_to(root)): ServedFile(str(p.relative_to(root)), p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def fixture_repo(folder: Path) -> dict[str, ServedFile]:
    """The fixture model (h3-sim-model) as the hub would publish it. The fixture's two partitions
    are byte-identical; in the release Ref2VA has its own transformer, so here too: every
    Ref2VA transformer shard gets one data byte changed (its header stays valid)."""
    import subprocess
    import sys
    program = Path(sys.executable).with_name("h3-sim-model")
    subprocess.run([str(program) if program.exists() else "h3-sim-model", str(folder)], check=True,
                   capture_output=True, timeout=120)
    files = serve_folder(folder)
    for path, item in files.items():
        if path.startswith("Ref2VA/transformer/") and item.lfs:
            item.data = item.data[:-1] + bytes([item.data[-1] ^ 0x01])
    return files


class RunningHub:
    """A TestHub served by uvicorn in a thread of the test process."""

    def __init__(self, hub: TestHub) -> None:
        import uvicorn
        self.hub = hub
        # the listening socket is bound here and handed to uvicorn: no other process can take the
        # port between choosing it and serving on it
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        port = self.socket.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(hub.app(), host="127.0.0.1", port=port, log_level="critical",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        hub.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> TestHub:
        self.thread.start()
        deadline = threading.Event()
        for _ in range(int(READY_TIMEOUT / 0.05)):
            if self.server.started:
                return self.hub
            if not self.thread.is_alive():
                break
            deadline.wait(0.05)
        raise RuntimeError("the test hub did not start")

    def __exit__(self, *exc: object) -> None:
        self.hub.release.set()
        self.server.should_exit = True
        self.thread.join(READY_TIMEOUT)
        self.socket.close()


def hub_env(tmp_path: Path, hub: TestHub) -> dict[str, str]:
    """The environment of a download against the test hub: HF_ENDPOINT at it, HOME, HF_HOME and
    h3bridge's cache in tmp, online, no token."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
    env.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0",
                "HF_HUB_DISABLE_TELEMETRY": "1", "HOME": str(tmp_path / "home"),
                "H3BRIDGE_CACHE_DIR": str(tmp_path / "h3bridge-cache")})
    return env


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ServedFile]:
    return fixture_repo(tmp_path_factory.mktemp("hub-repo") / "MiniMax-H3")


@pytest.fixture
def hub(fixture_files: dict[str, ServedFile], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestHub]:
    """A test hub of its own per test (its faults and log are the test's), and this process's
    huggingface_hub pointed at it."""
    from huggingface_hub import constants
    served = {path: ServedFile(item.path, item.data) for path, item in fixture_files.items()}
    with RunningHub(TestHub(files=served)) as running:
        for key, value in hub_env(tmp_path, running).items():
            if key.startswith(("HF_", "HOME", "H3BRIDGE_")):
                monkeypatch.setenv(key, value)
        # what huggingface_hub.constants computes from HF_ENDPOINT when it is imported
        monkeypatch.setattr(constants, "ENDPOINT", running.url)
        template = running.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        from huggingface_hub import file_download         # huggingface_hub < 1 keeps its own copy here
        monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template, raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        yield running
    shutil.rmtree(tmp_path / "hf-home", ignore_errors=True)
