"""`raftka dump-log FILE...`: what a segment, offset index or time index holds, like Kafka's `kafka-dump-log`.

    raftka dump-log --files FILE[,FILE] [--print-data-log] [--deep-iteration]
    raftka dump-log FILE [FILE ...] [-p] [-d]

A `.log` segment prints one line per record batch (offsets, count,
producer, transactional and control flags, position, timestamps, size,
codec, CRC); with --deep-iteration also each record's offset, timestamp
and sizes, and with --print-data-log its key and value (also with
--deep-iteration implied). A segment of the metadata log
(`__cluster_metadata-0`) is decoded with --print-data-log: each record
printed as the metadata record it is (TopicRecord, ConfigRecord, ...).
`.index` prints `offset: O position: P` per entry, `.timeindex`
`timestamp: T offset: O`. Reads the files only; safe on a running node.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dump-log", help="print the batches and records of segments and indexes (like kafka-dump-log)",
                       description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="FILE")
    p.add_argument("--files", default="", metavar="FILE[,FILE]", help="kafka-dump-log's way to name the files")
    p.add_argument("--print-data-log", "-p", action="store_true", help="print record keys and values")
    p.add_argument("--deep-iteration", "-d", action="store_true", help="print every record, not only batches")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    paths = list(args.paths) + [f for f in args.files.split(",") if f.strip()]
    if not paths:
        print("raftka dump-log: name at least one .log, .index or .timeindex file", file=sys.stderr)
        return 2
    for path in paths:
        print(f"Dumping {path}")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            print(f"raftka dump-log: cannot read {path}: {exc.strerror}", file=sys.stderr)
            return 2
        base_offset = _base_offset(path)
        if path.endswith(".index"):
            _dump_index(data, base_offset)
        elif path.endswith(".timeindex"):
            _dump_time_index(data, base_offset)
        elif path.endswith(".log"):
            metadata = os.path.basename(os.path.dirname(os.path.abspath(path))) == "__cluster_metadata-0"
            _dump_segment(data, args.deep_iteration or args.print_data_log, args.print_data_log, metadata)
        else:
            print(f"raftka dump-log: {path}: not a .log, .index or .timeindex file", file=sys.stderr)
            return 2
    return 0


def _base_offset(path: str) -> int:
    stem = os.path.basename(path).split(".")[0].split("-")[0]
    return int(stem) if stem.isdigit() else 0


def _dump_index(data: bytes, base_offset: int) -> None:
    for pos in range(0, len(data) - 7, 8):
        relative, position = struct.unpack_from(">ii", data, pos)
        if relative == 0 and position == 0 and pos > 0:
            break  # the preallocated, unused tail
        print(f"offset: {base_offset + relative} position: {position}")


def _dump_time_index(data: bytes, base_offset: int) -> None:
    for pos in range(0, len(data) - 11, 12):
        timestamp, relative = struct.unpack_from(">qi", data, pos)
        if timestamp == 0 and relative == 0 and pos > 0:
            break
        print(f"timestamp: {timestamp} offset: {base_offset + relative}")


_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def _dump_segment(data: bytes, deep: bool, print_data: bool, metadata: bool) -> None:
    from storage.batch import iter_batch_headers, iter_records, parse_control_key
    from storage.errors import StorageError

    print(f"Log starting offset: {_first_offset(data)}")
    try:
        for position, h in iter_batch_headers(data):
            print(f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
                  f"baseSequence: {h.base_sequence} lastSequence: "
                  f"{h.base_sequence + h.last_offset_delta if h.base_sequence >= 0 else -1} "
                  f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
                  f"partitionLeaderEpoch: {h.partition_leader_epoch} isTransactional: "
                  f"{str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} position: {position} "
                  f"{'LogAppendTime' if h.timestamp_type else 'CreateTime'}: {h.max_timestamp} "
                  f"size: {h.size_in_bytes} magic: {h.magic} compresscodec: {_CODECS.get(h.compression, h.compression)} "
                  f"crc: {h.crc & 0xFFFFFFFF} isvalid: true")
            if not deep:
                continue
            for r in iter_records(data, position):
                line = (f"| offset: {r.offset} {'CreateTime' if not h.timestamp_type else 'LogAppendTime'}: "
                        f"{r.timestamp} keySize: {-1 if r.key is None else len(r.key)} "
                        f"valueSize: {-1 if r.value is None else len(r.value)} "
                        f"sequence: {h.base_sequence + r.offset - h.base_offset if h.base_sequence >= 0 else -1} "
                        f"headerKeys: [{','.join(k for k, _ in r.headers)}]")
                if print_data:
                    line += " " + _payload(r, h.is_control, metadata, parse_control_key)
                print(line)
    except StorageError as exc:
        print(f"raftka dump-log: stopped at a batch that does not parse: {exc}", file=sys.stderr)


def _first_offset(data: bytes) -> int:
    return struct.unpack_from(">q", data, 0)[0] if len(data) >= 8 else 0


def _payload(r, control: bool, metadata: bool, parse_control_key) -> str:
    if control and r.key is not None:
        try:
            _version, kind = parse_control_key(r.key)
            names = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER", 4: "SNAPSHOT_FOOTER",
                     5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}
            line = f"controlType: {names.get(kind, kind)}"
            if kind in (5, 6) and r.value is not None:  # KIP-853: the kraft.version and the voter set
                from quorum.node.voter_config import format_directory_id
                from quorum.raft.voters import decode_kraft_version_record, decode_voters_record

                if kind == 5:
                    return line + f" kraftVersion: {decode_kraft_version_record(bytes(r.value))}"
                voters = ", ".join(
                    f"{v.node_id}@{':'.join(str(x) for x in v.address) if v.address else '?'}"
                    + (f"/{format_directory_id(v.directory_id)}" if v.directory_id else "")
                    for v in decode_voters_record(bytes(r.value)))
                return line + f" voters: [{voters}]"
            return line
        except Exception:  # an unknown control record: show it raw
            return f"key: {r.key!r}"
    if metadata and r.value is not None:
        from common.errors import RaftkaError
        from quorum.metadata.records import decode_record

        try:
            return f"payload: {decode_record(r.value)!r}"
        except RaftkaError as exc:
            return f"payload: (not a metadata record: {exc})"
    key = "null" if r.key is None else r.key.decode("utf-8", "backslashreplace")
    value = "null" if r.value is None else r.value.decode("utf-8", "backslashreplace")
    return f"key: {key} payload: {value}"
