"""Cluster tests reuse the client workload helpers of tests/broker (broker_testing)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "broker"))
