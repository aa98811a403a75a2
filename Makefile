# Governor: the two set-up commands are `make run` and `make test`.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench benchmarks-doc loadtest models protos check-protos clean dashboards perf-tables demo-trace lock lowest

$(VPY):
	$(PY) -m venv $(VENV)

# pyproject.toml declares compatible ranges; constraints.txt holds the exact version of every package
# (runtime, dev and what they pull in), so a fresh machine, CI and the image get the same ones.
# xds-protos (the picker's Envoy ext_proc modules) ships its own, older copy of opentelemetry/proto/*: installed
# after opentelemetry-proto it overwrites the modules the OTLP exporter imports (InstrumentationScope is missing
# from its copy). The exporter's own copy, a superset the Envoy modules also load, is reinstalled last so it wins.
$(STAMP): pyproject.toml constraints.txt | $(VPY)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(VPY) -m pip install --quiet --force-reinstall --no-deps "opentelemetry-proto==$$($(VPY) tools/deps.py pin opentelemetry-proto)"
	touch $(STAMP)

# Regenerates constraints.txt: '.[dev]' resolved afresh within pyproject's ranges in a temporary venv
# (the newest versions they allow), then every installed version written down. Review the diff, run `make test`.
lock: $(STAMP)
	rm -rf build/lock && $(PY) -m venv build/lock/venv
	build/lock/venv/bin/python -m pip install --quiet --upgrade pip
	build/lock/venv/bin/python -m pip install --quiet '.[dev]'
	{ sed -n '1,/^[^#]/{/^#/p}' constraints.txt; build/lock/venv/bin/python -m pip freeze --exclude-editable \
	  | grep -v '^llm-governor'; } > build/lock/constraints.txt
	mv build/lock/constraints.txt constraints.txt && rm -rf build/lock
	$(VPY) tools/deps.py check

# The wheel installed into a fresh venv at the lowest versions pyproject's ranges allow (tools/deps.py lowest:
# the direct dependencies at their floors, what they pull in resolved as usual), then the demo for 60 s from
# there; prints the versions and the demo's summary (docs/OPERATING.md §2, "Installing beside other software").
lowest: $(STAMP)
	rm -rf build/lowest && mkdir -p build/lowest/run && $(PY) -m venv build/lowest/venv
	$(VPY) tools/deps.py lowest > build/lowest/constraints.txt
	$(VPY) -m pip wheel --quiet --no-deps --no-build-isolation -w build/lowest/wheel .
	build/lowest/venv/bin/python -m pip install --quiet -c build/lowest/constraints.txt build/lowest/wheel/*.whl
	build/lowest/venv/bin/python -m pip install --quiet --force-reinstall --no-deps \
	  "opentelemetry-proto==$$(grep -i '^opentelemetry-proto==' build/lowest/constraints.txt | cut -d= -f3)"
	build/lowest/venv/bin/python -m pip freeze > build/lowest/freeze.txt
	cd build/lowest/run && ../venv/bin/governor run --demo --headless --for 60 > demo.jsonl 2> demo.log
	$(VPY) tools/deps.py demo-summary build/lowest

# Runs the daemon against the embedded simulated fleet (Ctrl-C stops everything).
run: $(STAMP)
	$(VENV)/bin/governor run --demo

# ruff (style and bugs), mypy (types; strict on controller/core and controller/types.py) and
# import-linter (the map of docs/DESIGN.md §4.1: the layers, and no import loop), all configured in
# pyproject.toml. All three run; it fails if any failed.
lint: $(STAMP)
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	$(VENV)/bin/lint-imports || status=1; \
	exit $$status

# Installs what the tests need (Debian's prometheus and kubernetes-client), lints, and runs the whole suite.
test: lint
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus package for the end-to-end tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) \
	  || { echo "could not install prometheus (need root and Debian's package index)"; exit 1; }; }
	@command -v kubectl >/dev/null 2>&1 || { \
	  echo "installing Debian's kubernetes-client (kubectl, with kustomize) for the manifest tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null) \
	  || { echo "could not install kubernetes-client (need root and Debian's package index)"; exit 1; }; }
	@command -v openssl >/dev/null 2>&1 || { \
	  echo "installing Debian's openssl (the TLS tests make their certificates with it)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null) \
	  || { echo "could not install openssl (need root and Debian's package index)"; exit 1; }; }
	$(VPY) protos/generate.py --check
	$(VPY) -m pytest -q tests

bench: $(STAMP)
	$(VENV)/bin/governor bench all

# Reruns every bench docs/BENCHMARKS.md's tables (and README's figures) are rendered from, saves each one's JSON
# in docs/bench/ with its command and commit, then rewrites the tables and plots. Slow: about 90 minutes on 2 cores
# (`governor bench report --list` gives each; `--run NAME` reruns one). `governor bench report --check`, run by a
# test, says whether the doc matches the saved results.
benchmarks-doc: $(STAMP)
	$(VENV)/bin/governor bench report --run all

# The API under load while the daemon ticks, the picker beside it (docs/RELIABILITY.md, "Load"); one JSON object.
loadtest: $(STAMP)
	$(VENV)/bin/governor bench api-load --json

models: $(STAMP)
	$(VENV)/bin/governor fit --defaults

protos: $(STAMP)
	$(VPY) protos/generate.py

# Regenerates the performance tables the daemon ships from ../shared/data: controller/perf/figures_table.py
# (the planner's step-time figures), controller/perf/physics_table.py (the learned models' prior physics) and
# controller/perf/steps_table.py (the simulator's step-time grids when the shared data is missing).
perf-tables: $(STAMP)
	$(VPY) -m controller.perf.figures_gen --write
	$(VPY) -m controller.perf.physics_gen --write
	$(VPY) -m controller.perf.steps_gen --write

# Regenerates the demo's packaged trace, controller/sim/demo/azure2023_conv_demo.csv, from ../shared/data.
demo-trace: $(STAMP)
	$(VPY) -m controller.sim.demo_trace --write

# Regenerates grafana/*.json from grafana/dashboards.py (Grafana Foundation SDK, a dev extra).
dashboards: $(STAMP)
	$(VPY) grafana/dashboards.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
