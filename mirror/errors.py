"""What the mirror's modules share: the error a user fixes in the
configuration, the backoff between retries of an unreachable cluster, and
a logger that keeps librdkafka's per-connect lines out of the output."""

from __future__ import annotations

import logging

from common.errors import RaftkaError

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0


class MirrorError(RaftkaError):
    """A flow cannot go on as configured (the message says what to change)."""


def _quiet(name: str) -> logging.Logger:
    # librdkafka logs one line per failed connect; our own message names the cluster once per retry.
    logger = logging.getLogger(f"raftka.mirror.librdkafka.{name}")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    return logger


class Backoff:
    """1 s doubling to 30 s: an unreachable cluster or a refused record is
    retried soon, without a busy loop while the fault lasts."""

    def __init__(self) -> None:
        self.delay = BACKOFF_START_S

    def reset(self) -> None:
        self.delay = BACKOFF_START_S

    def next(self) -> float:
        d = self.delay
        self.delay = min(self.delay * 2, BACKOFF_MAX_S)
        return d

