#!/usr/bin/env python3
"""Write the man pages of `gpuguard` and of every command under it into packaging/man/
(gpuguard.1, gpuguard-check.1, gpuguard-rules-explain.1, ...), from the click command
tree itself: the help text, the usage line, every option with its help, default and
choices, the subcommands of a group. A page cannot drift from the CLI: the tests fail
when a committed page is not what this writes today (tests/test_manpages.py).

    python scripts/gen_manpages.py [--check]

--check: exit 1 when a page is missing, out of date, or left over from a command that is
gone. Our own generator, not click-man (PyPI): click-man 0.6 reads `group.commands`, which
holds only the commands our lazy group (cli/main.py) has imported so far; stamps each page
with today's date (a committed page would be stale the next day); and writes help text
into the page unescaped (a backslash, or a line that starts with a dot, is read by roff
as markup). No date or version here either, so a page changes only when the CLI does."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.cli.main import main as cli  # noqa: E402

OUT = REPO / "packaging" / "man"
PROG = "gpuguard"


def escape(text: str) -> str:
    """Text as roff prints it, not as markup: backslashes, hyphens (a plain `-` may be
    set as a hyphen, and a copied `--format` would not work), quotes that groff turns
    typographic, anything not ASCII (as a named code point, whatever the input encoding)."""
    out = []
    for char in text:
        if char == "\\":
            out.append(r"\e")
        elif char == "-":
            out.append(r"\-")
        elif char == "'":
            out.append(r"\(aq")
        elif char == "`":
            out.append(r"\(ga")
        elif ord(char) > 126:
            out.append(rf"\[u{ord(char):04X}]")
        else:
            out.append(char)
    return "".join(out)


def text_line(text: str) -> str:
    """One line of running text: a line that starts with a dot or a quote would be a
    request to roff; \\& in front keeps it text."""
    line = escape(text.strip())
    return rf"\&{line}" if line.startswith((".", "'")) else line


def paragraphs(help_text: str) -> list[str]:
    """A command's help as roff paragraphs: blank lines part them, as in --help; a
    paragraph that click's \\b marks is kept as written (no refill), as click keeps it."""
    text = inspect.cleandoc(help_text).partition("\f")[0]
    out: list[str] = []
    for block in text.split("\n\n"):
        lines = block.splitlines()
        if not lines:
            continue
        out.append(".PP")
        if lines[0].strip() == "\b":
            out += [".nf", *(text_line(line) for line in lines[1:]), ".fi"]
        else:
            out += [text_line(line) for line in lines if line.strip()]
    return out


def page_name(path: list[str]) -> str:
    return "-".join(path)


def short_help(command: click.Command) -> str:
    return command.get_short_help_str(limit=300) or "(no description)"


def context(command: click.Command, path: list[str], parent: click.Context | None
            ) -> click.Context:
    """The context click gives `command` when run (its context_settings: -h beside --help
    on the group, inherited by every command under it)."""
    return click.Context(command, info_name=path[-1], parent=parent, **command.context_settings)


def render(command: click.Command, path: list[str], parent: click.Context | None = None,
           subcommands: list[tuple[str, click.Command]] | None = None) -> str:
    """The man page of `command`, called as `path` (["gpuguard", "rules", "explain"])."""
    ctx = context(command, path, parent)
    name = page_name(path)
    # .nh .ad l: no hyphens inserted (a path or an option split at a line's end reads
    # as another), ragged right (no stretched spaces between words)
    lines = [rf'.TH "{escape(name.upper())}" "1" "" "{PROG}" "{PROG} manual"', ".nh", ".ad l",
             ".SH NAME", rf"{escape(name)} \- {escape(short_help(command))}",
             ".SH SYNOPSIS", rf".B {escape(' '.join(path))}",
             text_line(" ".join(command.collect_usage_pieces(ctx)))]
    if command.help:
        lines += [".SH DESCRIPTION", *paragraphs(command.help)]
    records = [param.get_help_record(ctx) for param in command.get_params(ctx)
               if isinstance(param, click.Option)]
    if records:
        lines.append(".SH OPTIONS")
        for record in records:
            if record is None:  # a hidden option
                continue
            names, help_text = record
            lines += [".TP", rf"\fB{escape(names)}\fR"]
            lines += [text_line(line) for line in help_text.splitlines() if line.strip()] \
                or [r"\&"]
    see_also = [page_name(path[:-1])] if len(path) > 1 else []
    if subcommands:
        lines.append(".SH COMMANDS")
        for sub_name, sub in subcommands:
            lines += [".TP", rf"\fB{escape(sub_name)}\fR", text_line(short_help(sub)),
                      rf"See \fB{escape(page_name([*path, sub_name]))}\fR(1)."]
        see_also += [page_name([*path, sub_name]) for sub_name, _ in subcommands]
    if see_also:
        lines += [".SH SEE ALSO",
                  ",\n".join(rf".BR {escape(page)} (1)" for page in see_also)]
    return "\n".join(lines) + "\n"


def visible_subcommands(group: click.Command, ctx: click.Context
                        ) -> list[tuple[str, click.Command]]:
    if not isinstance(group, click.Group):
        return []
    found = [(name, group.get_command(ctx, name)) for name in group.list_commands(ctx)]
    return [(name, sub) for name, sub in found if sub is not None and not sub.hidden]


def pages(root: click.Command) -> dict[str, str]:
    """File name -> page, for `root` and every command under it (our lazy group's too:
    list_commands and get_command import each command, `commands` would not)."""
    out: dict[str, str] = {}

    def walk(command: click.Command, path: list[str], parent: click.Context | None) -> None:
        ctx = context(command, path, parent)
        subcommands = visible_subcommands(command, ctx)
        out[page_name(path) + ".1"] = render(command, path, parent, subcommands)
        for name, sub in subcommands:
            walk(sub, [*path, name], ctx)

    walk(root, [PROG], None)
    return out


def main() -> int:
    fresh = pages(cli)
    if "--check" in sys.argv:
        committed = {p.name for p in OUT.glob("*.1")}
        stale = sorted(name for name, text in fresh.items()
                       if not (OUT / name).exists() or (OUT / name).read_text() != text)
        for name in stale:
            print(f"out of date: {OUT / name}: run scripts/gen_manpages.py", file=sys.stderr)
        for name in sorted(committed - set(fresh)):
            print(f"no such command: {OUT / name}: run scripts/gen_manpages.py",
                  file=sys.stderr)
        return 1 if stale or committed - set(fresh) else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.1"):
        if old.name not in fresh:
            old.unlink()
    for name, text in fresh.items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
