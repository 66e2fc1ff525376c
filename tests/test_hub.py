"""Models by hub id, with no network: a Hugging Face cache layout and an LM Studio folder built
on disk (the tiny model copied in), found by `serve --model OWNER/NAME` and `models ls`; a vision
model by hub id answering an image; a hub id that is not on the machine is refused at start with
what to do. Only the refusal starts a process (what it tests is the process's start); the rest
serve in this process and run `models ls` in it, pointed at the machine built here."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent_memory.cli import app
from agent_memory.models.tiny_vision import build_tiny_vision
from tests.support.chat import chat
from tests.support.images import data_url, encoded, picture
from tests.support.inprocess import InProcessServer

pytestmark = pytest.mark.process
REVISION = "0123456789abcdef0123456789abcdef01234567"


def point_at(monkeypatch, hub: Path, home: Path) -> dict[str, str]:
    """This process's environment as a machine with this hub cache and home (the server reads
    them when it looks for a model: models/hub.py); the variables, for a process to start with."""
    env = {"HF_HUB_CACHE": str(hub), "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def machine(tmp_path, tiny_model, monkeypatch) -> dict[str, str]:
    """A home with an LM Studio model and a hub cache with one snapshot, this process pointed
    at them; their env vars."""
    hub = tmp_path / "hub" / "models--acme--tiny-chat"
    shutil.copytree(tiny_model, hub / "snapshots" / REVISION)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text(REVISION)
    shutil.copytree(tiny_model, tmp_path / "home" / ".lmstudio" / "models" / "lms" / "tiny-lms")
    return point_at(monkeypatch, tmp_path / "hub", tmp_path / "home")


def test_models_ls_lists_what_is_on_the_machine(machine, tmp_path):
    listed = CliRunner().invoke(app, ["models", "ls", "--cache-dir", str(tmp_path / "cache")])
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert rows["acme/tiny-chat"][1:3] == ["llama", "4"] and "yes" in rows["acme/tiny-chat"]
    assert REVISION in rows["acme/tiny-chat"][-1]
    assert "yes" in rows["lms/tiny-lms"] and rows["lms/tiny-lms"][-1].endswith(".lmstudio/models/lms/tiny-lms")


@pytest.mark.parametrize("hub_id", ["acme/tiny-chat", "lms/tiny-lms"])
def test_serve_by_hub_id(machine, tmp_path, hub_id):
    with InProcessServer(hub_id, tmp_path / "cache") as server:
        client = server.client()
        assert [m.id for m in client.models.list().data] == [hub_id]
        reply = chat(client, "Hello", max_tokens=4, model=hub_id)
        assert reply.model == hub_id and reply.usage.completion_tokens == 4
    # Its warm tier is a folder of the cache dir, named from the hub id (no slash in it).
    assert [p.name.rsplit("-", 2)[0] for p in (tmp_path / "cache" / "kv").iterdir()] == [hub_id.replace("/", "_")]


def test_a_hub_id_not_on_the_machine_is_refused_with_what_to_do(machine, tmp_path):
    command = [sys.executable, "-m", "agent_memory", "serve", "--model", "acme/elsewhere"]
    command += ["--cache-dir", str(tmp_path / "cache")]
    started = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **machine})
    assert started.returncode == 1
    assert "'acme/elsewhere' is not on this machine" in started.stderr
    assert "agent-memory models fetch acme/elsewhere" in started.stderr
    assert "Traceback" not in started.stderr


def hub_cached(folder: Path, hub: Path, repo_id: str) -> None:
    """`folder` as huggingface_hub downloads a repository: each file a blob named by its digest,
    the revision's snapshot a folder of links to them, `refs/main` naming the revision."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / REVISION).mkdir(parents=True)
    for file in folder.iterdir():
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / digest)
        (repo / "snapshots" / REVISION / file.name).symlink_to(Path("..", "..", "blobs", digest))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)


def test_a_vision_model_by_hub_id_answers_an_image(tmp_path, monkeypatch):
    """The tiny Gemma 3 vision model (models/tiny_vision.py) in the hub cache's layout: served
    by its hub id with its vision half and processor (both read through the snapshot's links),
    an image answered and its tokens counted."""
    hub_cached(build_tiny_vision(tmp_path / "built", arch="gemma3"), tmp_path / "hub", "acme/tiny-vision")
    point_at(monkeypatch, tmp_path / "hub", tmp_path / "home")
    with InProcessServer("acme/tiny-vision", tmp_path / "cache") as server:
        client = server.client()
        (model,) = client.models.list().data
        assert model.id == "acme/tiny-vision" and model.model_extra["input"] == ["text", "image"]
        image = {"type": "image_url", "image_url": {"url": data_url(encoded(picture()))}}
        ask = [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]
        text = [{"role": "user", "content": "What is it?"}]
        seen, unseen = [
            client.chat.completions.create(model="acme/tiny-vision", messages=m, max_tokens=4, temperature=0)
            for m in (ask, text)
        ]
        assert seen.usage.completion_tokens == 4
        assert seen.usage.prompt_tokens >= unseen.usage.prompt_tokens + 4  # the tiny Gemma 3's 4 image tokens
