"""Logging set-up: every line carries the node id, so interleaved logs of a
local cluster stay readable."""

import logging
import sys

_FORMAT = "%(asctime)s [node %(node_id)s] %(levelname)s %(name)s: %(message)s"


class _NodeIdFilter(logging.Filter):
    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.node_id = self.node_id
        return True


def setup_logging(node_id: int | str = "-", level: int | str = logging.INFO) -> None:
    """Send log lines to stderr, each tagged with `node_id`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(_NodeIdFilter(str(node_id)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
