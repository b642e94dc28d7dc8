"""`raftka metadata-shell`: browse a metadata snapshot or log as a tree, like Kafka's `kafka-metadata-shell`.

    raftka metadata-shell --directory DIR [COMMAND [ARG ...]]
    raftka metadata-shell --snapshot FILE.checkpoint [COMMAND [ARG ...]]

DIR is a `__cluster_metadata-0` directory, a log dir holding one, or a
`raftka dev` data dir. The image is rebuilt the way a node does it: the
newest `.checkpoint` snapshot, then every whole batch of the log after it
(also records not yet committed: the tail of a running leader's log).
Reads the files only; safe on a running node.

With a COMMAND it runs that one command and exits (for scripts); without,
it reads commands from a prompt. Commands:

    ls [PATH]      the children of a directory (a file: its name)
    cd [PATH]      change directory (no PATH: /)
    pwd            the current directory
    cat PATH...    the contents of files
    find [PATH]    every path under PATH
    tree [PATH]    PATH and everything under it, with the files' contents
    help, exit

The tree: /brokers/<id>/{registration,isFenced,inControlledShutdown},
/topics/<name>/{id,<partition>}, /topicIds/<id>, /configs/<TYPE>/<name>/<key>,
/clientQuotas/<entity>/<key>, /acls/<id>, /producerIds/nextProducerId,
/local/{source,offset,epoch}.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from common.errors import RaftkaError

_METADATA_DIR = "__cluster_metadata-0"


class ShellError(RaftkaError):
    """The source cannot be read, or a command cannot be done; the message says why and what to name instead."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("metadata-shell", help="browse a metadata snapshot or log as a tree (like kafka-metadata-shell)",
                       description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--directory", "-d", metavar="DIR", help="a metadata log directory (or a dir holding one)")
    source.add_argument("--snapshot", "-s", metavar="FILE", help="a metadata snapshot (.checkpoint) file")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="run this one command and exit (default: an interactive prompt)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        if args.snapshot is not None:
            image, source = _load_snapshot(args.snapshot), args.snapshot
        else:
            source = _find_metadata_dir(args.directory)
            image = _load_directory(source)
    except ShellError as exc:
        print(f"raftka metadata-shell: {exc}", file=sys.stderr)
        return 2
    shell = Shell(build_tree(image, source))
    if args.command:
        return shell.run(args.command)
    return shell.interact()


# --- loading: the node's own snapshot decoding and replay -------------------


def _load_snapshot(path: str):
    return _snapshot_state(path).image


def _snapshot_state(path: str):
    """The node's applied state right after loading the snapshot at `path`."""
    from quorum.node.applier import MetadataState

    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as exc:
        raise ShellError(f"cannot read {path}: {exc.strerror}") from None
    try:
        state, _ = MetadataState().load_snapshot(blob)
    except RaftkaError as exc:
        raise ShellError(f"{path} is not a raftka metadata snapshot (.checkpoint): {exc}") from None
    return state


def _find_metadata_dir(directory: str) -> str:
    if not os.path.isdir(directory):
        raise ShellError(f"no such directory: {directory}")
    for candidate in (directory, os.path.join(directory, _METADATA_DIR),
                      os.path.join(directory, "data", _METADATA_DIR)):
        if os.path.isdir(candidate) and any(n.endswith((".log", ".checkpoint")) for n in os.listdir(candidate)
                                            if n[:1].isdigit()):
            return candidate
    raise ShellError(f"{directory} holds no metadata log: name a {_METADATA_DIR} directory "
                     f"(with .log segments or .checkpoint snapshots), or a log dir that contains one")


def _load_directory(directory: str):
    from quorum.node.applier import MetadataState
    from storage.batch import iter_batch_headers

    names = sorted(os.listdir(directory))
    snapshots = [n for n in names if n.endswith(".checkpoint") and n[:1].isdigit()]
    segments = sorted((n for n in names if n.endswith(".log") and n[:1].isdigit()), key=lambda n: int(n.split(".")[0]))
    # Names are zero-padded end offsets, so the last one sorted is the newest.
    state = _snapshot_state(os.path.join(directory, snapshots[-1])) if snapshots else MetadataState()
    try:
        for name in segments:
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            # Whole batches only (a running node may be mid-append), from the
            # first one that holds records the snapshot does not cover.
            start = end = None
            for pos, header in iter_batch_headers(data):
                if header.last_offset < state.next_offset:
                    continue
                if start is None:
                    if header.base_offset > state.next_offset:
                        raise ShellError(f"{name} starts at offset {header.base_offset} but the records from "
                                         f"{state.next_offset} are in no snapshot or segment: the log has a gap")
                    start = pos
                end = pos + header.size_in_bytes
            if start is not None:
                state, _ = state.apply(data[start:end])
    except ShellError:
        raise
    except RaftkaError as exc:
        raise ShellError(f"{directory} is not a readable metadata log: {exc}") from None
    return state.image


# --- the tree -----------------------------------------------------------------


def build_tree(image, source: str) -> dict:
    """Directories are dicts, files are strings."""
    brokers = {}
    for broker_id, b in sorted(image.brokers.items()):
        endpoints = ", ".join(f"{e.name}://{e.host}:{e.port}" for e in b.endpoints)
        brokers[str(broker_id)] = {
            "registration": (f"RegisterBrokerRecord(brokerId={b.broker_id}, brokerEpoch={b.epoch}, "
                             f"incarnationId={b.incarnation_id}, endpoints=[{endpoints}], rack={b.rack}, "
                             f"fenced={str(b.fenced).lower()}, "
                             f"inControlledShutdown={str(b.in_controlled_shutdown).lower()})"),
            "isFenced": str(b.fenced).lower(),
            "inControlledShutdown": str(b.in_controlled_shutdown).lower(),
        }
        if b.offline_log_dirs:
            # The log dirs its heartbeats report offline (KIP-858).
            brokers[str(broker_id)]["offlineLogDirs"] = ", ".join(sorted(str(d) for d in b.offline_log_dirs))
    topics, topic_ids = {}, {}
    for name in sorted(image.topic_ids_by_name):
        t = image.topic(name)
        node = {"id": str(t.topic_id)}
        for index, p in sorted(t.partitions.items()):
            # Each replica's log dir once one is assigned (KIP-858), as Kafka's shell shows them.
            directories = f"directories=[{', '.join(str(d) for d in p.directories)}], " if p.directories else ""
            node[str(index)] = (f"PartitionRegistration(replicas={list(p.replicas)}, {directories}"
                                f"isr={list(p.isr)}, "
                                f"removingReplicas={list(p.removing_replicas)}, "
                                f"addingReplicas={list(p.adding_replicas)}, leader={p.leader}, "
                                f"leaderEpoch={p.leader_epoch}, partitionEpoch={p.partition_epoch})")
        topics[name] = node
        topic_ids[str(t.topic_id)] = name
    configs: dict = {}
    for resource, values in sorted(image.configs.items(), key=lambda kv: (kv[0].type, kv[0].name)):
        # An empty name is the cluster-wide default (a broker config set for every broker).
        configs.setdefault(resource.type.name, {})[resource.name or "<default>"] = dict(sorted(values.items()))
    quotas = {}
    for entity, values in image.client_quotas.items():
        key = ",".join(f"{kind}={'<default>' if name is None else name}" for kind, name in entity)
        quotas[key] = {k: repr(v) if not isinstance(v, str) else v for k, v in sorted(values.items())}
    acls = {}
    for acl_id, a in image.acls.items():
        acls[str(acl_id)] = (f"AclBinding(resourceType={a.resource_type.name}, name={a.resource_name}, "
                             f"patternType={a.pattern_type.name}, principal={a.principal}, host={a.host}, "
                             f"operation={a.operation.name}, permission={a.permission.name})")
    return {
        "brokers": brokers,
        "topics": topics,
        "topicIds": topic_ids,
        "configs": configs,
        "clientQuotas": dict(sorted(quotas.items())),
        "acls": dict(sorted(acls.items())),
        "producerIds": {"nextProducerId": str(image.next_producer_id)},
        "local": {"source": source, "offset": str(image.offset), "epoch": str(image.epoch)},
    }


class Shell:
    def __init__(self, root: dict) -> None:
        self.root = root
        self.cwd: list[str] = []

    # --- paths -------------------------------------------------------------

    def _parts(self, path: str) -> list[str]:
        parts = [] if path.startswith("/") else list(self.cwd)
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if parts:
                    parts.pop()
            else:
                parts.append(part)
        return parts

    def _node(self, parts: list[str]):
        node = self.root
        for i, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                raise ShellError(f"{_show(parts[:i + 1])}: no such file or directory")
            node = node[part]
        return node

    # --- commands ----------------------------------------------------------

    def run(self, argv: list[str]) -> int:
        """Run one command; 0 if it worked, 1 if it printed an error."""
        if not argv:
            return 0
        name, args = argv[0], argv[1:]
        handler = getattr(self, f"cmd_{name}", None)
        try:
            if handler is None:
                raise ShellError(f"unknown command {name!r}: try help")
            handler(args)
        except ShellError as exc:
            print(f"{name}: {exc}" if handler is not None else str(exc), file=sys.stderr)
            return 1
        return 0

    def cmd_ls(self, args: list[str]) -> None:
        for i, path in enumerate(args or ["."]):
            parts = self._parts(path)
            node = self._node(parts)
            if not isinstance(node, dict):
                print(parts[-1])
                continue
            if len(args) > 1:
                print(f"{'' if i == 0 else chr(10)}{_show(parts)}:")
            for child in node:
                print(child)

    def cmd_cd(self, args: list[str]) -> None:
        parts = self._parts(args[0] if args else "/")
        if not isinstance(self._node(parts), dict):
            raise ShellError(f"{_show(parts)}: not a directory")
        self.cwd = parts

    def cmd_pwd(self, args: list[str]) -> None:
        print(_show(self.cwd))

    def cmd_cat(self, args: list[str]) -> None:
        if not args:
            raise ShellError("name a file: cat PATH")
        for path in args:
            parts = self._parts(path)
            node = self._node(parts)
            if isinstance(node, dict):
                raise ShellError(f"{_show(parts)}: is a directory (ls or tree it)")
            print(node)

    def cmd_find(self, args: list[str]) -> None:
        for path in args or ["."]:
            parts = self._parts(path)
            self._walk(parts, self._node(parts), 0, lambda p, n, depth: print(_show(p)))

    def cmd_tree(self, args: list[str]) -> None:
        for path in args or ["."]:
            parts = self._parts(path)
            self._walk(parts, self._node(parts), 0, lambda p, n, depth: print(
                "  " * depth + (p[-1] if p else "/") + ("" if isinstance(n, dict) else f": {n}")))

    def _walk(self, parts, node, depth: int, visit) -> None:
        visit(parts, node, depth)
        if isinstance(node, dict):
            for child, sub in node.items():
                self._walk(parts + [child], sub, depth + 1, visit)

    def cmd_help(self, args: list[str]) -> None:
        print(__doc__.split("Commands:\n\n", 1)[1].split("\n\nThe tree", 1)[0])

    def cmd_exit(self, args: list[str]) -> None:
        pass  # the prompt ends on exit; as a single command there is nothing to end

    def interact(self) -> int:
        try:
            import readline  # noqa: F401 -- line editing and history for input()
        except ImportError:
            pass
        while True:
            try:
                line = input(f"[{_show(self.cwd)}] ")
            except EOFError:
                print()
                return 0
            try:
                argv = shlex.split(line)
            except ValueError as exc:
                print(f"cannot parse the line: {exc}", file=sys.stderr)
                continue
            if argv and argv[0] in ("exit", "quit"):
                return 0
            self.run(argv)


def _show(parts: list[str]) -> str:
    return "/" + "/".join(parts)
