"""A broker's logs shut down on a full disk: the checkpoints that cannot be
written are logged with the reason, the shutdown goes on instead of raising
(the node stops, it does not die with a traceback), and no clean-shutdown
marker is written, so the next start recovers the logs as after a crash.
A real tmpfs, filled to the last byte (needs root)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from broker.shell.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from chaos.nemesis import Disks
from storage.config import LogConfig

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


def test_a_shutdown_on_a_full_disk_logs_the_failed_checkpoints_and_leaves_no_clean_marker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log_dir = tmp_path / "logs"
    disks = Disks({1: log_dir}, size_mb=4)
    disks.set_up()
    try:
        manager = LogManager([str(log_dir)], lambda: 0)
        manager.get_or_create("t", 0, uuid.uuid4(), LogConfig())
        disks.fill(1)
        manager.shutdown({("t", 0): 0})  # must not raise
        assert not (log_dir / CLEAN_SHUTDOWN_FILE).exists()
        assert "No space left on device" in caplog.text and "recovered at the next start" in caplog.text
    finally:
        disks.tear_down()
