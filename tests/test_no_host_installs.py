"""No test installs or removes a package on the machine running the tests (issue 28:
tests/test_package.py ran `dpkg -i` on the host, and a Ctrl-C before its `dpkg --purge`
left gpuguard installed there). Packages are installed only inside the Debian container
of tests/systemd_pid1/, which is removed at the end of its module whatever happens."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

# A package tool called with an install or remove action, as a test writes it: in an
# argument list ("dpkg", "-i", ...) or a shell line (dpkg -i ...).
INSTALLS = re.compile(r"""\b(?:dpkg|rpm|apt-get|apt|yum|dnf)["']?\s*,?\s*["']?"""
                      r"""(?:-i|--install|-r|--remove|-P|--purge|install|remove|purge|-U|-e)\b""")
# Where it may happen: in the container, through Machine.run/ok (docker exec).
CONTAINER = REPO / "tests" / "systemd_pid1"


def installs_in(source: str) -> list[int]:
    return [n for n, line in enumerate(source.splitlines(), 1)
            if INSTALLS.search(line) and not line.lstrip().startswith("#")]


def test_no_test_outside_the_container_installs_a_package():
    found = [f"{path.relative_to(REPO)}:{n}"
             for path in sorted((REPO / "tests").rglob("*.py"))
             if CONTAINER not in path.parents and path != Path(__file__)
             for n in installs_in(path.read_text())]
    assert found == []


def test_an_install_on_the_host_is_caught():
    assert installs_in('installed = run("dpkg", "-i", str(debs[-1]), env=env)\n') == [1]
    assert installs_in('removed = run("dpkg", "--purge", "gpuguard")\n') == [1]
    assert installs_in("subprocess.run(['apt-get', 'install', '-y', 'x'])\n") == [1]
    assert installs_in('listing = run("dpkg-deb", "--contents", deb)\n'
                       'run("dpkg", "-s", "gpuguard")\n') == []
