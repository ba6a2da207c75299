"""Text from outside (a server's answer, a kernel-log line, an ack's reason) made safe to
print: every character that does not print escaped, so a NUL byte cannot cut a message
and an escape sequence cannot rewrite an operator's terminal."""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with every character that does not print escaped (\\x00, \\n, \\x1b)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
