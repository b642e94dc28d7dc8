"""Log levels from the config, changed at runtime through the BROKER_LOGGER resource, JSON lines.

A real `raftka dev` node started with `log.format=json` and a level per
logger; kafka-python's admin client describes the levels
(DescribeConfigs on BROKER_LOGGER) and changes one (IncrementalAlterConfigs),
and the node's log shows the change: DEBUG lines of that logger appear
once it is set to DEBUG. Refusals use Kafka's error codes.
"""

import json
import time

from kafka import KafkaAdminClient
from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType, NewTopic

from cluster_group_testing import DevNode

NODE = "1"


def lines(node: DevNode) -> list[dict]:
    return [json.loads(line) for line in node.log_path.read_text().splitlines() if line.startswith("{")]


def levels(admin: KafkaAdminClient) -> dict[str, str]:
    described = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER_LOGGER, NODE)], config_filter="all")
    (by_name,) = described.values()
    return {name: entry["value"] if isinstance(entry, dict) else entry for name, entry in by_name[NODE].items()}


def alter(admin: KafkaAdminClient, configs: dict, validate_only: bool = False):
    return admin.alter_configs([ConfigResource(ConfigResourceType.BROKER_LOGGER, NODE, configs=configs)],
                               validate_only=validate_only, incremental=True, raise_on_unknown=False)


def test_logger_levels_from_the_config_and_changed_at_runtime(tmp_path):
    node = DevNode(tmp_path / "dev", "log.format=json", "log.level=INFO", "log.level.quorum=WARN")
    try:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
        before = levels(admin)
        assert before["root"] == "INFO"
        assert before["quorum.node.controller"] == "WARN"  # inherited from log.level.quorum
        assert before["broker.replica_manager"] == "INFO"
        # Every line is one JSON object naming the node.
        logged = lines(node)
        assert logged and all(line["node"] == NODE for line in logged)
        assert not [line for line in logged if line["logger"].startswith("quorum") and line["level"] == "INFO"]

        alter(admin, {"broker.replica_manager": (AlterConfigOp.SET, "DEBUG")})
        assert levels(admin)["broker.replica_manager"] == "DEBUG"
        admin.create_topics([NewTopic("debugged", 2, 1)])
        deadline = time.monotonic() + 30
        while not [line for line in lines(node) if line["logger"] == "broker.replica_manager"
                   and line["level"] == "DEBUG" and "debugged" in line["message"]]:
            assert time.monotonic() < deadline, "no DEBUG line of broker.replica_manager after the change"
            time.sleep(0.2)

        alter(admin, {"broker.replica_manager": (AlterConfigOp.DELETE, None)})
        assert levels(admin)["broker.replica_manager"] == "INFO"  # the root's again
        admin.close()
    finally:
        node.stop()


def test_broker_logger_refusals_name_the_problem(tmp_path):
    node = DevNode(tmp_path / "dev")
    try:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
        for configs, error in (({"broker": (AlterConfigOp.SET, "LOUD")}, "InvalidConfig"),
                               ({"no.such.logger": (AlterConfigOp.SET, "DEBUG")}, "InvalidConfig"),
                               ({"root": (AlterConfigOp.DELETE, None)}, "InvalidRequest"),
                               ({"broker": (AlterConfigOp.APPEND, "DEBUG")}, "InvalidRequest")):
            answer = repr(_outcome(lambda: alter(admin, configs)))
            assert error in answer, (configs, answer)
        # validate_only checks without changing anything.
        alter(admin, {"broker": (AlterConfigOp.SET, "ERROR")}, validate_only=True)
        assert levels(admin)["broker"] == "INFO"
        admin.close()
    finally:
        node.stop()


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # the client raises the broker's error for some versions
        return exc
