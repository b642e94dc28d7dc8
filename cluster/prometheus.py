"""A real Prometheus server scraping every node of a `LocalCluster`.

`PrometheusServer(data_dir, cluster, port=9090)` writes `prometheus.yml`
(one job, `raftka`, one target per node that serves metrics, labelled with
its `node_id` and `role`) and runs the `prometheus` binary of the Debian
package on it, its data under `data_dir/data`, until `stop` (or the end
of a `with` block). `url` is its web UI and API.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from common.errors import RaftkaError


class PrometheusError(RaftkaError):
    """Prometheus is not installed or did not start; the message says which and what to do."""


def prometheus_missing_reason() -> str | None:
    if shutil.which("prometheus") is None:
        return "the `prometheus` command is not installed (Debian: apt-get install prometheus)"
    return None


def scrape_config(cluster, scrape_interval_s: float) -> str:
    lines = ["global:", f"  scrape_interval: {scrape_interval_s:g}s", f"  evaluation_interval: {scrape_interval_s:g}s",
             "scrape_configs:", "  - job_name: raftka", "    static_configs:"]
    for node in cluster.nodes.values():
        if node.metrics_port is None:
            continue
        lines += [f"      - targets: ['{node.host}:{node.metrics_port}']",
                  f"        labels: {{node_id: '{node.node_id}', role: '{node.role}'}}"]
    return "\n".join(lines) + "\n"


class PrometheusServer:
    def __init__(self, data_dir: str | Path, cluster, *, host: str = "127.0.0.1", port: int = 9090,
                 scrape_interval_s: float = 5.0) -> None:
        reason = prometheus_missing_reason()
        if reason is not None:
            raise PrometheusError(f"cannot start Prometheus: {reason}")
        if not any(n.metrics_port is not None for n in cluster.nodes.values()):
            raise PrometheusError("the cluster's nodes serve no metrics: make the LocalCluster with metrics=True")
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.host, self.port = host, port
        self.config_path = self.data_dir / "prometheus.yml"
        self.config_path.write_text(scrape_config(cluster, scrape_interval_s))
        self.output_path = self.data_dir / "prometheus.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        with open(self.output_path, "ab") as out:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={self.config_path}", f"--storage.tsdb.path={self.data_dir / 'data'}",
                 f"--web.listen-address={self.host}:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited with code {self.process.returncode}; see "
                                      f"{self.output_path} (is port {self.port} taken? choose another)")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusError(f"prometheus did not get ready in {timeout_s:.0f} s; see {self.output_path}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
