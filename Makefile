# `make demo` and `make test` work on a fresh machine: they build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: sysdeps setup demo test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# ZooKeeper mode (quorum/zookeeper/) runs the Debian `zookeeper` package; the
# Spark report needs a Java runtime. Both are installed only when missing.
sysdeps:
	command -v java >/dev/null || (apt-get update && apt-get install -y default-jre-headless)
	test -f /usr/share/java/zookeeper.jar || (apt-get update && apt-get install -y zookeeper)

setup: sysdeps $(STAMP)

# A local 3+3 cluster; 1M records produced and consumed; stopped cleanly (bench/demo.py);
# its throughput rows go to bench/results/ (ignored by git), and the demo ends with
# `raftka report` of that dataset (Spark, needs a Java runtime) in bench/results/_report/.
RESULTS ?= bench/results

demo: setup
	$(BIN)/raftka demo --results $(RESULTS)
	$(BIN)/raftka report --results $(RESULTS) --out $(RESULTS)/_report

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
