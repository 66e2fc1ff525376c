"""Tiny models that speak a real family's chat template (tests/data/chat_templates), so tests can run
the server's tool-call and reasoning formats end to end on the tokens the real model would see."""

from __future__ import annotations

import json
from pathlib import Path

from agent_memory.models.tiny import ChatTemplate, build_tiny

DATA = Path(__file__).resolve().parent.parent / "data" / "chat_templates"
TEMPLATES: dict[str, dict] = {
    entry["family"]: entry for entry in json.loads((DATA / "templates.json").read_text(encoding="utf-8"))
}


def chat_template(family: str) -> ChatTemplate:
    """The manifest entry of `family` as the builder takes it."""
    entry = TEMPLATES[family]
    return ChatTemplate(
        text=(DATA / entry["file"]).read_text(encoding="utf-8"),
        special=tuple(entry["special"]),
        added=tuple(entry["added"]),
        bos=entry["bos"],
        eos=tuple(entry["eos"]),
    )


def templated_model(root: Path, family: str, arch: str = "qwen3") -> Path:
    """A tiny `arch` model (qwen3: small, full attention, fast to build) with `family`'s template and tokens."""
    return build_tiny(root / f"{arch}-{family}", arch=arch, template=chat_template(family))
