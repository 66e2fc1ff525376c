"""`agent-memory cache`: look into and tidy the warm tier on disk without loading any model.

It reads the very files the server writes (memory/warm/: folder/paths.py, format/records.py, format/blockfile.py)
and never imports MLX, so it starts at once and runs where MLX cannot. What it looks at:
scan.py and rows.py; what it checks and deletes, and in which order: the warm tier's own admin
(memory/warm/admin/operations.py), through a running server where one holds the agents: operations.py and
server.py; what it prints: render.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from agent_memory.cli.cache import render
from agent_memory.cli.cache.operations import PruneRun, Removal
from agent_memory.agent_key import shown_id
from agent_memory.cli.cache.render import Format, human_bytes, parse_duration, plural
from agent_memory.agent_key import RESPONSE
from agent_memory.cli.cache.rows import FolderStats
from agent_memory.cli.cache.scan import agent_rows, describe_agent, find_agent, locate_agent, open_cache
from agent_memory.cli.cache.select import FILTER_HELP, SORT_HELP, select
from agent_memory.cli.common import CacheDirOption, fail, progress
from agent_memory.memory.warm.admin.operations import Problem, plan_prune, verify_folder

cache_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Inspect and maintain the disk cache (KV block files and agent manifests) without loading a model.",
)

FormatOption = typer.Option(
    Format.human, "--format", help="human: tables; json: one JSON document on stdout; quiet: exit code only."
)
ModelOption = typer.Option(
    None, "--model", help="Only this model folder: its folder name, or the model name the folder starts with."
)
YesOption = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation.")
TenantOption = typer.Option(None, "--tenant", help="The agent's tenant (a name of --api-keys-file), when ids repeat.")
AgentArgument = typer.Argument(..., metavar="ID", help="The agent id (as sent in prompt_cache_key, X-Agent-Id, ...).")
AgentsArgument = typer.Argument(
    ..., metavar="ID", help="One or more agent ids (as sent in prompt_cache_key, X-Agent-Id, ...)."
)
SortOption = typer.Option("last_used", "--sort", metavar="KEY[:asc|:desc]", help=SORT_HELP)
FilterOption = typer.Option(None, "-f", "--filter", metavar="EXPR", help=FILTER_HELP)
ReverseOption = typer.Option(False, "--reverse", help="Reverse the order.")
LimitOption = typer.Option(None, "--limit", min=1, help="Show at most this many agents.")
OlderThanOption = typer.Option(
    None, "--older-than", help="Also remove agents unused for this long: 90s, 15m, 12h, 7d, 2w (default: keep all)."
)
QuarantineOption = typer.Option(False, "--quarantine", help="Also empty the quarantine folders.")
DryRunOption = typer.Option(False, "--dry-run", help="List what would be removed; remove nothing.")
WarmStoreOption = typer.Option(
    None, "--warm-store", metavar="URL", help="A shared warm tier in Redis (redis://HOST:PORT/DB) instead of the cache folder."
)


@cache_app.command("ls")
def ls_command(
    model: str | None = ModelOption,
    filters: list[str] | None = FilterOption,
    sort: str = SortOption,
    reverse: bool = ReverseOption,
    limit: int | None = LimitOption,
    cache_dir: Path | None = CacheDirOption,
    warm_store: str | None = WarmStoreOption,
    fmt: Format = FormatOption,
) -> None:
    """List every agent, across all models (like `hf cache ls`): those with a manifest on disk,
    and those a folder's running server holds in memory only so far (where: server). Stored
    Responses-API responses are counted apart.

    Examples: `cache ls --filter "last_used>7d" --sort size`; `cache ls -f "size>10MB" -f model=tiny`;
    `cache ls -f "id=test-*" --format quiet | xargs -I{} agent-memory cache rm -y {}`."""
    config, root, folders = open_cache(cache_dir, warm_store, model)
    rows = [row for f in folders for row in agent_rows(f, config.key_of)]
    rows = select(rows, filters or [], sort, reverse, time.time())
    responses = sum(1 for f in folders for m in f.files.manifests if m.key.kind == RESPONSE)
    render.ls(root, rows[:limit] if limit else rows, folders, responses, fmt)


@cache_app.command("show")
def show_command(
    agent_id: str = AgentArgument,
    model: str | None = ModelOption,
    tenant: str | None = TenantOption,
    cache_dir: Path | None = CacheDirOption,
    warm_store: str | None = WarmStoreOption,
    fmt: Format = FormatOption,
) -> None:
    """Show one agent: its manifest and each of its blocks, on disk or cold, and what it shares."""
    folder, manifest = find_agent(open_cache(cache_dir, warm_store, model)[2], agent_id, tenant)
    doc = describe_agent(folder, manifest)
    if fmt is Format.json:
        render.emit_json(doc)
    elif fmt is Format.human:
        render.show(doc, folder.layout.root)


@cache_app.command("verify")
def verify_command(
    model: str | None = ModelOption,
    cache_dir: Path | None = CacheDirOption,
    warm_store: str | None = WarmStoreOption,
    fmt: Format = FormatOption,
) -> None:
    """Check every block file and manifest as the server would; exit 1 if anything is wrong.

    Also checks that each block file's name is the hash of its contents and each manifest's
    blocks are the hash chain of its tokens. Changes nothing."""
    _, root, folders = open_cache(cache_dir, warm_store, model)
    now = time.time()
    problems: list[Problem] = []
    total = sum(len(f.files.blocks) + len(f.files.manifests) + len(f.files.bad_manifests) for f in folders)
    with progress(counts=True, transient=True, disable=fmt is Format.quiet) as bars:
        task = bars.add_task("verifying", total=total)
        for folder in folders:
            bars.update(task, description=f"verifying {folder.folder}")
            problems += verify_folder(folder, lambda: bars.advance(task), now)
    checked = {
        "folders": len(folders),
        "blocks": sum(len(f.files.blocks) for f in folders),
        "manifests": sum(len(f.files.manifests) + len(f.files.bad_manifests) for f in folders),
    }
    render.verify(root, checked, problems, fmt)
    if problems:
        raise typer.Exit(1)


@cache_app.command("rm")
def rm_command(
    agent_ids: list[str] = AgentsArgument,
    model: str | None = ModelOption,
    tenant: str | None = TenantOption,
    dry_run: bool = DryRunOption,
    yes: bool = YesOption,
    cache_dir: Path | None = CacheDirOption,
    warm_store: str | None = WarmStoreOption,
    fmt: Format = FormatOption,
) -> None:
    """Remove agents: each one's manifest, then the block files no agent that stays uses.

    Every id must name one agent, or nothing is removed. While a server runs on an agent's
    folder, the agent is ended through it (DELETE /v1/agents/ID, with the configured API key),
    never by deleting files it holds."""
    config, _, folders = open_cache(cache_dir, warm_store, model)
    found = [locate_agent(folders, agent_id, tenant) for agent_id in dict.fromkeys(agent_ids)]
    if problems := [f for f in found if isinstance(f, str)]:
        fail("; ".join(problems) + ("; nothing was removed" if len(found) > 1 else ""))
    plan = Removal.of(found)
    if dry_run:
        render.removal(plan.report(plan.preview(), dry_run=True), fmt)
        return
    if not yes:
        preview = plan.preview()
        blocks, freed = sum(len(a["removed_blocks"]) for a in preview), sum(a["freed_bytes"] for a in preview)
        (folder, first), *others = found
        what = plural(len(found), "agent") if others else f"agent {shown_id(first.key.id)} from {folder.folder}"
        typer.confirm(f"Remove {what} ({plural(blocks, 'block file')}, {human_bytes(freed)})?", abort=True, err=True)
    render.removal(plan.report(plan.execute(config.key_of, config.cache_dir / "responses"), dry_run=False), fmt)


@cache_app.command("prune")
def prune_command(
    older_than: str | None = OlderThanOption,
    quarantine: bool = QuarantineOption,
    dry_run: bool = DryRunOption,
    yes: bool = YesOption,
    model: str | None = ModelOption,
    cache_dir: Path | None = CacheDirOption,
    warm_store: str | None = WarmStoreOption,
    fmt: Format = FormatOption,
) -> None:
    """Remove old agents, orphan block files, leftover temp files (and the quarantine if asked).

    Never removes a block that an agent that stays still uses. Old agents of a folder a server
    runs on are ended through the server."""
    max_age = parse_duration(older_than) if older_than else None
    (config, root, folders), now = open_cache(cache_dir, warm_store, model), time.time()
    runs = [PruneRun(plan_prune(f, max_age, quarantine, now)) for f in folders]
    planned = [(run.plan.folder.folder, *item) for run in runs for item in run.plan.items()]
    freed = sum(i[3] for i in planned)
    if planned and not (yes or dry_run):
        agents = sum(len(run.plan.agents) for run in runs)
        typer.confirm(
            f"Remove {agents} agents and {len(planned) - agents} files ({human_bytes(freed)})?",
            abort=True,
            err=True,
        )
    if not dry_run:
        for run in runs:
            run.connect(config.key_of)  # every server answers before anything is deleted
        freed = sum(run.execute(max_age, now) for run in runs)
    render.prune(root, planned, freed, dry_run, max_age, fmt)


@cache_app.command("stats")
def stats_command(
    model: str | None = ModelOption,
    cache_dir: Path | None = CacheDirOption,
    warm_store: str | None = WarmStoreOption,
    fmt: Format = FormatOption,
) -> None:
    """Per model folder and in total: agents, block files and bytes, cold, orphan, quarantined and temp files."""
    _, root, folders = open_cache(cache_dir, warm_store, model)
    rows = [FolderStats.of(f) for f in folders]
    numbers = [k for k in FolderStats.__dataclass_fields__ if k not in ("model", "folder")]
    total = FolderStats("total", "", **{k: sum(getattr(r, k) for r in rows) for k in numbers})
    render.stats(root, rows, total, fmt)
