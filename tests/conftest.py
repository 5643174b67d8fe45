"""Shared fixtures. Every test gets its own VLLM_DYNO_HOME; one real CPU vLLM server
(the tiny local model, max_num_seqs 8) is shared by all e2e tests of a session.

Tests live in tier folders (tests/plugins/tiers.py): unit, integration, e2e, multinode."""
from __future__ import annotations

import contextlib

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / "build" / "tiny-llama"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
#: the field cases the tests replay (tests/cases/README.md); part of the repository
CASES = ROOT / "tests" / "cases"

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

#: the tiers by folder and the unit tier's guard; the Qt fixtures (gui_guard, main_window)
pytest_plugins = ["tests.plugins.tiers", "tests.plugins.qt", "tests.plugins.order"]


# ---- the tests read nothing beside the checkout -----------------------------------------

def beside_checkout(path: str, root: str, allowed: tuple[str, ...] = ()) -> bool:
    """True when ``path`` lies in the checkout's parent folder but outside the checkout
    ``root``: a file next to the repository that a fresh clone would not have.

    Not counted: the checkout itself, paths under an ``allowed`` prefix (the temp dir,
    the interpreter's prefix) and hidden entries of the parent (``.cache`` and the like,
    for a checkout that sits in a home folder)."""
    p = os.path.abspath(path)
    root = os.path.abspath(root)
    parent = os.path.dirname(root)
    if parent == root or not p.startswith(parent.rstrip(os.sep) + os.sep):
        return False
    if p == root or p.startswith(root + os.sep):
        return False
    if any(p == a or p.startswith(a.rstrip(os.sep) + os.sep) for a in allowed):
        return False
    return not p[len(parent.rstrip(os.sep)) + 1:].startswith(".")


#: prefixes beside the checkout that tests may use: the temp dir and the interpreter's
#: own installation (a checkout directly in the temp dir leaves this guard inert)
_ALLOWED = tuple({os.path.abspath(d) for d in (tempfile.gettempdir(), sys.prefix, sys.base_prefix,
                                               sys.exec_prefix)})
_READ_BESIDE: list[str] = []


def _audit(event: str, args: tuple) -> None:
    """Record files and folders opened beside the checkout (``open``, ``os.listdir``,
    ``os.scandir`` audit events). Never raises: the hook runs inside every ``open``."""
    if event not in ("open", "os.listdir", "os.scandir") or not args:
        return
    try:
        target = args[0]
        if target is None or isinstance(target, int):
            return
        target = os.fsdecode(target)
        if beside_checkout(target, str(ROOT), _ALLOWED):
            _READ_BESIDE.append(target)
    except Exception:  # noqa: BLE001 - a guard must never break the operation it watches
        pass


sys.addaudithook(_audit)
READ_GUARD_INSTALLED = True


@pytest.fixture(autouse=True)
def reads_inside_checkout():
    """Fail a test that opens a file or lists a folder beside the checkout."""
    _READ_BESIDE.clear()
    yield
    seen = sorted(set(_READ_BESIDE))
    _READ_BESIDE.clear()
    if seen:
        pytest.fail("the test read beside the checkout (a fresh clone has nothing there): " + ", ".join(seen[:5]),
                    pytrace=False)


@pytest.fixture(autouse=True)
def dyno_home(tmp_path, monkeypatch):
    home = tmp_path / "dyno-home"
    home.mkdir()
    monkeypatch.setenv("VLLM_DYNO_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    if not (TINY_MODEL / "config.json").exists():
        pytest.fail(f"tiny model missing at {TINY_MODEL}: run `make model` (make test does it)")
    return TINY_MODEL


@pytest.fixture(scope="session")
def vllm_python() -> str:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} missing: run `make vllm` (make test does it)")
    return str(VLLM_PYTHON)


def tiny_server_config(tiny_model: Path, **kw):
    from app.config import ServerConfig  # deferred: tests/conftest.py imports no app module at load
    from app.planner.launch_defaults import cpu_build_defaults  # deferred: as above
    from app.planner.versions import installed_version  # deferred: as above

    # The CPU build runs its model in a separate VLLM::Worker process by default, and the
    # EngineCore and that Worker busy-wait (sched_yield) on their shared-memory queue for 1 s
    # after every message (vllm/distributed/device_communicators/shm_broadcast.py,
    # SpinCondition busy_loop_s=1). On a 2-core machine those two spinners starve the API
    # server: streams arrive in bursts and TTFT p99 at max_num_seqs reached 1.2–1.5 s (at c=1:
    # 190 ms, p50 8 ms). The in-process executor removes the Worker process
    # (VLLM_ENABLE_V1_MULTIPROCESSING=0 lifts the CPU platform's switch back to "mp"; the
    # API server still runs EngineCore in its own process). The engine's OpenMP threads stay
    # on core 0, leaving the other core to the API server and the load generator.
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.update(kw.pop("env", {}))
    kw.setdefault("distributed_executor_backend", "uni")
    cfg = ServerConfig(model=str(tiny_model), served_model_name="tiny", max_num_seqs=8, env=env, **kw)
    # and what every launch of the app adds on the CPU build where the above sets nothing (vLLM
    # 0.32's AOT compile, whose saved model the next launch cannot load: app.planner.launch_defaults);
    # environ={}: the test machine's own variables decide nothing here
    return cpu_build_defaults(cfg, vllm_version=installed_version(str(VLLM_PYTHON)), environ={}).config


@contextlib.contextmanager
def tiny_vllm(tiny_model: Path, vllm_python: str, what: str = "vLLM", **kw):
    """A real vLLM (CPU build) of the tiny model, :func:`tiny_server_config` with ``kw``
    (e.g. ``enable_prefix_caching=False``): yields the ready Supervisor; ``what`` names it
    when it fails to start. On exit it is stopped and its whole process group must be gone."""
    from app.server.procs import group_members
    from app.server.supervisor import Supervisor

    sup = Supervisor(tiny_server_config(tiny_model, **kw), python=vllm_python, startup_timeout=600)
    sup.start()
    try:
        if not sup.wait_ready(620):
            pytest.fail(f"{what} did not become ready: {sup.failure and sup.failure.reason}\n"
                        + "\n".join(sup.log_tail(40)))
        yield sup
    finally:
        left = sup.stop()
        assert left == [], f"processes of the vLLM group survived stop(): {left}"
        assert group_members(sup.pgid) == []


@pytest.fixture(scope="session")
def vllm_server(tiny_model, vllm_python):
    """One real vLLM (CPU build) for the whole session: yields the ready Supervisor.

    It runs with ``VLLM_SERVER_DEV_MODE=1``: vLLM 0.32 then serves ``POST
    /reset_prefix_cache`` (vllm/entrypoints/serve/dev/cache/api_router.py), which the run
    controller calls before every level, as a user's measuring server should. The server
    is stopped at the end and its whole process group must be gone.
    """
    with tiny_vllm(tiny_model, vllm_python, "shared vLLM", env={"VLLM_SERVER_DEV_MODE": "1"}) as sup:
        yield sup


#: the request cap of :func:`vllm_variant_server` (vLLM 0.29+'s admission control)
QUEUED_REQS = 6
#: the n-gram speculative config of :func:`vllm_variant_server` (no draft model needed)
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}


@pytest.fixture(scope="session")
def vllm_variant_server(tiny_model, vllm_python):
    """The second and last shared real vLLM: every option the first one has at vLLM's
    default turned the other way for the tests that need it — ``--no-enable-prefix-caching``
    (the prefix-cache counters stay 0), ``--speculative-config`` n-gram (spec-decode
    counters), no dev mode (``POST /reset_prefix_cache`` answers 404) — and admission control
    (``--max-num-queued-reqs`` :data:`QUEUED_REQS`, above the 4 users its other tests run:
    tests/e2e/test_admission_e2e.py)."""
    with tiny_vllm(tiny_model, vllm_python, "vLLM without prefix caching, with n-gram speculation",
                   enable_prefix_caching=False, speculative_config=NGRAM, max_num_queued_reqs=QUEUED_REQS) as sup:
        yield sup
