"""Security tests start real nodes with the `raftka` CLI (tests/cluster's helpers)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "broker"))
