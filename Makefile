# Two commands a newcomer needs: `make demo` and `make test`. Each sets itself up.
# `make check` is the developers' fast loop: lint, types and the unit tests.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Debian packages the integration tests and the demo use: real Prometheus,
# promtool, Alertmanager, VictoriaMetrics, Redis, stress-ng, fio, wrk, nft.
DEB_PKGS := prometheus prometheus-alertmanager victoria-metrics redis-server stress-ng fio wrk nftables iproute2 chromium chromium-driver

.PHONY: demo test check lint typecheck unit check-tests bench debs clean generate

# The unit tier: tests that need nothing beyond the venv and take under 2 s each
# (tests/_tiers.py says how a test is marked integration or slow).
CHECK_SELECT := not integration and not slow

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,demo,gpu,otel]'
	touch $(STAMP)

debs:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q $$missing; \
	fi

demo: debs $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/aivitals demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q --durations=25

check-tests: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m '$(CHECK_SELECT)' --durations=10

test: debs $(STAMP)
	$(MAKE) --no-print-directory lint typecheck unit

# Under 5 minutes on 2 cores, without the Debian packages; `make test` runs every test.
# --keep-going: a lint error does not hide what the types and the tests say.
check: $(STAMP)
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory --keep-going lint typecheck check-tests; rc=$$?; \
	s=$$(( $$(date +%s) - start )); printf 'check: %dm%02ds\n' $$((s / 60)) $$((s % 60)); exit $$rc

# After changing the rule pack or the signal catalogue: the PrometheusRule and the
# dashboard ConfigMaps under deploy/ are generated from them, and all of deploy/kubernetes/
# is rendered from deploy/values.yaml and deploy/templates/ (tests/deploy checks).
generate: $(STAMP)
	$(BIN)/python deploy/generate.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
