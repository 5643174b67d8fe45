# vLLM Dyno — two commands: `make run` and `make test`. Both are idempotent.
# Contributors: `make check` (the inner loop), `make test-fast`, `make e2e`, `make multinode`
# (CONTRIBUTING.md: the tiers and what each costs).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TINY_MODEL := build/tiny-llama
# every pytest run prints its 25 slowest tests (pyproject.toml addopts)
PYTEST := QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -ra

.PHONY: run test check test-fast e2e multinode coverage lint deps test-deps vllm ray model system test-system clean bench package package-test install-desktop icons screenshot

# The minutes beside a target: its wall time on the 2-core development machine, venvs
# present, nothing else running (CONTRIBUTING.md has them with one core kept busy too).

# the app alone (`make run`): no test or bench extras
$(VENV)/.dyno-app-ok: pyproject.toml
	@[ -x $(VPY) ] || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -e .
	@touch $@

# the app with what the tests and benchmarks need
$(VENV)/.dyno-ok: pyproject.toml
	@[ -x $(VPY) ] || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	@touch $@ $(VENV)/.dyno-app-ok

deps: system $(VENV)/.dyno-app-ok
test-deps: $(VENV)/.dyno-ok

# Debian packages: Qt's libraries for the window; --test adds Xvfb, Chromium and iproute2
system:
	@bash scripts/setup-system.sh
test-system:
	@bash scripts/setup-system.sh --test

vllm:
	@bash scripts/setup-vllm.sh

# Ray (its own venv, .venv-ray) for the multinode test of the Ray backend's cluster start
ray:
	@bash scripts/setup-ray.sh

model: vllm
	@[ -f $(TINY_MODEL)/config.json ] || .venv-vllm/bin/python scripts/make_tiny_model.py $(TINY_MODEL)

run: deps
	$(VENV)/bin/vllm-dyno

# the import contracts of pyproject.toml (layers, Qt-free core, the GUI through the run
# controller), unused imports/names in the shipped code, and the static types of the
# packages [tool.mypy] names (its `files`)
lint: test-deps
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pyflakes app widgets
	$(VENV)/bin/mypy

# the inner loop: lint and the unit tier (no process, no Qt, no socket)
check: lint  # 1.6–1.8 min from a fresh clone (2.3 before --dist loadfile)
	$(PYTEST) tests/unit -p no:pytestqt -n 2 --dist loadfile

# + the integration tier (the sim, local processes, Qt offscreen, Xvfb, Chromium, the CPU
# build's argument parser): the isolated tests on four workers (most of their time is
# waiting on a sim or a window), then those marked serial (timing, many processes) alone
test-fast: check test-system vllm ray model  # + 12.1 min
	$(PYTEST) tests/integration -n 4 --dist worksteal -m "not serial"
	$(PYTEST) tests/integration -m serial

# the real CPU build of vLLM (tiny model), one launch per configuration
e2e: test-deps vllm model  # ≈ 13 min alone
	$(PYTEST) tests/e2e

# two hosts as network namespaces (root; skipped otherwise), Ray's cluster: three xdist
# workers, each with a bed of its own (tests/multinode/conftest.py) — the tier waits on
# SSH keepalives, agents and ramps far more than it computes (2.7 of 9.5 min on one worker)
multinode: test-deps test-system vllm ray model  # 5.5 min on 3 workers
	$(PYTEST) tests/multinode -n 3 --dist worksteal

# everything: what .ci/run calls. The e2e tests that measure latency run alone; then those
# marked `launches` (their own vLLM, no latency judged: tests/e2e) run beside the multinode
# tier, which mostly waits (its output follows theirs, from build/multinode.log)
test: test-fast test-deps test-system vllm ray model  # 30.8 min from a fresh clone, setup included (37.3 before the tiers overlapped)
	$(PYTEST) tests/e2e -m "not launches"
	@mkdir -p build; \
	$(PYTEST) tests/multinode -n 4 --dist worksteal > build/multinode.log 2>&1 & mn=$$!; \
	trap 'kill $$mn 2>/dev/null' EXIT; \
	echo "$(PYTEST) tests/e2e -m launches  (beside: tests/multinode -n 4 → build/multinode.log)"; \
	$(PYTEST) tests/e2e -m launches; e=$$?; \
	wait $$mn; m=$$?; trap - EXIT; \
	echo "== tests/multinode -n 4 --dist worksteal (ran beside the e2e launches): build/multinode.log"; \
	cat build/multinode.log; \
	exit $$(( e != 0 || m != 0 ))

# line coverage of app/ and widgets/ over the whole suite, subprocesses included
# (pyproject.toml [tool.coverage]: xdist's workers, the sims, CLIs and agents too), each
# tier as `make test` runs it; the report in build/coverage
COV := COVERAGE_FILE=$(CURDIR)/build/coverage/.coverage QT_QPA_PLATFORM=offscreen $(VENV)/bin/coverage run -m pytest -q -ra
coverage: test-deps test-system vllm ray model
	rm -rf build/coverage && mkdir -p build/coverage
	-$(COV) tests/unit -p no:pytestqt -n 2 --dist loadfile
	-$(COV) tests/integration -n 4 --dist worksteal -m "not serial"
	-$(COV) tests/integration -m serial
	-$(COV) tests/e2e
	-$(COV) tests/multinode -n 3 --dist worksteal
	$(VENV)/bin/coverage combine -q --data-file=$(CURDIR)/build/coverage/.coverage build/coverage
	$(VENV)/bin/coverage report --data-file=$(CURDIR)/build/coverage/.coverage | tail -1

bench: test-deps vllm model
	@for b in benchmarks/*.py; do echo "== $$b"; $(VPY) $$b || exit 1; done

clean:
	rm -rf build dist *.egg-info

icons: test-deps
	QT_QPA_PLATFORM=offscreen $(VPY) scripts/render_icons.py

package: test-deps
	$(VPY) -m pip install -q --disable-pip-version-check 'pyinstaller>=6.5'
	$(VPY) -m PyInstaller --noconfirm --clean --distpath dist --workpath build/pyinstaller packaging/vllm-dyno.spec
	@du -sh dist/vllm-dyno

package-test:
	@[ -x dist/vllm-dyno/vllm-dyno ] || { echo "no build: run make package first"; exit 1; }
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -ra tests/integration/test_packaging.py

install-desktop:
	install -Dm644 packaging/linux/io.github.vllm_dyno.VllmDyno.desktop ~/.local/share/applications/io.github.vllm_dyno.VllmDyno.desktop
	install -Dm644 packaging/linux/io.github.vllm_dyno.VllmDyno.metainfo.xml ~/.local/share/metainfo/io.github.vllm_dyno.VllmDyno.metainfo.xml
	for s in 16 24 32 48 64 128 256 512; do install -Dm644 resources/icons/vllm-dyno-$$s.png ~/.local/share/icons/hicolor/$${s}x$${s}/apps/vllm-dyno.png; done

screenshot: test-deps
	QT_QPA_PLATFORM=offscreen $(VPY) scripts/screenshot.py resources/screenshots/main-window.png
	QT_QPA_PLATFORM=offscreen $(VPY) scripts/screenshot.py --verdict resources/screenshots/verdict.png
	QT_QPA_PLATFORM=offscreen $(VPY) scripts/screenshot.py --tune --time-scale 20 resources/screenshots/tune.png
