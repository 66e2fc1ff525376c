"""`agent-memory cache` in `hf cache`'s dialect: several ids and --dry-run on rm, --filter and
--sort expressions on ls, -h and --version, decimal sizes, and plain columns that a pipe can
read (no box drawing, one line per row, the same columns whatever the rows hold)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from agent_memory import __version__
from agent_memory.cli import app
from agent_memory.cli.cache.render import human_bytes, parse_duration
from agent_memory.cli.cache.select import parse_size
from tests.support.server import REPO
from tests.support.warm_folders import DAY, FP_TINY, cache, verify, write_agent  # noqa: F401 - cache: the fixture

pytestmark = pytest.mark.process


BOX = re.compile(r"[\u2500-\u257f]")  # box drawing characters


def ids(cache, *args: str) -> list[str]:
    result = cache.run("ls", "--format", "quiet", *args)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


# -- rm ------------------------------------------------------------------------------------


def test_rm_several_agents_frees_the_blocks_only_they_share(cache):
    shared = cache.alice.blocks[:2]  # alice's and bob's, nobody else's
    gone = {cache.tiny.agent_path(a) for a in ("alice", "bob")}
    gone |= {cache.tiny.block_path(h) for h in [*cache.alice.blocks, *cache.bob.blocks[:3]]}
    expected = sum(p.stat().st_size for p in gone)

    dry = cache.json("rm", "alice", "bob", "--dry-run")
    assert dry["dry_run"] and all(p.exists() for p in gone)
    assert sorted(dry["removed_blocks"]) == sorted({*cache.alice.blocks, *cache.bob.blocks[:3]})
    assert dry["freed_bytes"] == expected and dry["kept_shared_blocks"] == 0
    assert [a["id"] for a in dry["agents"]] == ["alice", "bob"]
    assert sum(a["freed_bytes"] for a in dry["agents"]) == expected  # the shared blocks go with the last one
    assert set(dry["agents"][1]["removed_blocks"]) >= set(shared)

    result = cache.run("rm", "alice", "bob", "-y", "--format", "json")
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert not done["dry_run"] and done["freed_bytes"] == expected and done["server"] is None
    assert sorted(done["removed_blocks"]) == sorted(dry["removed_blocks"])
    assert not any(p.exists() for p in gone)
    assert ids(cache) == ["carol"] and cache.tiny.block_path(cache.orphan).exists()
    assert verify(cache)[0] == 0


def test_rm_dry_run_for_people_and_the_question_before_removing(cache):
    before = cache.files()
    result = cache.run("rm", "alice", "carol", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would remove 2 agents" in result.stdout and "(dry run)" in result.stdout
    assert "alice" in result.stdout and "carol" in result.stdout and not BOX.search(result.stdout)
    assert cache.files() == before
    result = cache.run("rm", "alice", "carol", input="n\n")
    assert result.exit_code == 1 and "Remove 2 agents" in result.stderr and cache.files() == before
    result = cache.run("rm", "alice", "carol", input="y\n")
    assert result.exit_code == 0 and result.stdout.count("removed agent") == 2 and "removed 2 agents" in result.stdout
    assert ids(cache) == ["bob"]


def test_rm_removes_nothing_unless_every_id_names_an_agent(cache):
    before = cache.files()
    result = cache.run("rm", "alice", "dave", "erin", "-y")
    assert result.exit_code == 1
    assert "no agent dave" in result.stderr and "no agent erin" in result.stderr
    assert "nothing was removed" in result.stderr
    assert cache.files() == before
    result = cache.run("rm", "alice", "alice", "-y", "--format", "json")  # the same id twice is one agent
    assert result.exit_code == 0 and [a["id"] for a in json.loads(result.stdout)["agents"]] == ["alice"]


# -- ls --filter and --sort ----------------------------------------------------------------


@pytest.mark.parametrize(
    "filters, expected",
    [
        (["last_used>7d"], ["alice"]),  # unused for over a week
        (["accessed>7d"], ["alice"]),  # hf's name for it
        (["last_used<1h"], ["bob"]),
        (["last_used<=2w", "last_used>=1h"], ["carol", "alice"]),
        (["tokens>50"], ["carol"]),
        (["tokens=14"], ["bob", "alice"]),
        (["cold>0"], ["bob"]),
        (["blocks!=4"], ["carol"]),
        (["id=a*"], ["alice"]),
        (["id!=bob"], ["carol", "alice"]),
        (["model=tiny"], ["bob", "alice"]),
        (["model=demo-*"], ["carol"]),
        (["tenant="], []),  # a pattern must be given
        (["size>1GB"], []),
        (["size>=0"], ["bob", "carol", "alice"]),
    ],
)
def test_ls_filters(cache, filters, expected):
    args = [a for f in filters for a in ("--filter", f)]
    if expected == [] and filters == ["tenant="]:
        assert cache.run("ls", *args).exit_code == 2
        return
    assert ids(cache, *args) == expected


def test_ls_size_filters_and_sorts_by_the_bytes_shown(cache):
    sizes = {a["id"]: a["bytes"] for a in cache.json("ls")["agents"]}
    smallest = min(sizes.values())
    newest_first = ids(cache)
    assert ids(cache, "-f", f"size>{smallest}") == [i for i in newest_first if sizes[i] > smallest]
    assert ids(cache, "-f", f"size<={smallest}B", "--sort", "id") == sorted(i for i in sizes if sizes[i] <= smallest)
    assert ids(cache, "--sort", "size") == sorted(sizes, key=lambda i: (-sizes[i], i))
    assert ids(cache, "--sort", "size:asc") == sorted(sizes, key=lambda i: (sizes[i], i))
    assert ids(cache, "--sort", "bytes") == ids(cache, "--sort", "size")  # the old name still works


def test_ls_sort_keys_and_orders(cache):
    assert ids(cache) == ids(cache, "--sort", "last_used") == ["bob", "carol", "alice"]
    assert ids(cache, "--sort", "last-used") == ids(cache, "--sort", "accessed:desc") == ["bob", "carol", "alice"]
    assert ids(cache, "--sort", "last_used:asc") == ["alice", "carol", "bob"]
    assert ids(cache, "--sort", "name") == ids(cache, "--sort", "id:asc") == ["alice", "bob", "carol"]
    assert ids(cache, "--sort", "id:desc") == ["carol", "bob", "alice"]
    assert ids(cache, "--sort", "id", "--reverse") == ["carol", "bob", "alice"]
    assert ids(cache, "--sort", "model") == ["carol", "alice", "bob"]  # demo before tiny, then ids
    assert ids(cache, "--sort", "tokens:asc") == ["alice", "bob", "carol"]
    assert ids(cache, "--sort", "blocks", "--limit", "2") == ["alice", "bob"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--filter", "size>10XB"], "not a size"),
        (["--filter", "last_used>7 days"], "not a duration"),
        (["--filter", "colour=red"], "unknown key"),
        (["--filter", "id>b"], "takes = or !="),
        (["--filter", "tokens>many"], "whole number"),
        (["--filter", "tokens"], "KEY OP VALUE"),
        (["--sort", "colour"], "unknown key"),
        (["--sort", "size:up"], ":asc or :desc"),
    ],
)
def test_bad_expressions_are_usage_errors(cache, args, message):
    result = cache.run("ls", *args)
    assert result.exit_code == 2 and message in result.output


def test_units():
    assert [parse_size(s) for s in ("500", "500B", "64kB", "10MB", "10 mb", "1.5GB", "10MiB", "2k")] == [
        500,
        500,
        64_000,
        10_000_000,
        10_000_000,
        1_500_000_000,
        10 << 20,
        2000,
    ]
    for bad in ("", "MB", "10XB", "-1MB", "1e6"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert parse_duration("3mo") == 90 * DAY and parse_duration("1y") == 365 * DAY
    assert parse_duration("1mo2d") == 32 * DAY
    assert human_bytes(10_000_000) == "10.0 MB"  # the unit `size>10MB` reads


# -- output: plain columns, help, version --------------------------------------------------


def _columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_tables_are_plain_columns_one_line_per_row(cache, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # a narrow terminal's width changes nothing when piped
    long_id = "agent-with-a-very-long-name-" + "x" * 80
    write_agent(cache.tiny, FP_TINY, 4, long_id, [1, 2, 3, 4, 5], time.time())
    result = cache.run("ls")
    lines = result.stdout.splitlines()
    assert _columns(lines[0]) == ["id", "model", "tokens", "blocks", "size", "last_used", "where"]
    rows = lines[1:5]
    assert all(len(_columns(row)) == 7 for row in rows), rows
    assert any(row.startswith(long_id + "  ") for row in rows)  # whole, on its row's line
    starts = {m.start() for row in rows for m in [re.search(r"disk$", row)]}
    assert len(starts) == 1  # the last column starts at one offset: aligned
    for args in (["ls"], ["show", "bob"], ["stats"], ["prune", "--older-than", "7d", "--dry-run"], ["verify"]):
        out = cache.run(*args).stdout
        assert not BOX.search(out) and not any(line != line.rstrip() for line in out.splitlines()), (args, out)
    stats = cache.run("stats").stdout.splitlines()
    columns = ["model", "agents", "responses", "blocks", "size", "cold", "orphans", "quarantined", "temp"]
    assert _columns(stats[0]) == columns
    assert all(len(_columns(line)) == 9 for line in stats[1:])


def test_models_ls_is_plain_columns(tmp_path, tiny_model):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(tiny_model, target_is_directory=True)
    result = CliRunner().invoke(app, ["models", "ls", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()[:2]  # then whatever the hub cache holds here
    assert _columns(header) == ["name", "type", "layers", "weights", "size", "served", "path"]
    assert _columns(row)[:4] == ["tiny", "llama", "4", "float"] and _columns(row)[4].endswith("MB")
    assert _columns(row)[5] == "yes"
    assert not BOX.search(result.stdout)


@pytest.mark.parametrize(
    "args", [["-h"], ["cache", "-h"], ["cache", "ls", "-h"], ["cache", "rm", "-h"], ["models", "-h"], ["serve", "-h"]]
)
def test_dash_h_is_help(args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and "Usage:" in result.stdout


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"agent-memory {__version__}\n"
    done = subprocess.run([sys.executable, "-m", "agent_memory", "--version"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == f"agent-memory {__version__}"
