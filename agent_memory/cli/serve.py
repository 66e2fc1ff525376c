"""`agent-memory serve`: one flag per setting (derived from `Settings`), then the server.

MLX, uvicorn and the app are imported only when the server starts."""

from __future__ import annotations

import inspect
import logging
import signal
import sys
import types
import typing
from collections.abc import Callable
from typing import Annotated

import typer
from pydantic import SecretStr
from typer.core import TyperCommand

from agent_memory.cli import distributed
from agent_memory.cli.common import error
from agent_memory.cli.engines import chat_config, make_engine, resolve_model_with_progress, served_models
from agent_memory.config import ENV_PREFIX, ConfigError, Settings, config_file_path, load_settings


# `serve --help` shows the flags in these groups, in this order; every setting is in one.
HELP_GROUPS = {
    "Model": ("model", "keep_loaded", "unload_idle_s", "model_defaults", "default_max_tokens"),
    "Network": ("host", "port", "api_key", "api_keys_file", "seal_key_file"),
    "Requests": ("max_batch", "max_waiting", "speculation", "draft_model"),
    "Images": ("max_images", "max_image_mb", "max_image_pixels", "image_urls", "image_url_timeout_s", "vision_cache_mb"),
    "Memory": ("hot_budget_mb", "memory_limit_mb", "kv_bits", "kv_group_size", "decode_quantized", "warm_prompts"),
    "Warm tier": ("cache_dir", "disk_budget_mb", "disk_kv_bits", "warm_store", "responses_budget_mb"),
    "Logging": ("log_level", "log_format", "log_agent_ids", "trace_file"),
    "Across processes": ("distributed", "distributed_timeout"),
}


class GroupedHelp(TyperCommand):
    """Help as plain text in groups (HELP_GROUPS), wrapped to the terminal: a table of 21 flags
    with two name columns does not fit 80 columns."""

    def format_help(self, ctx, formatter) -> None:
        super(TyperCommand, self).format_help(ctx, formatter)  # the plain formatter, not typer's rich one

    def format_options(self, ctx, formatter) -> None:
        rows = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx)}
        for title, names in HELP_GROUPS.items():
            with formatter.section(title):
                formatter.write_dl([rows[n] for n in names])
        with formatter.section("Other"):
            formatter.write_dl([rows["help"]])


def _cli_type(annotation) -> type:
    """The plain type a flag parses (pydantic checks the rest): int for `KVBits | None`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return str if annotation is SecretStr else annotation


def settings_options(command: Callable[[Settings], None]) -> Callable[..., None]:
    """A typer command with one flag per setting, each defaulting to "not given", so the
    environment, the config file and the defaults of `Settings` fill in the rest."""
    params = []
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "none" if default in (None, []) else ("set" if isinstance(default, SecretStr) else default)
        shown = ", ".join(shown) if isinstance(shown, list) else shown
        flag = f"--{name.replace('_', '-')}"
        kind = _cli_type(field.annotation)
        option = typer.Option(
            f"{flag}/--no-{flag[2:]}" if kind is bool else flag,  # a list: the flag given again
            help=field.description if "(default" in field.description else f"{field.description} (default {shown})",
            show_default=False,
            metavar="<str>" if typing.get_origin(kind) is list else None,  # typer would say <list[str]>
        )
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, option]
            )
        )

    def run(**flags) -> None:
        try:
            settings = load_settings(**flags)
            settings.check_serve()
        except ConfigError as e:
            error(e)
            raise typer.Exit(2) from e
        command(settings)

    run.__signature__ = inspect.Signature(params)
    run.__annotations__ = {p.name: p.annotation for p in params}
    run.__name__ = command.__name__
    run.__doc__ = (
        f"{command.__doc__}\n\nEvery flag can also be set in the environment as {ENV_PREFIX}<FLAG> "
        f"({ENV_PREFIX}HOT_BUDGET_MB=4096) or in {config_file_path()} (hot_budget_mb = 4096); "
        "a flag wins over the environment, which wins over the file."
    )
    return run


@settings_options
def serve(settings: Settings) -> None:
    """Serve a model on an OpenAI-compatible API, keeping every agent's KV cache."""
    try:
        group = distributed.join(settings)  # under mlx.launch: this process's rank; alone: None
    except ConfigError as e:
        error(e)
        sys.exit(1)
    _configure_logging(settings.log_level, settings.log_format, f" {group.label}" if group else "")
    logging.getLogger("agent_memory").info("settings: %s", settings.describe())
    sys.exit(_serve(settings, group))


def _serve(settings: Settings, group=None) -> int:
    if group is not None and (why := distributed.flag_refusal(settings, group.size)):
        error(why)  # on every rank, before anything is loaded
        return 1
    import uvicorn

    from agent_memory.api.sealing import SealKeyError
    from agent_memory.models.folders import ModelError
    from agent_memory.models.registry import ModelSpec

    server: uvicorn.Server | None = None
    split = None
    try:
        if group is not None:  # the model split over the processes: rank 0 serves, the others follow
            path = resolve_model_with_progress(ModelSpec.parse(settings.model[0]).spec, settings.models_dir)
            split = distributed.prepare(settings, group, path)
            if group.rank != 0:
                config = next(iter(served_models(settings).values()))
                return distributed.follow(chat_config(settings, config, None, split))
    except (ModelError, ConfigError) as e:
        error(e)
        return 1
    exit_status = 0

    def stop(status: int) -> None:  # the model could not be loaded (1), a rank of a split model was lost (75)
        nonlocal exit_status
        exit_status = status
        server.should_exit = True

    def group_lost() -> None:
        from agent_memory.engine.distributed.group import STOPPED  # loaded already: the group is MLX's

        stop(STOPPED)

    try:
        app = build_app(settings, lambda: stop(1), split, group_lost)
    except (ModelError, ConfigError, SealKeyError) as e:
        error(e)
        return 1
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,  # one line per request comes from api/access_log.py, with what it did
        timeout_graceful_shutdown=30,
    )
    server = uvicorn.Server(config)
    if group is not None:
        # uvicorn raises again, once stopped, the SIGTERM it stopped on (the launcher sends one when
        # a rank dies): ignored then, so that rank 0 exits with its own status (0, or 75)
        signal.signal(signal.SIGTERM, lambda *_: None)
    server.run()
    return exit_status


def build_app(
    settings: Settings, on_load_failure: Callable[[], None], split=None, on_group_lost: Callable[[], None] | None = None
):
    """The app `serve` runs: every --model's engine over one Residency, the response store and
    the sealer (the tests serve the same in their own process: tests/support/inprocess.py);
    `split`: rank 0's part of a model split over processes (cli/distributed.py), which calls
    `on_group_lost` once a rank is lost (engine/distributed/faults.py).
    Raises ModelError, ConfigError or SealKeyError for a model, flag or key that cannot serve."""
    from agent_memory.api.app import create_app
    from agent_memory.api.heads import read_warm_prompts
    from agent_memory.api.responses.store import ResponseStore
    from agent_memory.api.sealing import Sealer
    from agent_memory.chat.images import ImageLimits
    from agent_memory.engine.loading.residency import Residency
    from agent_memory.log_once import start_afresh

    start_afresh()  # this server has said nothing yet (agent_memory/log_once.py)
    # The operator's file must exist (servers behind a router share it); the default is made.
    sealer = Sealer.from_file(settings.seal_key_path, create=settings.seal_key_file is None)
    warm_prompts = read_warm_prompts(settings.warm_prompts) if settings.warm_prompts else []
    served = served_models(settings)
    draft = resolve_model_with_progress(settings.draft_model, settings.models_dir) if settings.draft_model else None
    residency = Residency(settings.memory_limit_bytes, settings.hot_budget_mb << 20, settings.unload_idle_s)
    engines = {
        model_id: make_engine(settings, config, residency, draft, split, on_group_lost)
        for model_id, config in served.items()
    }

    def end_agent(key):  # a stored response's KV, in whichever model made it
        for engine in engines.values():
            engine.end_agent(key)

    return create_app(
        engines,  # by the model id each serves; the first answers requests that name none
        host=settings.host,
        port=settings.port,
        api_keys=settings.tenant_keys(),
        max_waiting=settings.max_waiting,
        log_agent_ids=settings.log_agent_ids,
        responses=ResponseStore(
            settings.cache_dir / "responses" if settings.disk_budget_mb else None,
            settings.responses_budget_bytes,
            end_agent,
        ),
        sealer=sealer,
        images=ImageLimits(
            settings.max_images,
            settings.max_image_mb << 20,
            settings.max_image_pixels,
            settings.image_urls,
            settings.image_url_timeout_s,
        ),
        on_load_failure=on_load_failure,
        warm_prompts=warm_prompts,
    )


def _configure_logging(level: str, fmt: str, rank: str = "") -> None:
    """Text for people, or one JSON object a line for log collectors (python-json-logger);
    `rank`: ` rank=r/N` under mlx.launch, which interleaves the processes' lines."""
    handler = logging.StreamHandler()
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter(f"%(asctime)s %(levelname)s{rank} %(name)s %(message)s"))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s{rank} %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # transformers warns when a prompt is longer than the model's context ("Token indices
    # sequence length is longer than..."): the server measures every prompt against the
    # context itself and refuses it with a clear error, so the warning only misleads.
    logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)
