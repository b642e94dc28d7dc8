"""`raftka mirror` on bad input (no cluster needed), and `raftka bench mirror`
end to end (two clusters: only with RAFTKA_SOAK=1)."""

import json
import os

import pytest
from cluster_testing import run_cli


def test_no_clusters_given_is_a_usage_error() -> None:
    out = run_cli("mirror")
    assert out.returncode == 2
    assert "give --config FILE, or --source BOOTSTRAP and --target BOOTSTRAP" in out.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("clusters = us\n", "name at least two cluster aliases"),
    ("clusters = us, eu\nus.bootstrap.servers = h:1\n", "eu.bootstrap.servers is missing"),
    ("clusters = us, eu\nus.bootstrap.servers = h:1\neu.bootstrap.servers = h:2\n", "no flow is enabled"),
    ("clusters = us, eu\nus.bootstrap.servers = h:1\neu.bootstrap.servers = h:2\nus->eu.enabled = true\n"
     "emit.checkpoints.interval.seconds = soon\n", "emit.checkpoints.interval.seconds='soon' is not a number"),
    ("clusters = us, eu\nus.bootstrap.servers = h:1\neu.bootstrap.servers = h:2\nus->eu.enabled = true\n"
     "us.consumer.isolation.level = read_uncommitted\n",
     "us.consumer.isolation.level: the mirror sets isolation.level itself"),
])
def test_a_bad_config_names_the_key(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "mm2.properties"
    path.write_text(text)
    out = run_cli("mirror", "--config", str(path))
    assert out.returncode == 2
    assert message in out.stderr


@pytest.mark.parametrize(("setting", "named"), [
    ("source.consumer.fetch.max.bytez=1048576", "source.consumer.fetch.max.bytez"),
    ("target.producer.linger.ms=soon", "target.producer.linger.ms"),
    ("source.security.protocol=carrier_pigeon", "source.security.protocol"),
])
def test_a_client_setting_the_client_refuses_is_named(setting: str, named: str) -> None:
    # librdkafka checks its settings when the client is made, before any connection: no cluster needed
    out = run_cli("mirror", "--source", "127.0.0.1:1", "--target", "127.0.0.1:2", "--topics", "t",
                  "--set", setting, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"refused its settings ({named})" in out.stderr, out.stderr


def test_client_settings_go_to_their_clients() -> None:
    from mirror.config import simple

    flow = simple("a:1", "b:2", "t", **{"source.client.id": "mm", "source.consumer.fetch.max.bytes": "1024",
                                        "target.producer.linger.ms": "50", "target.sasl.mechanism": "PLAIN",
                                        "target.admin.request.timeout.ms": "9000"})[0]
    assert flow.source_client("consumer") == {"client.id": "mm", "fetch.max.bytes": "1024"}
    assert flow.source_client("producer") == {"client.id": "mm"}
    assert flow.target_client("producer") == {"linger.ms": "50", "sasl.mechanism": "PLAIN"}
    assert flow.target_client("admin") == {"request.timeout.ms": "9000", "sasl.mechanism": "PLAIN"}


@pytest.mark.soak
@pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="two clusters and four phases: RAFTKA_SOAK=1")
def test_bench_mirror_writes_its_rows(tmp_path) -> None:
    out = run_cli("bench", "mirror", "--count", "5000", "--seconds", "2", "--rate", "500", "--results",
                  str(tmp_path / "results"), "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["metric"]: r["value"] for r in map(json.loads, out.stdout.splitlines())}
    assert rows["mirror_records_per_s"] > 0 and rows["consume_records_per_s"] > 0
    assert 0 < rows["mirror_lag_p50_ms"] <= rows["mirror_lag_p99_ms"]
