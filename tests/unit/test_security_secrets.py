"""Issue 15, item 3, tried as an attack: an API key or token never reaches a command line
or a stored file.

Every spelling of vLLM's secret options (``--api-key``, ``--hf-token``; vLLM's parser
takes ``_`` for ``-``, ``--opt=value``, the dotted JSON form and unambiguous prefixes:
vllm/utils/argparse_utils.py, vLLM 0.32.0) is refused in ``--extra``, a profile's
``server:``, an imported ``vllm serve`` line and a ``--config`` file; ``--env`` with a
secret name is refused on the command line. A key given by the environment or by
``--api-key-file`` reaches the (simulated, real-process) server's environment but
neither its argv nor the reaper's, and no byte of any file the run wrote."""
from __future__ import annotations

import argparse
import os
import stat
import types

import pytest
from pydantic import ValidationError

from app.cli import main
from app.cli.common import apply_api_key_file
from app.config import (REDACTED, ServerConfig, redact_argv, redact_secrets, redact_text, secret_option_of)
from app.profiles import parse_profile
from app.profiles.interop import import_command_line, import_text, import_vllm_config_yaml, to_command_line
from app.profiles.io import ProfileError
from app.run.record import RunRecorder
from app.store import RunStore

SECRET = "sk-attack-7f3a9c1e5b"
TOKEN = "hf_attackTOKEN42xyz"

#: every spelling of a secret option vLLM 0.32.0 accepts, as argv tokens (with the value)
SPELLINGS = [
    ["--api-key", SECRET], [f"--api-key={SECRET}"], ["--api_key", SECRET], [f"--api_key={SECRET}"],
    ["--api-k", SECRET], ["--api-ke", SECRET], ["--api-key", "a", SECRET], [f"--api-key.x={SECRET}"],
    ["--API-KEY", SECRET], ["--hf-token", TOKEN], [f"--hf-token={TOKEN}"], ["--hf_token", TOKEN],
    ["--hf-t", TOKEN], ["--hf-token"],
]
IDS = [" ".join(s).replace(SECRET, "K").replace(TOKEN, "T") for s in SPELLINGS]


def _fix_of(tokens: list[str]) -> str:
    return "VLLM_API_KEY" if "api" in tokens[0].lower() else "HF_TOKEN"


def _no_secret(text: str) -> None:
    assert SECRET not in text and TOKEN not in text, text
    assert "Traceback" not in text, text


@pytest.mark.parametrize("tokens", SPELLINGS, ids=IDS)
def test_every_spelling_is_refused_in_extra_args(tokens):
    with pytest.raises(ValidationError) as ei:
        ServerConfig(model="m", extra_args=["--seed", "1"] + tokens)
    msg = str(ei.value)
    assert tokens[0].split("=")[0] in msg and "refused" in msg and _fix_of(tokens) in msg
    _no_secret(msg)


@pytest.mark.parametrize("tokens", SPELLINGS, ids=IDS)
def test_every_spelling_is_refused_in_extra_on_the_command_line(tokens, capsys):
    import shlex

    with pytest.raises(SystemExit) as ei:
        main(["serve", "--engine", "sim", "--model", "m", f"--extra={shlex.join(tokens)}"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert tokens[0].split("=")[0] in err and _fix_of(tokens) in err
    _no_secret(err)


@pytest.mark.parametrize("key", ["api-key", "api_key", "api-k", "hf-token", "hf_token", "hf-t"])
def test_a_profile_server_mapping_with_a_secret_option_is_refused(key):
    with pytest.raises(ProfileError) as ei:
        parse_profile(f"name: x\nserver: {{model: m, {key}: {SECRET}}}\n")
    msg = str(ei.value)
    assert ("VLLM_API_KEY" if key.startswith("api") else "HF_TOKEN") in msg
    _no_secret(msg)


@pytest.mark.parametrize("tokens", SPELLINGS, ids=IDS)
def test_an_imported_command_line_with_a_secret_option_is_refused(tokens):
    import shlex

    line = "vllm serve m --max-num-seqs 8 " + shlex.join(tokens)
    for imp in (lambda: import_text(line), lambda: import_command_line(line, "x"),
                lambda: import_text("python -m vllm.entrypoints.openai.api_server --model m " + shlex.join(tokens))):
        with pytest.raises(ProfileError) as ei:
            imp()
        msg = str(ei.value)
        assert tokens[0].split("=")[0] in msg and _fix_of(tokens) in msg
        _no_secret(msg)


@pytest.mark.parametrize("key", ["api-key", "api_key", "api-k", "hf-token", "hf_token"])
def test_an_imported_config_yaml_with_a_secret_option_is_refused(key):
    for imp in (lambda: import_vllm_config_yaml(f"model: m\n{key}: {SECRET}\n", "x"),
                lambda: import_text(f"model: m\n{key}: {SECRET}\n")):
        with pytest.raises(ProfileError) as ei:
            imp()
        _no_secret(str(ei.value))


def test_secret_env_assignments_of_an_import_are_dropped_never_kept():
    warnings: list[str] = []
    p = import_text(f"VLLM_API_KEY={SECRET} HF_TOKEN={TOKEN} NCCL_P2P_DISABLE=1 vllm serve m", warnings=warnings)
    assert p.env == {"NCCL_P2P_DISABLE": "1"}
    assert any("VLLM_API_KEY dropped" in w for w in warnings) and any("HF_TOKEN dropped" in w for w in warnings)
    _no_secret(" ".join(warnings))


@pytest.mark.parametrize("kv", [f"VLLM_API_KEY={SECRET}", f"HF_TOKEN={TOKEN}", f"OPENAI_API_KEY={SECRET}",
                                f"AWS_SECRET_ACCESS_KEY={SECRET}", f"DB_PASSWORD={SECRET}"])
def test_env_with_a_secret_name_on_the_command_line_is_refused(kv, capsys):
    for argv in (["serve", "--engine", "sim", "--model", "m", "--env", kv],
                 ["serve", "--engine", "sim", "--model", "m", f"--env={kv}"]):
        with pytest.raises(SystemExit) as ei:
            main(argv)
        assert ei.value.code == 2
        err = capsys.readouterr().err
        name = kv.split("=")[0]
        assert f"--env {name}=" in err and "export" in err and "environment" in err
        _no_secret(err)


def test_readme_no_longer_advises_a_key_on_the_command_line():
    """Neither the README nor a page of docs/ advises a key on the command line; both the
    README's short "Security" and docs/security.md give the key file."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    assert "--env VLLM_API_KEY" not in text and "--api-key-file" in text and "## Security" in text
    assert "docs/security.md" in text
    for page in sorted(os.listdir(os.path.join(root, "docs"))):
        if page.endswith(".md"):
            doc = open(os.path.join(root, "docs", page), encoding="utf-8").read()
            assert "--env VLLM_API_KEY" not in doc, page
    security = open(os.path.join(root, "docs", "security.md"), encoding="utf-8").read()
    assert "--api-key-file" in security and "never go on a command line" in security


# ---------------------------------------------------------------------- the key file
def test_api_key_file_is_read_and_a_readable_file_warned_about(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_API_KEY", "placeholder")  # restored after the test
    f = tmp_path / "key"
    f.write_text(SECRET + "\n")
    f.chmod(0o600)
    apply_api_key_file(argparse.Namespace(api_key_file=str(f)))
    assert os.environ["VLLM_API_KEY"] == SECRET and "readable" not in capsys.readouterr().err
    f.chmod(0o644)
    apply_api_key_file(argparse.Namespace(api_key_file=str(f)))
    err = capsys.readouterr().err
    assert "readable by other users" in err and "chmod 600" in err
    _no_secret(err)


@pytest.mark.parametrize("content", [None, "", "\n\n"])
def test_a_missing_or_empty_key_file_is_a_clear_error(tmp_path, content, capsys):
    f = tmp_path / "key"
    if content is not None:
        f.write_text(content)
        f.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--engine", "sim", "--model", "m", "--api-key-file", str(f)])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert str(f) in err and "Traceback" not in err


# ---------------------------------------------------------------------- redaction
def test_redaction_helpers():
    assert redact_secrets({"VLLM_API_KEY": SECRET, "HF_TOKEN": TOKEN, "NCCL_P2P_DISABLE": "1"}) == {
        "VLLM_API_KEY": REDACTED, "HF_TOKEN": REDACTED, "NCCL_P2P_DISABLE": "1"}
    assert redact_secrets({"VLLM_API_KEY": SECRET, "X": "1"}, drop=True) == {"X": "1"}
    assert redact_argv(["vllm", "serve", "m", "--api_key", SECRET, "--port", "1", f"--hf-token={TOKEN}"]) == [
        "vllm", "serve", "m", "--api_key", REDACTED, "--port", "1", f"--hf-token={REDACTED}"]
    assert redact_text(f"args: api_key={SECRET!r}", [SECRET]) == f"args: api_key='{REDACTED}'"
    assert secret_option_of("--api") is None and secret_option_of("--hf") is None  # ambiguous in vLLM: not these
    assert secret_option_of("--host") is None and secret_option_of("--max-num-seqs") is None


def test_exports_never_write_a_secret_value():
    p = parse_profile("name: x\nserver: {model: m}\nenv: {NCCL_P2P_DISABLE: '1'}\n")
    p = p.model_copy(update={"env": {"NCCL_P2P_DISABLE": "1", "HF_TOKEN": TOKEN}})  # as if typed in the window
    line = to_command_line(p, resolve=False)
    assert TOKEN not in line and 'HF_TOKEN="${HF_TOKEN}"' in line
    cfg = ServerConfig(model="m", env={"VLLM_API_KEY": SECRET, "HF_TOKEN": TOKEN})
    sh = cfg.shell_command()
    assert SECRET not in sh and TOKEN not in sh and "VLLM_API_KEY=${VLLM_API_KEY}" in sh


def _files_bytes(*roots) -> list[tuple[str, bytes]]:
    out = []
    for root in roots:
        for dp, _dn, fn in os.walk(root):
            for n in fn:
                with open(os.path.join(dp, n), "rb") as f:
                    out.append((os.path.join(dp, n), f.read()))
    return out


def assert_absent(roots, *secrets: str) -> None:
    files = _files_bytes(*roots)
    assert files
    for path, data in files:
        for s in secrets:
            assert s.encode() not in data, f"{s!r} stored in {path}"


def test_the_recorder_stores_no_secret_even_when_handed_one(tmp_path, monkeypatch):
    """A second line of defence: whatever a supervisor carries (a secret-named env value, a
    secret option in argv, a log line echoing the key) reaches runs.sqlite redacted."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    cfg = ServerConfig.model_construct(**{**ServerConfig(model="m").model_dump(),
                                          "env": {"VLLM_API_KEY": SECRET, "NCCL_P2P_DISABLE": "1"}})
    facts = types.SimpleNamespace(as_dict=lambda: {})
    sup = types.SimpleNamespace(config=cfg, argv=["python", "-m", "x", "--api-key", SECRET, f"--hf_token={TOKEN}"],
                                parser=types.SimpleNamespace(facts=facts),
                                lines=__import__("collections").deque([(0.1, "stdout", f"args: key={SECRET}")]))
    with RunStore(tmp_path / "runs.sqlite") as store:
        rec = RunRecorder(store, name="x", engine="sim",
                          profile_data={"name": "x", "server": {"model": "m"}, "env": {"HF_TOKEN": TOKEN, "A": "1"}})
        rec.attach_server(sup)
        rec.add_log_line("stderr", f"token {TOKEN} and key {SECRET}", 0.2)
        rec.finish("error", f"failed: {SECRET}", error=f"boom {TOKEN}")
        run = store.get_run(rec.run_id)
        assert run["config"]["server"]["env"] == {"VLLM_API_KEY": REDACTED, "NCCL_P2P_DISABLE": "1"}
        assert run["config"]["profile"]["env"] == {"A": "1"}
    assert_absent([tmp_path], SECRET, TOKEN)


