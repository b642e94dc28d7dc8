"""`raftka features upgrade --bootstrap-controller HOST:PORT --feature kraft.version=1`, as `kafka-features` does.

Sends UpdateFeatures (API 57) to the controller quorum's leader. The one
feature raftka's controllers change is `kraft.version`: to 1, a static
quorum (`controller.quorum.voters`) becomes dynamic (KIP-853): the leader
writes the configured voters into the metadata log as a VotersRecord, and
from then on `raftka quorum add-controller` and `remove-controller` change
them. The other features' levels are fixed (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import datetime
import sys

import trio

from common.errors import RaftkaError
from common.wire.errors import ConnectionFailedError
from raftka.controller_admin_cli import ask_leader, command_group, parse_host_port


def register(sub: argparse._SubParsersAction) -> None:
    command = command_group(sub, "features", "upgrade kraft.version (like kafka-features)", __doc__)
    upgrade = command("upgrade", "raise a feature's finalized level (kraft.version=1)", upgrade_features,
                      timeout_ms=30000)
    upgrade.add_argument("--feature", required=True, action="append", metavar="NAME=LEVEL",
                         help="kraft.version=1 (a static quorum becomes dynamic)")
    upgrade.add_argument("--dry-run", action="store_true", help="check the upgrade without making it")


def upgrade_features(args: argparse.Namespace) -> int:
    from kio.schema.update_features.v1.request import (
        FeatureUpdateKey,
        UpdateFeaturesRequest,
    )
    from kio.static.primitive import i8, i16, i32Timedelta

    try:
        updates = []
        for item in args.feature:
            name, sep, level = item.partition("=")
            if not sep or not level.strip().isdigit():
                raise RaftkaError(f"--feature {item!r} is not NAME=LEVEL (e.g. kraft.version=1)")
            updates.append(FeatureUpdateKey(feature=name.strip(), max_version_level=i16(int(level)),
                                            upgrade_type=i8(1)))
        host, port = parse_host_port(args.bootstrap_controller)
        request = UpdateFeaturesRequest(timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=args.timeout_ms)),
                                        feature_updates=tuple(updates), validate_only=args.dry_run)
        response = trio.run(ask_leader, host, port, request, args.timeout_ms)
    except (RaftkaError, ConnectionFailedError, OSError) as exc:
        print(f"raftka features upgrade: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in response.results if int(r.error_code) != 0]
    if int(response.error_code) != 0 or failed:
        for r in failed or response.results:
            print(f"raftka features upgrade: {r.feature}: error {int(r.error_code)}: {r.error_message}",
                  file=sys.stderr)
        return 1
    for r in response.results:
        print(f"{r.feature} was upgraded{' (dry run: nothing changed)' if args.dry_run else ''}.")
    return 0
