"""`raftka bench produce|consume --security-protocol`: the same load over a TLS
listener beside PLAINTEXT in one run, with the broker CPU per GB of each.
A soak (RAFTKA_SOAK=1): two clusters, 1-2 minutes on the 2-core VM."""

import os

import pytest

from scenarios_testing import by_metric, json_rows, run_bench

pytestmark = pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="a soak: set RAFTKA_SOAK=1")


@pytest.mark.parametrize("scenario, protocol, extra", [
    ("produce", "SASL_SSL", ["--duration", "2", "--rounds", "1", "--no-ceiling", "--no-floor"]),
    ("consume", "SSL", ["--count", "20000", "--no-floor"]),
])
def test_security_protocol_measures_tls_beside_plaintext(tmp_path, scenario, protocol, extra):
    out = run_bench(scenario, "--security-protocol", protocol, *extra, "--results", str(tmp_path / "results"),
                    "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = by_metric(json_rows(out.stdout))
    assert rows["plaintext_broker_cpu_s_per_gb"]["value"] > 0 and rows["secure_broker_cpu_s_per_gb"]["value"] > 0
    assert rows["secure_cpu_ratio"]["value"] > 0 and rows["secure_mb_per_s"]["value"] > 0
    assert f"{protocol} / PLAINTEXT: broker CPU per GB" in out.stderr
