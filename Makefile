# vLLM Dyno — two commands: `make run` and `make test`. Both are idempotent.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TINY_MODEL := build/tiny-llama

.PHONY: run test deps vllm model system unit e2e clean bench

$(VENV)/.dyno-ok: pyproject.toml
	@[ -x $(VPY) ] || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	@touch $@

deps: system $(VENV)/.dyno-ok

system:
	@bash scripts/setup-system.sh

vllm:
	@bash scripts/setup-vllm.sh

model: vllm
	@[ -f $(TINY_MODEL)/config.json ] || .venv-vllm/bin/python scripts/make_tiny_model.py $(TINY_MODEL)

run: deps
	$(VENV)/bin/vllm-dyno

test: deps vllm model
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -ra tests

unit: deps
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -ra tests -m "not e2e"

bench: deps
	@for b in benchmarks/*.py; do echo "== $$b"; $(VPY) $$b || exit 1; done

clean:
	rm -rf build dist *.egg-info
