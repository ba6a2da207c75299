"""The `gpuguard` command group: each command lives in a module of its own here.

The modules are imported when their command is run (or listed, for --help): `gpuguard
check` does not import the daemon's, Slurm's or the qualifier's options and their
imports (issue 32: 11 ms of the parent's start on the H200 host, before the NVML
worker answers)."""

from __future__ import annotations

from importlib import import_module

import click

from gpuguard import __version__

# command name -> (module under gpuguard.cli, the click command's name there)
COMMANDS = {
    "check": ("check", "check"), "snapshot": ("check", "snapshot"),
    "xid": ("history", "xid"), "events": ("history", "events_cmd"), "ack": ("history", "ack"),
    "daemon": ("daemon", "daemon"), "failover": ("failover", "failover"),
    "rules": ("rules", "rules"), "status": ("status", "status"), "slurm": ("slurm", "slurm"),
    "qualify": ("qualify", "qualify"),
}


class LazyGroup(click.Group):
    """A group whose commands are imported from COMMANDS on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            self.add_command(_imported(cmd_name))
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            # click suggests among the commands imported so far: suggest among them all
            raise click.exceptions.NoSuchCommand(
                exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def load_all(self) -> None:
        """Every command imported (for a walk over `commands`, as the tests do)."""
        for name in COMMANDS:
            if name not in self.commands:
                self.add_command(_imported(name))


def _imported(name: str) -> click.Command:
    module, attr = COMMANDS[name]
    command = getattr(import_module(f"gpuguard.cli.{module}"), attr)
    assert isinstance(command, click.Command) and command.name == name
    return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuguard")
def main() -> None:
    """Hardware preflight and health checks for NVIDIA GPU inference hosts."""
