# Rooftop: the README's two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ROOFTOP_CACHE ?= $(HOME)/.cache/rooftop
export ROOFTOP_CACHE

.PHONY: demo test floors realnode-tools zero-loss lint typecheck unit vllm e2e loop vllm-e2e vllm-engine loop-figure bench calibrate crd dashboards docs vllm-flags hf-defaults cluster-up cluster-down tools clean

# The demo needs only the runtime; tests add the dev tools (separate stamp, so a
# `make demo` on a fresh clone stays well under two minutes).
$(BIN)/rooftop: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev: $(BIN)/rooftop
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

## demo: install into .venv and plan the bundled example
demo: $(BIN)/rooftop
	$(BIN)/rooftop plan examples/chat-llama-3.1-8b.yaml --explain

## test: lint, type-check, unit, integration and end-to-end tests (tools before the
## unit tests: the chart-rendering ones need helm and would skip on a fresh machine)
test: lint typecheck tools unit e2e floors

## floors: the operator's unit and end-to-end tests on the lowest kubernetes, kopf and
## pydantic that pyproject.toml declares (tests/floors/floors.py), in their own venv
FLOORS_VENV ?= .venv-floors
$(FLOORS_VENV)/.floors: pyproject.toml tests/floors/floors.py
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/pip install -q --upgrade pip
	$(FLOORS_VENV)/bin/pip install -q -e '.[dev]' $$($(PYTHON) tests/floors/floors.py)
	touch $@

floors: $(FLOORS_VENV)/.floors tools
	$(FLOORS_VENV)/bin/python -c "import kubernetes, kopf, pydantic; print('floors:', kubernetes.__version__, kopf.__version__ if hasattr(kopf, '__version__') else '', pydantic.VERSION)"
	$(FLOORS_VENV)/bin/pytest -q -p no:cacheprovider tests/unit/operator tests/unit/api
	$(FLOORS_VENV)/bin/pytest -q -m e2e -p no:cacheprovider tests/e2e/test_operator.py

lint: $(VENV)/.dev
	$(BIN)/ruff check planner operator tests dashboards benchmarks
	$(BIN)/ruff format --check planner operator tests dashboards benchmarks
	$(BIN)/lint-imports
	$(BIN)/python dashboards/build.py --check
	$(BIN)/python -m rooftop_api.crd --check
	$(BIN)/python -m rooftop_api.reference --check
	$(BIN)/python -m rooftop_cli.reference --check
	$(BIN)/mkdocs build --strict

typecheck: $(VENV)/.dev
	$(BIN)/mypy

unit: $(VENV)/.dev
	$(BIN)/pytest -q -m "not e2e and not loop and not vllm"

## vllm: every test against the real vLLM CPU build (flag table, engine-argument
## contract, simulator metrics, and the real-vLLM e2e, which needs `make tools` first)
vllm: $(VENV)/.dev vllm-engine
	$(BIN)/pytest -q -m "vllm and not zeroloss" -p no:cacheprovider

## tools: build the control plane, kwok, helm and the Prometheus Operator into
## $(ROOFTOP_CACHE) (cached), fetch Prometheus, install the real vLLM (CPU build) for the
## vllm tests
tools: vllm-engine
	tests/cluster/build-bins.sh
	tests/cluster/fetch-prometheus.sh
	tests/cluster/build-prometheus-operator.sh >/dev/null
	$(MAKE) realnode-tools

## realnode-tools: the real node's kubelet, kube-proxy, CNI plugins, containerd and runc
## (tests/cluster/build-node.sh) and its images, assembled locally (build-images.sh:
## pause, the operator, the vLLM CPU engine), cached in $(ROOFTOP_CACHE). Needs root
## (apt packages, and a kubelet runs pods as root); without it the real-node tests skip.
realnode-tools: vllm-engine
	@if [ "$$(id -u)" = 0 ]; then \
	  tests/cluster/build-node.sh >/dev/null && tests/cluster/build-images.sh >/dev/null; \
	else echo "realnode-tools: not root, so the real-node tests will skip"; fi

## vllm-engine: the real vLLM CPU build in a venv in $(ROOFTOP_CACHE) (cached)
vllm-engine:
	tests/engine/install-vllm.sh >/dev/null

e2e: $(VENV)/.dev tools
	$(BIN)/pytest -q -m "(e2e or loop or vllm) and not zeroloss" -p no:cacheprovider

## zero-loss: requests lost under load while Rooftop scales, rolls out, restarts and
## drains, on the real node (about 21 min); ROOFTOP_ZERO_LOSS_RECORD=f.json keeps the table
zero-loss: $(VENV)/.dev tools
	$(BIN)/pytest -q -s -m zeroloss -p no:cacheprovider tests/e2e/test_zero_loss.py

## vllm-e2e: only the real-vLLM end-to-end tests (a tiny model on vLLM's CPU build,
## the operator on the local control plane; ~3 min)
vllm-e2e: $(VENV)/.dev tools
	$(BIN)/pytest -q -m "vllm and not zeroloss" -p no:cacheprovider tests/e2e

## loop: only the closed-loop tests (operator + engines + real Prometheus, ~3 min)
loop: $(VENV)/.dev tools
	$(BIN)/pytest -q -m loop -p no:cacheprovider

## loop-figure: run the closed-loop scenario and redraw docs/loop.md's figure from it
loop-figure: $(VENV)/.dev tools
	ROOFTOP_LOOP_RECORD=docs/loop-run.json $(BIN)/pytest -q -m loop -p no:cacheprovider tests/e2e/test_loop.py
	$(BIN)/python benchmarks/plot_loop.py docs/loop-run.json docs/img/loop.png

bench: $(VENV)/.dev
	$(BIN)/python benchmarks/bench_search.py

calibrate: $(VENV)/.dev
	$(BIN)/python -m rooftop_fit.kernel_fit
	$(BIN)/python -m rooftop_sim.engine.truth --fit

cluster-up: $(VENV)/.dev tools
	$(BIN)/python -m tests.cluster up

cluster-down: $(VENV)/.dev
	$(BIN)/python -m tests.cluster down

## crd, dashboards: regenerate the CRD and dashboard JSON from code
crd: $(VENV)/.dev
	$(BIN)/python -m rooftop_api.crd

dashboards: $(VENV)/.dev
	$(BIN)/python dashboards/build.py

## docs: build the documentation site into site/ (strict: broken links fail) and check
## that docs/reference.md matches the API models (`python -m rooftop_api.reference`
## regenerates it). Not `mkdocs -q`: quiet mode hides the warnings strict mode counts.
docs: $(VENV)/.dev
	$(BIN)/python -m rooftop_api.reference --check
	$(BIN)/python -m rooftop_cli.reference --check
	$(BIN)/mkdocs build --strict

## vllm-flags: regenerate the `vllm serve` flag table (extraArgs checks) from the real vLLM
vllm-flags:
	PY=$$(tests/engine/install-vllm.sh) && "$$PY" tests/engine/dump_vllm_flags.py

## hf-defaults: regenerate the Hugging Face config defaults (config.json import) from vLLM's transformers
hf-defaults:
	PY=$$(tests/engine/install-vllm.sh) && "$$PY" tests/engine/dump_hf_defaults.py

clean:
	rm -rf $(VENV) $(FLOORS_VENV) .mypy_cache .ruff_cache .pytest_cache
