"""Mirror tests reuse the process helpers of tests/cluster (cluster_testing)."""

import sys
from pathlib import Path

for sub in ("cluster", "broker"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / sub))
