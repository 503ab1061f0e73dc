# ChatTTS on Triton: every entry point of the project. `make help` lists them.
PY        ?= .venv/bin/python
PROFILE   ?= cpu
# the small generated artifacts where exported (make export, the tests), else the full ones
# make demo exports (a fresh clone after make demo: make serve serves those)
ARTIFACTS ?= $(if $(wildcard artifacts/small/manifest.json),artifacts/small,artifacts/full)
ASSETS    ?=
SIZE      ?= full
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
PA_MODEL ?= chattts
PYTEST_ARGS ?=

.PHONY: help setup export export-small export-full int8-accuracy kv-accuracy serve demo test lint typecheck unit bench bench-smoke loadtest soak recovery gateway voices-db textnorm-report clean

help:  ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup:  ## venv + CPU stack (CHATTTS_ONNX=gpu for onnxruntime-gpu); idempotent
	bash scripts/setup.sh

export: setup  ## ONNX artifacts: from ASSETS=<snapshot> if given, else generated small + full
ifneq ($(strip $(ASSETS)),)
	$(PY) -m chattts_serving.export --assets $(ASSETS) --out artifacts/chattts
else
	$(PY) -m chattts_serving.export --synthetic --size small
	$(PY) -m chattts_serving.export --synthetic --size full
endif

export-small: setup  ## generated small-config artifacts only (seconds)
	$(PY) -m chattts_serving.export --synthetic --size small

export-full: setup  ## generated full-size artifacts only
	$(PY) -m chattts_serving.export --synthetic --size full

int8-accuracy: setup  ## int8 GPT vs fp32, teacher-forced, into ARTIFACTS' manifest.json (e.g. ARTIFACTS=artifacts/full)
	$(PY) -m chattts_serving.export.accuracy int8 --artifacts $(ARTIFACTS) --measure

kv-accuracy: setup  ## KV cache fp16/int8 vs fp32: int8 scales, teacher-forced accuracy, step time -> manifest.json, results/kv-accuracy.json, results/kv.json
	$(PY) -m chattts_serving.export.accuracy kv --artifacts $(ARTIFACTS) --out results/kv-accuracy.json
	$(PY) -m bench.kv --artifacts $(ARTIFACTS) --out results/kv.json

serve:  ## render the repository for PROFILE over ARTIFACTS and serve until Ctrl-C
	$(PY) -m chattts_serving.deploy.serve --profile $(PROFILE) --artifacts $(ARTIFACTS) \
	  --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

demo: setup  ## fresh clone -> export -> tritonserver -> Chinese sentence streamed to out/demo.wav
	$(PY) -m chattts_serving.demo --size $(SIZE) --profile $(PROFILE) $(if $(ASSETS),--assets $(ASSETS),) \
	  --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

lint:  ## ruff
	$(PY) -m ruff check .

typecheck:  ## mypy
	$(PY) -m mypy chattts_serving bench

test: setup lint typecheck  ## lint, type-check and the whole test suite: tests/unit and tests/server (real tritonserver)
	$(PY) -m pytest -q $(PYTEST_ARGS)

unit:  ## tests/unit: in process, no server (fast)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

# Profiles whose GPT runs int8 need their graph exported too (once the int8 profile exists).
INT8_PROFILE := $(wildcard profiles/cpu-int8.toml)

bench: setup  ## benchmark vs upstream ChatTTS, profiles cpu (auto), cpu-fp32, cpu-int8 where they differ -> results/bench.{json,md,png}; ~25 min on 2 quiet cores
	$(PY) -m chattts_serving.export --synthetic --size full --quiet
	$(if $(INT8_PROFILE),$(PY) -m chattts_serving.export --synthetic --size full --precision int8 --quiet)
	$(if $(INT8_PROFILE),$(PY) -m chattts_serving.export.accuracy int8 --artifacts artifacts/full --measure-if-missing)
	$(PY) -m chattts_serving.export.accuracy kv --artifacts artifacts/full --measure-if-missing
	$(PY) -m bench --out results

bench-smoke:  ## every part of the benchmark on the small config, tiny load (1-2 min; CI runs it through the tests)
	$(if $(INT8_PROFILE),$(PY) -m chattts_serving.export --synthetic --size small --precision int8 --quiet)
	$(PY) -m bench --smoke --out results/smoke

.PHONY: perf-analyzer
perf-analyzer:  ## NVIDIA perf_analyzer on a running server's streaming door (GRPC_PORT; PA_MODEL=chattts|chattts_ensemble; CONCURRENCY="1 4 8 16")
	GRPC_URL=127.0.0.1:$(GRPC_PORT) MODEL=$(PA_MODEL) bash scripts/perf_analyzer.sh

textnorm-report:  ## accuracy per category on the normalisation corpus: our rules / wetext alone / shipped
	$(PY) -m chattts_serving.text.normalize_report

loadtest:  ## Locust headless against a running server (USERS, SPAWN_RATE, DURATION, HTTP_PORT, GRPC_PORT)
	CHATTTS_HTTP_PORT=$(HTTP_PORT) CHATTTS_GRPC_PORT=$(GRPC_PORT) bash loadtest/run.sh

GATEWAY_PORT ?= 8080
GATEWAY_ARGS ?=

# The venv as setup last made it: `make gateway` reruns setup only when one of these changed.
VENV_STAMP := .venv/.setup-stamp
$(VENV_STAMP): pyproject.toml scripts/setup.sh scripts/debian_packages.sh docker/requirements-validate.txt
	bash scripts/setup.sh
	touch $@

gateway: $(VENV_STAMP)  ## OpenAI /v1/audio/speech, the WebSocket stream and its page (/) on GATEWAY_PORT over a running server's gRPC (GRPC_PORT); GATEWAY_ARGS for more flags; setup only when the venv is older than pyproject.toml or setup.sh
	$(PY) -m chattts_serving.gateway --triton-url 127.0.0.1:$(GRPC_PORT) --port $(GATEWAY_PORT) $(GATEWAY_ARGS)

voices-db:  ## a local PostgreSQL for saved voices (VOICES_DB_PORT 5433, VOICES_DB_DIR), started if not running; prints the CHATTTS_VOICE_STORE URL (stop: scripts/voices_db.sh stop)
	bash scripts/voices_db.sh

recovery: setup  ## each kind of model process SIGKILLed under streams on every door, full size -> results/recovery.json (kill to error, kill to serving)
	$(PY) -m chattts_serving.export --synthetic --size full --quiet
	CHATTTS_RECOVERY_ARTIFACTS=artifacts/full $(PY) -m pytest -q tests/server/test_part_dies.py

SOAK_ARTIFACTS ?= artifacts/full
SOAK_ARGS ?=

soak: setup  ## MINUTES (30) of mixed traffic at full size (SOAK_ARTIFACTS, SANITIZE=1, SOAK_ARGS) -> results/soak.json; fails on a crash sign in the log, a lost request, RSS growth > 5 %
	$(if $(filter artifacts/small,$(SOAK_ARTIFACTS)),$(PY) -m chattts_serving.export --synthetic --size small --quiet)
	$(if $(filter artifacts/full,$(SOAK_ARTIFACTS)),$(PY) -m chattts_serving.export --synthetic --size full --quiet)
	$(PY) scripts/soak.py --artifacts $(SOAK_ARTIFACTS) --minutes $(or $(MINUTES),30) $(if $(SANITIZE),--sanitize) $(SOAK_ARGS)

clean:  ## remove build outputs (keeps the venv)
	rm -rf build results out

# ------------------------------------------------- container images (docker/README.md, "On a CPU host")
.PHONY: image containers-stop

image:  ## CPU image chattts-serving:0.1.0-cpu + export image on a local Debian base, no registry (root; dockerd via scripts/containers.sh) -> results/deploy/image.json
	bash scripts/containers.sh image

containers-stop:  ## stop the dockerd of scripts/containers.sh and undo what it changed (KEEP_IMAGES=1 keeps the image cache)
	bash scripts/containers.sh stop $(if $(KEEP_IMAGES),--keep-images)

# ------------------------------------------------- deploy test (docker/README.md, "Replicas behind a load balancer")
.PHONY: deploy-test

deploy-test: setup  ## tests/deploy as root: the image (make image), compose, 2 replicas behind haproxy, k8s -> results/deploy.json
	@command -v haproxy >/dev/null || (apt-get update -qq && apt-get install -y -qq haproxy)
	@mkdir -p results/deploy && rm -f results/deploy/*.json results/deploy.json
	@start=$$(date +%s); rc=0; \
	$(if $(wildcard scripts/containers.sh),bash scripts/containers.sh image || rc=$$?;) \
	$(PY) -m pytest -q -p no:cacheprovider tests/deploy $(PYTEST_ARGS) || rc=$$?; \
	$(PY) scripts/deploy_report.py --duration-s $$(( $$(date +%s) - start )) || rc=$$?; \
	exit $$rc
