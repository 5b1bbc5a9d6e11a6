"""Structured JSON logs (structlog) for every process of the bot side, stdlib loggers (uvicorn's access log,
Celery) included. Context bound with `bind(...)` (delivery id, repo, PR, eval id) rides on every line."""
from __future__ import annotations

import logging
import sys

import structlog
from structlog.contextvars import bind_contextvars, bound_contextvars, clear_contextvars  # noqa: F401

_configured: list[bool] = []

SHARED = [structlog.contextvars.merge_contextvars, structlog.stdlib.add_log_level,
          structlog.stdlib.add_logger_name, structlog.processors.TimeStamper(fmt="iso", utc=True)]


def configure(level: str = "INFO") -> None:
    """JSON lines on stderr for structlog and stdlib loggers alike (idempotent)."""
    if _configured:
        return
    structlog.configure(processors=[*SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
                        logger_factory=structlog.stdlib.LoggerFactory(), cache_logger_on_first_use=True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.ExtraAdder(), *SHARED],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "celery"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    _configured.append(True)


def get(name: str):
    return structlog.get_logger(name)
