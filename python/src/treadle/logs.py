"""Logs people can search: key=value fields in the message, and a JSON formatter.

treadle logs through `logging` (loggers named treadle.*). A line about one job
carries its fields twice over: in the message as key=value pairs (so any formatter
shows them), and as attributes of the record, which `JsonFormatter` writes as keys
of one JSON object per line. `treadle worker --log-format json` uses it;
`configure_logging` is the same for an application's own entry point.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, Final, Literal

__all__ = ["FIELDS", "JsonFormatter", "LogFormat", "configure_logging", "logfmt"]

LogFormat = Literal["text", "json"]

# The record attributes treadle sets (logging's `extra`), in the order lines show them.
FIELDS: Final = ("job_id", "job_name", "queue", "attempt", "max_attempts", "state", "error_type", "error", "worker_id")

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def logfmt(fields: dict[str, Any]) -> str:
    """key=value pairs, values quoted when they hold a space, a quote or an equals sign."""
    return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items() if value is not None)


def _logfmt_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\\') and text.isprintable():
        return text
    return json.dumps(text)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, treadle's fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_logging(level: str | int = "INFO", log_format: LogFormat = "text") -> None:
    """Send every log record at `level` or above to standard error, as text lines or JSON lines."""
    if log_format not in ("text", "json"):
        raise ValueError(f"log_format must be 'text' or 'json', not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
