"""structlog set up once: JSON lines for journald (not a TTY), a console view on a TTY."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(log_format: str = "auto", level: str = "info") -> None:
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,  # the cycle id bound per cycle
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if log_format == "json":
        # The traceback becomes a string field; the JSON renderer escapes its newlines,
        # so an exception is still one line (one journald entry, one event).
        processors += [structlog.processors.format_exc_info,
                       structlog.processors.JSONRenderer()]
    else:
        # A person at a terminal: the console renderer prints the traceback itself
        # (structlog asks not to combine it with format_exc_info).
        processors.append(structlog.dev.ConsoleRenderer())
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
