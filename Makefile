# vLLM Dyno — two commands: `make run` and `make test`. Both are idempotent.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TINY_MODEL := build/tiny-llama

.PHONY: run test lint deps vllm ray model system unit e2e test-multinode clean bench package package-test install-desktop icons screenshot

$(VENV)/.dyno-ok: pyproject.toml
	@[ -x $(VPY) ] || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	@touch $@

deps: system $(VENV)/.dyno-ok

system:
	@bash scripts/setup-system.sh

vllm:
	@bash scripts/setup-vllm.sh

# Ray (its own venv, .venv-ray) for the multinode test of the Ray backend's cluster start
ray:
	@bash scripts/setup-ray.sh

model: vllm
	@[ -f $(TINY_MODEL)/config.json ] || .venv-vllm/bin/python scripts/make_tiny_model.py $(TINY_MODEL)

run: deps
	$(VENV)/bin/vllm-dyno

test: deps vllm ray model lint
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -ra tests

# the import contracts of pyproject.toml (layers, Qt-free core, the GUI through the run
# controller) and unused imports/names in the shipped code
lint: deps
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pyflakes app widgets

# the rig of two hosts as network namespaces (needs root; part of `make test` too)
test-multinode: deps ray
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -ra tests -m multinode

unit: deps lint
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -ra tests -m "not e2e"

bench: deps vllm model
	@for b in benchmarks/*.py; do echo "== $$b"; $(VPY) $$b || exit 1; done

clean:
	rm -rf build dist *.egg-info

icons: deps
	QT_QPA_PLATFORM=offscreen $(VPY) scripts/render_icons.py

package: deps
	$(VPY) -m pip install -q --disable-pip-version-check 'pyinstaller>=6.5'
	$(VPY) -m PyInstaller --noconfirm --clean --distpath dist --workpath build/pyinstaller packaging/vllm-dyno.spec
	@du -sh dist/vllm-dyno

package-test:
	@[ -x dist/vllm-dyno/vllm-dyno ] || { echo "no build: run make package first"; exit 1; }
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -ra tests/test_packaging.py

install-desktop:
	install -Dm644 packaging/linux/io.github.vllm_dyno.VllmDyno.desktop ~/.local/share/applications/io.github.vllm_dyno.VllmDyno.desktop
	install -Dm644 packaging/linux/io.github.vllm_dyno.VllmDyno.metainfo.xml ~/.local/share/metainfo/io.github.vllm_dyno.VllmDyno.metainfo.xml
	for s in 16 24 32 48 64 128 256 512; do install -Dm644 resources/icons/vllm-dyno-$$s.png ~/.local/share/icons/hicolor/$${s}x$${s}/apps/vllm-dyno.png; done

screenshot: deps
	QT_QPA_PLATFORM=offscreen $(VPY) scripts/screenshot.py resources/screenshots/main-window.png
	QT_QPA_PLATFORM=offscreen $(VPY) scripts/screenshot.py --verdict resources/screenshots/verdict.png
	QT_QPA_PLATFORM=offscreen $(VPY) scripts/screenshot.py --tune --time-scale 20 resources/screenshots/tune.png
