"""What every launchable program is: its command, how to install it, what it needs set to use
a server (the environment and arguments of a launch, files launch writes for it in its own
folder) and the lines of the user's own config files that do the same for those who would
rather run it by hand (`--print` shows them, `--write-config` writes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent_memory.cli.launch.config_files import UserFile
from agent_memory.cli.launch.target import Target

PROVIDER = "agent-memory"  # the provider's name in the programs' configs


@dataclass(frozen=True)
class Launch:
    env: dict[str, str]
    args: list[str] = field(default_factory=list)  # before the user's own
    files: dict[Path, str] = field(default_factory=dict)  # written before the program starts


class Program:
    name: str
    binary: str
    install: str  # the command that installs it

    def launch(self, target: Target, folder: Path) -> Launch:
        """The environment, arguments and files of a run against `target`; `folder` is launch's
        own for this program (under the cache folder), where its files go."""
        raise NotImplementedError

    def user_files(self, target: Target) -> list[UserFile]:
        """The user's config files that point the program at `target` when it runs by hand."""
        raise NotImplementedError

    def user_env(self, target: Target) -> dict[str, str]:
        """What the user exports beside those files to run it by hand."""
        return {}

    def by_hand(self, target: Target) -> str:
        """The command that runs it by hand once the files are written."""
        return self.binary

    def missing(self, target: Target) -> str | None:
        """Why it cannot run against `target` as its files stand, if it cannot."""
        return None
