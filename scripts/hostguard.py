#!/usr/bin/env python3
"""Prove that a test run left the host as it found it (issue 18).

    hostguard.py snapshot OUT.json [--root /] [--proc /proc] [--cgroup-root /sys/fs/cgroup]
                                   [--kmsg-file /dev/kmsg]
                                   [--run-cgroup DIR | --run-marker NAME=VALUE]
    hostguard.py compare BEFORE.json AFTER.json [--only SECTION]...

A snapshot records what a test run could leave behind, one section each:

  mounts              the mount table with options (mount point, type, source, options)
  cgroups             /sys/fs/cgroup to depth 2: the hierarchies, and the cgroups at their top
  cgroup_hierarchies  the kernel's cgroup hierarchies and where each is mounted
  sockets             listening TCP/UDP (v4 and v6) and unix sockets
  processes           processes still in the run's cgroup (or carrying its environment marker)
  kernel_log          kernel-log lines that mention gpuguard
  files               everything under /etc/gpuguard, /var/lib/gpuguard and /run/gpuguard
  boot                services enabled at boot: systemd's .wants/.requires links, SysV S links

`compare` prints every difference, one a line: `+ SECTION: ITEM` (there after, not before)
or `- SECTION: ITEM` (gone), and exits 1; 0 when the snapshots are the same. Every root is
an option, so the guard's own tests run against a made-up host where they must.

Standard library only: scripts/test.sh runs it before anything is installed.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import socket
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

SCHEMA = 1
SECTIONS = ("mounts", "cgroups", "cgroup_hierarchies", "sockets", "processes", "kernel_log",
            "files", "boot")
GPUGUARD_DIRS = ("etc/gpuguard", "var/lib/gpuguard", "run/gpuguard")
# /proc/net/tcp* states: 0A is LISTEN. /proc/net/unix flags: __SO_ACCEPTCON is listening.
TCP_LISTEN = "0A"
UNIX_ACCEPTCON = 0x10000
# A record of /dev/kmsg or `dmesg -r` ("6,353,579388,-;text"), or a line of `dmesg`
# ("[   12.345678] text"): the prefix before the message.
KMSG_PREFIX = re.compile(r"^(?:<\d+>)?(?:\d+,\d+,\d+(?:,[^;]*)?;|\[\s*\d+\.\d+\]\s?)")
# Far more than a kernel ring buffer holds: a bound for a character device given as the
# log that is not /dev/kmsg and never ends (/dev/zero).
KMSG_READ_LIMIT = 64 * 1024 * 1024


# ----------------------------------------------------------------------------- mounts


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mountinfo(proc: Path) -> list[dict[str, str]]:
    """The mount table of this mount namespace, without the ids (they change on remount)."""
    mounts = []
    for line in (proc / "self" / "mountinfo").read_text().splitlines():
        fields = line.split(" ")
        sep = fields.index("-", 6)  # optional fields (shared:N, master:N) come before "-"
        mounts.append({"point": unescape(fields[4]), "options": fields[5],
                       "type": fields[sep + 1], "source": unescape(fields[sep + 2]),
                       "super": fields[sep + 3]})
    return mounts


def mounts_section(mounts: list[dict[str, str]]) -> list[str]:
    # The per-mount and the file system's options both: `mount -o remount,ro` of a tmpfs
    # shows in the second only.
    return [f"{m['point']} {m['type']} {m['source']} {m['options']} {m['super']}"
            for m in mounts]


# ---------------------------------------------------------------------------- cgroups


def cgroup_tree(cgroup_root: Path, run_cgroup: Path | None) -> list[str]:
    """The hierarchies under /sys/fs/cgroup (directories and the links between their
    names) and the cgroups at the top of each (directories only). The run's own cgroup is
    left out: it is how leaked processes are found, reported as processes."""
    items = []
    try:
        top = sorted(cgroup_root.iterdir())
    except OSError:
        return []
    for entry in top:
        if entry.is_symlink():
            items.append(f"{entry.name} -> {os.readlink(entry)}")
            continue
        if not entry.is_dir():
            continue
        items.append(f"{entry.name}/")
        try:
            children = sorted(entry.iterdir())
        except OSError:
            continue
        for child in children:
            if child.is_dir() and not child.is_symlink() and child != run_cgroup:
                items.append(f"{entry.name}/{child.name}/")
    return items


def cgroup_hierarchies(proc: Path, mounts: list[dict[str, str]]) -> list[str]:
    """Every hierarchy the kernel has, named by its controllers, and where it is mounted.

    /proc/self/cgroup has a line for each hierarchy whether or not it is mounted here: a
    hierarchy created in a container's mount namespace and left with cgroups in it lives
    on, unmounted and invisible in /sys/fs/cgroup; this is where it shows."""
    items = []
    for line in (proc / "self" / "cgroup").read_text().splitlines():
        number, controllers, _ = line.split(":", 2)
        if number == "0":  # the v2 hierarchy, one per kernel
            points = [m["point"] for m in mounts if m["type"] == "cgroup2"]
            name = "cgroup2"
        else:
            wanted = set(controllers.split(","))
            points = [m["point"] for m in mounts
                      if m["type"] == "cgroup" and wanted <= set(m["super"].split(","))]
            name = controllers
        where = ", ".join(sorted(points)) or "nowhere"
        items.append(f"{name} (hierarchy {number}) mounted at {where}")
    return items


# ---------------------------------------------------------------------------- sockets


def decode_address(hex_addr: str) -> str:
    """/proc/net/tcp's `0100007F:1F90` -> `127.0.0.1:8080` (v6: `[::1]:8080`). The address
    is in the kernel's byte order, 32 bits at a time."""
    addr, port = hex_addr.split(":")
    raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw)}:{int(port, 16)}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{int(port, 16)}"


def inet_listeners(proc: Path) -> list[str]:
    """TCP sockets in LISTEN, and UDP sockets bound without a peer (UDP has no LISTEN:
    an unconnected bound socket is one that receives from anyone)."""
    items = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = (proc / "net" / proto).read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if proto.startswith("tcp") and state != TCP_LISTEN:
                continue
            if proto.startswith("udp") and int(remote.split(":")[1], 16) != 0:
                continue
            items.append(f"{proto} {decode_address(local)}")
    return items


def unix_listeners(proc: Path) -> list[str]:
    """Listening unix sockets that have a name (a path, or @ for the abstract namespace)."""
    items = []
    try:
        lines = (proc / "net" / "unix").read_text().splitlines()[1:]
    except FileNotFoundError:
        return []
    for line in lines:
        fields = line.split(maxsplit=7)
        if len(fields) == 8 and int(fields[3], 16) & UNIX_ACCEPTCON:
            items.append(f"unix {fields[7]}")
    return items


# -------------------------------------------------------------------------- processes


def cmdline(proc: Path, pid: int) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    if not raw:  # a zombie, or a kernel thread
        try:
            return f"[{(proc / str(pid) / 'comm').read_text().strip()}]"
        except OSError:
            return "?"
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def ourselves(proc: Path) -> set[int]:
    """This process and its ancestors (scripts/test.sh among them), never a leak."""
    pids = set()
    pid = os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: ppid
    return pids


def processes_in_cgroup(run_cgroup: Path) -> set[int]:
    """Every process in the cgroup or any cgroup below it."""
    pids: set[int] = set()
    if not run_cgroup.is_dir():
        return pids
    for directory, _, files in os.walk(run_cgroup):
        if "cgroup.procs" in files:
            try:
                text = (Path(directory) / "cgroup.procs").read_text()
            except FileNotFoundError:  # a cgroup below removed while we looked
                continue
            pids.update(int(p) for p in text.split())
    return pids


def processes_with_marker(proc: Path, marker: str) -> set[int]:
    """Processes whose environment holds NAME=VALUE: the fallback without a usable cgroup
    hierarchy. A daemon that clears its environment escapes it."""
    wanted = marker.encode()
    pids = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or a kernel thread
            continue
        if wanted in environ.split(b"\0"):
            pids.add(int(entry.name))
    return pids


def processes_section(proc: Path, run_cgroup: Path | None, marker: str | None) -> list[str]:
    pids: set[int] = set()
    if run_cgroup is not None:
        pids = processes_in_cgroup(run_cgroup)
    elif marker is not None:
        pids = processes_with_marker(proc, marker)
    return [f"pid {pid}: {cmdline(proc, pid)}" for pid in sorted(pids - ourselves(proc))]


# ------------------------------------------------------------------------- kernel log


def read_kmsg_device(path: Path) -> list[str]:
    """The records buffered in /dev/kmsg, read without blocking: one record a read()."""
    records = []
    total = 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while total < KMSG_READ_LIMIT:
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:  # the end of the buffer
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while we read: go on
                    continue
                raise
            if not data:
                break
            total += len(data)
            records.append(data.decode(errors="replace"))
    finally:
        os.close(fd)
    return records


def kernel_log_section(kmsg: Path, notes: list[str]) -> list[str]:
    """The messages that mention gpuguard, without their sequence numbers and times (the
    count is the section's length). A character device is read as /dev/kmsg; anything
    else as a saved log, one line a message."""
    try:
        if kmsg.is_char_device():
            lines = [record.split("\n", 1)[0] for record in read_kmsg_device(kmsg)]
        else:
            # continuation lines of a record (" KEY=value") say nothing of their own
            lines = [line for line in kmsg.read_text(errors="replace").splitlines()
                     if not line.startswith(" ")]
    except OSError as exc:
        notes.append(f"kernel log: cannot read {kmsg}: {exc.strerror or exc}")
        return []
    return [KMSG_PREFIX.sub("", line) for line in lines if "gpuguard" in line.lower()]


# ----------------------------------------------------------------- files and boot links


def host_path(root: Path, path: Path) -> str:
    """The path as it is on the host, whatever --root the snapshot was taken under."""
    return "/" + path.relative_to(root).as_posix()


def describe(root: Path, path: Path) -> str:
    shown = host_path(root, path)
    if path.is_symlink():
        return f"{shown} -> {os.readlink(path)}"
    if path.is_dir():
        return f"{shown}/"
    stat = path.lstat()
    mtime = datetime.fromtimestamp(stat.st_mtime_ns / 1e9, UTC).isoformat()
    return f"{shown} ({stat.st_size} bytes, modified {mtime})"


def described(root: Path, paths: Iterable[Path]) -> list[str]:
    """describe() of each path, but one that went away while we looked."""
    items = []
    for path in paths:
        try:
            items.append(describe(root, path))
        except FileNotFoundError:
            continue
    return items


def walk(top: Path) -> Iterator[Path]:
    """top and everything below it, symbolic links to directories not followed."""
    if not top.exists() and not top.is_symlink():
        return
    yield top
    if top.is_dir() and not top.is_symlink():
        for directory, dirs, files in os.walk(top):
            for name in sorted(dirs + files):
                yield Path(directory) / name


def files_section(root: Path) -> list[str]:
    return described(root, (p for top in GPUGUARD_DIRS for p in walk(root / top)))


def boot_section(root: Path) -> list[str]:
    """What starts at boot: the links `systemctl enable` makes (and deb-systemd-helper
    for packages), and the S links of SysV runlevels S and 2-5."""
    items = []
    units = root / "etc" / "systemd" / "system"
    for directory, dirs, files in os.walk(units):
        if directory.endswith((".wants", ".requires")):
            items += described(root, (Path(directory) / name for name in dirs + files))
    for level in "S2345":
        rc_dir = root / "etc" / f"rc{level}.d"
        if rc_dir.is_dir():
            items += described(root, rc_dir.glob("S*"))
    return items


# -------------------------------------------------------------------------- commands


def snapshot(args: argparse.Namespace, notes: list[str]) -> dict[str, list[str]]:
    """Every section; what could not be read is told in `notes`."""
    proc: Path = args.proc
    run_cgroup = args.run_cgroup.resolve() if args.run_cgroup else None
    mounts = mountinfo(proc)
    sections = {
        "mounts": mounts_section(mounts),
        "cgroups": cgroup_tree(args.cgroup_root, run_cgroup),
        "cgroup_hierarchies": cgroup_hierarchies(proc, mounts),
        "sockets": inet_listeners(proc) + unix_listeners(proc),
        "processes": processes_section(proc, run_cgroup, args.run_marker),
        "kernel_log": kernel_log_section(args.kmsg_file, notes),
        "files": files_section(args.root),
        "boot": boot_section(args.root),
    }
    return {name: sorted(items) for name, items in sections.items()}


def differences(before: dict[str, list[str]], after: dict[str, list[str]],
                only: list[str]) -> list[str]:
    """`+`/`-` lines, section by section. Items are compared as multisets: the same mount
    point stacked twice is two mounts."""
    lines = []
    for section in only or SECTIONS:
        old, new = Counter(before.get(section, [])), Counter(after.get(section, []))
        if section != "kernel_log":
            lines += [f"- {section}: {item}" for item in sorted((old - new).elements())]
        # A line gone from the kernel log is one the ring buffer overwrote, nothing the
        # run left behind: only new lines are differences there.
        lines += [f"+ {section}: {item}" for item in sorted((new - old).elements())]
    return lines


def load(path: Path) -> dict[str, list[str]]:
    data = json.loads(path.read_text())
    if data.get("hostguard") != SCHEMA:
        print(f"{path}: not a hostguard snapshot (schema {SCHEMA})", file=sys.stderr)
        raise SystemExit(2)  # 1 means "differences"
    sections: dict[str, list[str]] = data["sections"]
    return sections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prove that a test run left the host as "
                                     "it found it: snapshot, then compare.")
    commands = parser.add_subparsers(dest="command", required=True)
    snap = commands.add_parser("snapshot", help="record the host in OUT.json")
    snap.add_argument("out", type=Path)
    snap.add_argument("--root", type=Path, default=Path("/"),
                      help="prefix of /etc, /var and /run (default /)")
    snap.add_argument("--proc", type=Path, default=Path("/proc"))
    snap.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"))
    snap.add_argument("--kmsg-file", type=Path, default=Path("/dev/kmsg"),
                      help="a saved kernel log to read instead of /dev/kmsg")
    track = snap.add_mutually_exclusive_group()
    track.add_argument("--run-cgroup", type=Path,
                       help="the run's cgroup: every process in it is a leak")
    track.add_argument("--run-marker", metavar="NAME=VALUE",
                       help="every process with this in its environment is a leak")
    comp = commands.add_parser("compare", help="print the differences; exit 1 if any")
    comp.add_argument("before", type=Path)
    comp.add_argument("after", type=Path)
    comp.add_argument("--only", action="append", choices=SECTIONS, default=[],
                      help="compare this section only (repeatable)")
    args = parser.parse_args(argv)

    if args.command == "snapshot":
        notes: list[str] = []
        sections = snapshot(args, notes)
        taken = {"hostguard": SCHEMA, "taken_at": datetime.now(UTC).isoformat(),
                 "notes": notes, "sections": sections}
        args.out.write_text(json.dumps(taken, indent=1) + "\n")
        for note in notes:
            print(f"hostguard: {note}", file=sys.stderr)
        return 0
    found = differences(load(args.before), load(args.after), args.only)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
