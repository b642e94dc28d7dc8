"""Logging set-up: every line carries the node id, so interleaved logs of a
local cluster stay readable.

A node's properties set the levels and the format (`configure_logging`):

- `log.level`: the root logger's level (default INFO);
- `log.level.<logger>`: one logger's (and its children's) level, e.g.
  `log.level.broker.replica_fetcher=DEBUG`; loggers are named after
  raftka's packages (`broker`, `quorum`, `common`, ...);
- `log.format`: `text` (default) or `json` (one JSON object a line, with
  `time`, `node`, `level`, `logger`, `message` and, for an exception,
  `exception`).

Levels take log4j's names, as Kafka's loggers do (TRACE, DEBUG, INFO, WARN,
ERROR, FATAL, OFF), and Python's (WARNING, CRITICAL). `set_logger_level`
and `logger_levels` change and show them at runtime (the BROKER_LOGGER
config resource, `broker.api.broker_logger`).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping

from common.errors import ConfigError

_FORMAT = "%(asctime)s [node %(node_id)s] %(levelname)s %(name)s: %(message)s"
#: Kafka's (log4j's) name of the root logger.
ROOT_LOGGER = "root"
#: Below DEBUG: log4j's TRACE.
TRACE = 5
#: Above CRITICAL: log4j's OFF.
OFF = logging.CRITICAL + 10
_LEVELS = {"TRACE": TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL,
           "CRITICAL": logging.CRITICAL, "OFF": OFF}
_NAMES = {TRACE: "TRACE", logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARN",
          logging.ERROR: "ERROR", logging.CRITICAL: "FATAL", OFF: "OFF"}
logging.addLevelName(TRACE, "TRACE")
logging.addLevelName(OFF, "OFF")
LEVEL_CHOICES = "TRACE, DEBUG, INFO, WARN, ERROR, FATAL or OFF"
_PREFIX = "log.level."


class _NodeIdFilter(logging.Filter):
    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.node_id = self.node_id
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: for log shippers (`log.format=json`)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record), "node": getattr(record, "node_id", "-"),
                "level": _NAMES.get(record.levelno, record.levelname), "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def parse_level(value: str, key: str) -> int:
    """A level name as a number; a ConfigError names the key and the choices."""
    level = _LEVELS.get(value.strip().upper())
    if level is None:
        raise ConfigError(f"{key}={value}: not a log level; use {LEVEL_CHOICES}")
    return level


def level_name(level: int) -> str:
    return _NAMES.get(level, logging.getLevelName(level))


def setup_logging(node_id: int | str = "-", level: int | str = logging.INFO, *,
                  props: Mapping[str, str] | None = None) -> None:
    """Send log lines to stderr, each tagged with `node_id`; with `props`,
    levels and format as `configure_logging` reads them."""
    props = props or {}
    log_format = props.get("log.format", "text").strip().lower()
    if log_format not in ("text", "json"):
        raise ConfigError(f"log.format={props['log.format']}: use text or json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_FORMAT))
    handler.addFilter(_NodeIdFilter(str(node_id)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(parse_level(props["log.level"], "log.level") if "log.level" in props else level)
    for key, value in props.items():
        if key.startswith(_PREFIX) and len(key) > len(_PREFIX):
            logging.getLogger(key[len(_PREFIX):]).setLevel(parse_level(value, key))


def logger_levels() -> dict[str, str]:
    """Every logger this process made (and `root`) -> its effective level, log4j-named."""
    levels = {ROOT_LOGGER: level_name(logging.getLogger().level)}
    for name in sorted(logging.Logger.manager.loggerDict):
        levels[name] = level_name(logging.getLogger(name).getEffectiveLevel())
    return levels


def logger_exists(name: str) -> bool:
    return name == ROOT_LOGGER or name in logging.Logger.manager.loggerDict


def set_logger_level(name: str, level: int | None) -> None:
    """Set a logger's level; None: inherit its parent's again (the root keeps one)."""
    logger = logging.getLogger() if name == ROOT_LOGGER else logging.getLogger(name)
    logger.setLevel(logging.NOTSET if level is None else level)
