"""Every example in README.md and docs/*.md runs, as written, against a real server.

Each ```python block runs in its own interpreter (this one's), and each `curl` and
`agent-memory cache` command of the ```bash blocks through bash, against a server on the tiny
test model. One substitution, and only it, is made first: `http://127.0.0.1:8000` becomes that
server's URL and the model id `demo` (also as `openai/demo`) becomes `tiny`, the id the tiny
server lists (a tiny embedding model beside it is served as `embed`, the docs' name for one).
Nothing is installed here: a block whose imports this interpreter lacks runs in
`.venv-frameworks` (scripts/test puts CrewAI there: it needs `openai<3`, the rest of the test
extra `openai>=3`), or is skipped, naming what to install (the block's `# pip install ...` line).

`python tests/test_examples.py --base-url URL [--model ID]` runs the same blocks against a
running server of your own (the demo model: `--model demo`) and says which passed.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.programs, pytest.mark.process]

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCS_URL = "http://127.0.0.1:8000"
DOCS_MODEL = "demo"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)
PIP_LINE = re.compile(r"^# pip install (.+)$", re.M)
TIMEOUT_S = 240
# Telemetry stays off whatever a block forgets: nothing leaves the machine from a test.
QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "AUTOGEN_DISABLE_RUNTIME_TRACING": "true",
    "LANGSMITH_TRACING": "false",
}


@dataclass(frozen=True)
class Example:
    doc: Path
    line: int
    kind: str  # python, curl, cache
    code: str

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(REPO) if self.doc.is_relative_to(REPO) else self.doc}:{self.line}"


def examples(docs: list[Path] = DOCS) -> list[Example]:
    """The python blocks, and the curl / `agent-memory cache` commands of the bash blocks."""
    found = []
    for doc in docs:
        text = doc.read_text()
        for fence in FENCE.finditer(text):
            lang, body = fence[1], fence[2]
            line = text.count("\n", 0, fence.start()) + 1
            if lang == "python":
                found.append(Example(doc, line, "python", body))
            elif lang in ("bash", "sh", "shell"):
                for command in _commands(body):
                    for kind, start in (("curl", "curl "), ("cache", "agent-memory cache ")):
                        if command.startswith(start):
                            found.append(Example(doc, line, kind, command))
    return found


def _commands(script: str) -> list[str]:
    """One string per command, continuation lines joined, comments dropped."""
    commands, current = [], ""
    for raw in script.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).rstrip() if not raw.lstrip().startswith("#") else ""
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                commands.append(current.strip())
            current = ""
    return commands


def substitute(code: str, base_url: str, model: str) -> str:
    """The documented substitution: the server's URL and model id, nothing else."""
    code = code.replace(DOCS_URL, base_url.rstrip("/"))
    return re.sub(r"""(["'])(openai/)?demo\1""", lambda m: f"{m[1]}{m[2] or ''}{model}{m[1]}", code)


def missing_imports(code: str) -> list[str]:
    """Top-level modules the block imports that this interpreter cannot."""
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return sorted(m for m in modules if importlib.util.find_spec(m) is None)


FRAMEWORKS_PYTHON = REPO / ".venv-frameworks" / "bin" / "python"


@functools.cache
def interpreter(code: str) -> str | None:
    """The Python that can run a block: this one, else the frameworks' venv if it has what the
    block imports; None when neither does."""
    missing = missing_imports(code)
    if not missing:
        return sys.executable
    if FRAMEWORKS_PYTHON.exists():
        probe = f"import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in {missing!r}))"
        if subprocess.run([str(FRAMEWORKS_PYTHON), "-c", probe]).returncode == 0:
            return str(FRAMEWORKS_PYTHON)
    return None


def run(example: Example, base_url: str, model: str, cache_dir: Path | None = None) -> subprocess.CompletedProcess:
    code = substitute(example.code, base_url, model)
    env = {**os.environ, **QUIET_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if cache_dir is not None:
        env["AGENT_MEMORY_CACHE_DIR"] = str(cache_dir)
    if example.kind == "python":
        cmd = [interpreter(example.code) or sys.executable, "-c", code]
    else:
        cmd = ["bash", "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, input="y\n", timeout=TIMEOUT_S, cwd=REPO)


def check(example: Example, done: subprocess.CompletedProcess) -> None:
    output = f"{example.name} ({example.kind}) exited {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, output
    if example.kind == "curl":
        assert done.stdout.strip(), output
        assert '"error"' not in done.stdout, output  # curl -s exits 0 on an HTTP error: the body tells


ALL = examples()
DOC_AGENTS = ("planner", "researcher-1")  # named by the docs' curl and cache commands


def make_agents(base_url: str, cache_dir: Path | None, agents: tuple[str, ...] = DOC_AGENTS) -> None:
    """One short turn of each agent that the server or (given the cache folder) the disk does
    not hold (a command before may have ended it), then wait for its manifest on disk, which
    is written behind the reply."""
    import httpx

    from agent_memory.memory.warm.folder.paths import model_folders

    def on_disk(agent: str) -> bool:
        return cache_dir is None or all(f.agent_path(agent).exists() for f in model_folders(cache_dir / "kv"))

    for agent in agents:
        if httpx.get(f"{base_url}/v1/agents/{agent}", timeout=120).status_code == 200 and on_disk(agent):
            continue
        body = {"messages": [{"role": "user", "content": "Plan the trip."}], "max_tokens": 4, "prompt_cache_key": agent}
        httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120).raise_for_status()
    deadline = time.monotonic() + 30
    while not all(on_disk(a) for a in agents):
        assert time.monotonic() < deadline, "the agents' manifests were not written"
        time.sleep(0.05)


def test_every_doc_has_its_examples_found():
    names = {e.doc.name for e in ALL}
    assert {"README.md", "usage.md"} <= names
    assert sum(e.kind == "python" for e in ALL) >= 10 and sum(e.kind == "curl" for e in ALL) >= 3
    for e in ALL:
        if e.kind == "python":
            ast.parse(e.code)  # a block that does not even parse fails here, named
    assert substitute('m="demo", n="openai/demo", url="http://127.0.0.1:8000/v1"', "http://h:1", "tiny") == (
        'm="tiny", n="openai/tiny", url="http://h:1/v1"'
    )


@pytest.fixture(scope="module")
def docs_server(tiny_model, tiny_embedding, tmp_path_factory):
    """The tiny chat model, and beside it a tiny embedding model as `embed` (docs/usage.md, "Embeddings")."""
    from tests.support.inprocess import InProcessServer
    cache = tmp_path_factory.mktemp("examples-cache")
    with InProcessServer(tiny_model, cache, "--model", f"embed={tiny_embedding}") as s:
        yield s


# Python blocks first (README's makes the agent `planner` that the curl and cache commands show).
@pytest.mark.parametrize("example", sorted(ALL, key=lambda e: e.kind != "python"), ids=lambda e: f"{e.kind}-{e.name}")
def test_example_runs(example: Example, docs_server):
    if example.kind == "python" and interpreter(example.code) is None:
        missing = missing_imports(example.code)
        wanted = PIP_LINE.search(example.code)
        install = f"pip install {wanted[1]}" if wanted else f"install {', '.join(missing)}"
        pytest.skip(f"{example.name} needs {', '.join(missing)} ({install}), not installed here")
    if example.kind != "python":
        make_agents(docs_server.base_url, docs_server.cache_dir)  # the agents the commands name, whatever ran before
    done = run(example, docs_server.base_url, "tiny", docs_server.cache_dir)  # TIMEOUT_S: a hang fails it
    check(example, done)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default=DOCS_MODEL, help="the model id to write for `demo`")
    parser.add_argument("--cache-dir", type=Path, help="the server's --cache-dir, for the cache commands")
    parser.add_argument("-k", default="", help="only examples whose name contains this")
    parser.add_argument("--doc", type=Path, action="append", help="these files instead of README.md and docs/")
    parser.add_argument("--kind", choices=["python", "curl", "cache"], action="append", help="only these kinds")
    args = parser.parse_args()
    failed = 0
    for example in examples([d.resolve() for d in args.doc]) if args.doc else ALL:
        if args.k not in example.name or (example.kind == "cache" and args.cache_dir is None):
            continue
        if args.kind and example.kind not in args.kind:
            continue
        if example.kind == "python" and interpreter(example.code) is None:
            print(f"SKIP {example.name}: needs {', '.join(missing_imports(example.code))}")
            continue
        if example.kind != "python":
            make_agents(args.base_url, args.cache_dir)
        start = time.monotonic()
        try:
            done = run(example, args.base_url, args.model, args.cache_dir)
            check(example, done)
            print(f"ok   {example.name} {example.kind} {time.monotonic() - start:.1f} s")
        except (AssertionError, subprocess.TimeoutExpired) as e:
            failed += 1
            print(f"FAIL {example.name}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
