"""How `raftka` sub-commands report a failed start: one line naming the cause."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable

from common.errors import RaftkaError


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or `exc` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def explain(exc: BaseException) -> str | None:
    """A one-line reason for errors a user can fix (config, ports, files); None for bugs."""
    if isinstance(exc, RaftkaError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"{exc.strerror}: another process listens on that port; stop it or pick other ports"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return None


def run_reporting(prog: str, fn: Callable[[], object]) -> int:
    """Run `fn`; a failure a user can fix prints `prog: reason` and returns 2."""
    try:
        fn()
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: BLE001 -- re-raised unless every leaf is explained
        reasons = [explain(leaf) for leaf in leaves(exc)]
        if not reasons or any(r is None for r in reasons):
            raise
        for reason in dict.fromkeys(reasons):
            print(f"{prog}: {reason}", file=sys.stderr)
        return 2
    return 0
