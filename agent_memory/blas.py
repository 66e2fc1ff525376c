"""Route MLX's CPU matmuls through OpenBLAS.

The Linux `mlx[cpu]` wheel links a slow reference BLAS; loading Debian's OpenBLAS with
RTLD_GLOBAL before `mlx.core` is imported makes float32 matmul much faster (docs/benchmarks.md, "Engine throughput").
Every module that imports MLX imports this one first. AGENT_MEMORY_OPENBLAS=0 keeps MLX's
own BLAS (to compare, or if OpenBLAS misbehaves on some CPU).
"""

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

OPENBLAS_LIBRARY = "libopenblas.so.0"


def _load_openblas() -> bool:
    if not sys.platform.startswith("linux") or os.environ.get("AGENT_MEMORY_OPENBLAS") == "0":
        return False
    if "mlx.core" in sys.modules:
        log.warning("mlx.core was imported before OpenBLAS could be loaded; CPU matmul will be slow")
        return False
    try:
        ctypes.CDLL(OPENBLAS_LIBRARY, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        log.warning(
            "OpenBLAS (%s) not found: MLX will use its slow reference BLAS. "
            "Install it with: apt-get install libopenblas0-pthread",
            OPENBLAS_LIBRARY,
        )
        return False
    return True


OPENBLAS_LOADED = _load_openblas()
