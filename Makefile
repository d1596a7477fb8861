# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
SEED ?= 0
BIN := $(VENV)/bin

.PHONY: run test bench proto docs node-env clean

# The venv and torch first: a pinned CPU torch keeps pip from fetching CUDA wheels.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[test,dev,bench]"
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/python -m actorlearner run --env CartPole-v1 --actors 2 --target-return 475 --max-seconds 600 --seed $(SEED)

# Three pytest-xdist workers on two cores (many tests wait on processes they started: a third worker fills
# that idle CPU), each module whole on one; tests/system/test_learning.py (every learning test) goes first
# (tests/conftest.py). A plain `pytest tests/ROOM/test_x.py` runs in one process as before.
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_replay.py

# Regenerate the committed gRPC/protobuf code (tests/contract/test_proto.py fails when it is stale).
proto: $(VENV)/.installed-test
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/actorlearner/v1/*.proto

# The README's option tables, regenerated from the config dataclasses.
docs: $(VENV)/.installed
	$(BIN)/python -m actorlearner.docs README.md

# The example Node.js environment's dependencies, pinned by its package-lock.json.
node-env:
	npm ci --prefix examples/node-env

clean:
	rm -rf $(VENV) build *.egg-info

# The Kubernetes manifests: render every overlay (kubectl kustomize), validate strictly
# against pinned API schemas (offline), check probes, ports, selectors and policies.
.PHONY: k8s-check
k8s-check: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q tests/operations/test_k8s.py
