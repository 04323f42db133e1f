# gpuwarden — every target creates .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-test
DEMO_SCENARIO ?= scenarios/memory-pressure-low-priority.yaml
DEMO_STATE    := $(VENV)/demo-state

.PHONY: demo test lint bench golden gpu-check install uninstall clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The demo: the machine as status shows it, the drill of the memory-pressure ladder, then the
# daemon for real on the same scenario — its jobs are real processes: the checkpointable one is
# signalled and acknowledges, the low-priority one is killed — the incident's timeline, and its
# report as one HTML page (docs/reports.md).
demo: $(STAMP)
	$(BIN)/gpuwarden status --source scenario:$(DEMO_SCENARIO)@2m30s
	$(BIN)/gpuwarden drill $(DEMO_SCENARIO) --config config/demo.yaml --playbooks playbooks/memory-pressure.yaml
	rm -rf $(DEMO_STATE)
	$(BIN)/gpuwarden run --config config/demo.yaml --source scenario:$(DEMO_SCENARIO) --playbooks playbooks/memory-pressure.yaml --state-dir $(DEMO_STATE) --speed 30
	$(BIN)/gpuwarden incident last --state-dir $(DEMO_STATE)
	$(BIN)/gpuwarden report last --config config/demo.yaml --state-dir $(DEMO_STATE) --out $(CURDIR)/$(DEMO_STATE)/report.html
	@echo "open it in a browser: file://$(CURDIR)/$(DEMO_STATE)/report.html"

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check daemon tests bench
	$(BIN)/mypy

# Engine, drill and telemetry benchmarks (a few minutes); BENCH=engine runs one group.
# The figures and how to read them: docs/performance.md.
bench: $(STAMP)
	$(BIN)/python bench/run.py $(BENCH)

# Rewrite the golden drill timelines after an intended behaviour change; review the diff.
golden: $(STAMP)
	$(BIN)/python -m tests.regen_golden

# The one command to run on a machine that has an NVIDIA GPU and driver.
gpu-check: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu
	$(BIN)/gpuwarden status --source nvml --json
	$(BIN)/gpuwarden record --out $(VENV)/gpu-check-record.yaml --duration 10s --interval 1s
	$(BIN)/gpuwarden status --source scenario:$(VENV)/gpu-check-record.yaml --json
	$(BIN)/python bench/run.py telemetry

# Install on this machine (as root): a venv under $(PREFIX), the command in /usr/local/bin,
# config and playbooks under /etc/gpuwarden (never overwriting an edited one), the unit.
# docs/operations.md explains each step. DESTDIR stages it in a folder to inspect (a venv
# only runs from the path it was made at: install for real without DESTDIR).
PREFIX  ?= /opt/gpuwarden
DESTDIR ?=
install:
	$(PYTHON) -m venv $(DESTDIR)$(PREFIX)
	$(DESTDIR)$(PREFIX)/bin/pip install --quiet .
	install -d -m 0755 $(DESTDIR)/usr/local/bin $(DESTDIR)/etc/gpuwarden/playbooks $(DESTDIR)/etc/systemd/system
	ln -sf $(PREFIX)/bin/gpuwarden $(DESTDIR)/usr/local/bin/gpuwarden
	test -e $(DESTDIR)/etc/gpuwarden/gpuwarden.yaml || install -m 0644 config/gpuwarden.yaml $(DESTDIR)/etc/gpuwarden/gpuwarden.yaml
	for f in playbooks/*.yaml; do test -e $(DESTDIR)/etc/gpuwarden/$$f || install -m 0644 $$f $(DESTDIR)/etc/gpuwarden/$$f; done
	install -m 0644 systemd/gpuwarden.service $(DESTDIR)/etc/systemd/system/gpuwarden.service
	@echo "installed in SHADOW mode: gpuwarden records and notifies, and acts on nothing until /etc/gpuwarden/gpuwarden.yaml says mode: enforce"
	@echo "next: gpuwarden check --config /etc/gpuwarden/gpuwarden.yaml && systemctl daemon-reload && systemctl enable --now gpuwarden"
	@echo "arm it later: put the notification secrets in place, set mode: enforce, run gpuwarden check again (docs/operations.md)"

# Remove what install put in place; the config, the playbooks and the journal stay.
uninstall:
	-systemctl disable --now gpuwarden 2>/dev/null
	rm -f $(DESTDIR)/etc/systemd/system/gpuwarden.service $(DESTDIR)/usr/local/bin/gpuwarden
	rm -rf $(DESTDIR)$(PREFIX)
	@echo "removed; kept /etc/gpuwarden and /var/lib/gpuwarden (delete them by hand if you wish)"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
