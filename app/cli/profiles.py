"""``vllm-dyno profiles``: list, show, export, import, delete and save-run.

Exit status: 0 success; 1 the operation failed; 2 bad input (unknown profile or run,
unreadable file).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import err, output_file, run_number, write_or_print
from app.profiles.io import ProfileError


def cmd_profiles(a: argparse.Namespace) -> int:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.profiles import (ProfileLibrary, ProfileNotFound, dump_profile, import_text, to_command_line,
                              to_vllm_config_yaml)

    lib = ProfileLibrary()
    try:
        if a.action == "list":
            res = lib.scan()
            for e in res.entries:
                p = e.profile
                tag = "built-in" if e.read_only else ("user, shadows built-in" if e.shadows_builtin else "user")
                hw = p.hardware.describe() if p.hardware else "—"
                print(f"{p.name:<42} {p.engine:<6} {hw:<28} [{tag}]")
                for w in e.warnings:
                    print(f"    warning: {w}")
            for problem in res.errors:
                print(f"error: {problem}", file=sys.stderr)
            return 0
        if a.action == "show":
            print(dump_profile(lib.get(a.name)), end="")
            return 0
        if a.action == "export":
            p = lib.get(a.name)
            if a.format == "cmd":
                text = to_command_line(p, program=a.program)
            elif a.format == "yaml":
                text = to_vllm_config_yaml(p)
            else:
                text = dump_profile(p)
            write_or_print(text, a.output)
            return 0
        if a.action == "import":
            if a.file == "-":
                text, label = sys.stdin.read(), "<stdin>"
            else:
                path = Path(a.file)
                # deferred: only this command needs it (vllm-dyno starts light)
                from app.profiles.io import read_text_limited

                if not path.is_file():
                    # a pasted command line instead of a file
                    if " " in a.file:
                        text, label = a.file, "<command line>"
                    else:
                        return err(f"{a.file}: no such file (give a profile YAML, a vLLM --config YAML, "
                                    "a file holding a `vllm serve` command line, or - for stdin)")
                else:
                    text, label = read_text_limited(path), str(path)
            warns: list[str] = []
            p = import_text(text, a.name, label, warns)
            for w in warns:
                print(f"warning: {w}", file=sys.stderr)
            path = lib.save(p, overwrite=a.force)
            print(f"imported profile {p.name!r} → {path}")
            return 0
        if a.action == "delete":
            print(f"deleted {lib.delete(a.name)}")
            return 0
        if a.action == "save-run":
            # deferred: only this command needs it (vllm-dyno starts light)
            from app.history import best_run, get_run, profile_from_run
            from app.store import RunStore

            with RunStore() as store:
                rid = a.run_id
                if a.which == "best":  # the best run recorded for the same profile
                    rid = best_run(store, get_run(store, rid)["name"]) or rid
                p = profile_from_run(store, rid, a.name, which=a.which)
            path = lib.save(p, overwrite=a.force)
            print(f"saved run {rid} as profile {p.name!r} → {path}")
            return 0
    except ProfileError as e:
        return err(str(e))
    except (ProfileNotFound, FileExistsError, PermissionError, LookupError, ValueError) as e:
        return err(str(e))
    except OSError as e:  # the profiles folder cannot be written (a read-only home, a full disk)
        print(f"vllm-dyno profiles: cannot write {getattr(e, 'filename', None) or 'the profile'}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 1
    return err(f"unknown action {a.action}")


def register(sub) -> None:
    p = sub.add_parser("profiles", help="tuning profiles: list, show, export, import, delete, save-run")
    ps = p.add_subparsers(dest="action", required=True)
    ps.add_parser("list", help="user and built-in profiles (bad files are reported, the rest still load)")
    x = ps.add_parser("show", help="print a profile as YAML")
    x.add_argument("name")
    x = ps.add_parser("export", help="a profile as a `vllm serve` command line, a vLLM --config YAML or a profile")
    x.add_argument("name")
    x.add_argument("--format", choices=["cmd", "yaml", "profile"], default="cmd")
    x.add_argument("--program", default="vllm serve", help="cmd: how vLLM is run (default %(default)r)")
    x.add_argument("-o", "--output", type=output_file, help="write to this file (atomically) instead of stdout")
    x = ps.add_parser("import", help="import a profile YAML, a vLLM --config YAML or a `vllm serve` command line")
    x.add_argument("file", help="file, '-' for stdin, or a quoted command line")
    x.add_argument("--name", help="profile name (default: the file's, or the model's)")
    x.add_argument("--force", action="store_true", help="replace a user profile of the same name")
    x = ps.add_parser("delete", help="delete a user profile (built-ins are read-only)")
    x.add_argument("name")
    x = ps.add_parser("save-run", help="save a recorded run's settings and results as a profile")
    x.add_argument("run_id", type=run_number)
    x.add_argument("--name", help="profile name (default: the run's)")
    x.add_argument("--which", choices=["latest", "best"], default="latest",
                   help="best: take the results of the best run recorded for the same profile")
    x.add_argument("--force", action="store_true", help="replace a user profile of the same name")
    p.set_defaults(func=cmd_profiles)
