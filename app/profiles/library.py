"""Where profiles live: the user's ``profiles/`` directory and the read-only built-ins.

User profiles are ``<data dir>/profiles/<slug>.yaml`` (:func:`app.paths.profiles_dir`,
``VLLM_DYNO_HOME`` overrides the data dir). Built-ins are the YAML files of the
``profiles`` package (package data, read through :mod:`importlib.resources`); they are
never written: saving one writes a user copy of the same name, which then shadows the
built-in (delete the copy to get the built-in back).

:meth:`ProfileLibrary.scan` never raises for a bad file: it returns the profiles that
loaded, the files that did not (:class:`ProfileError` naming file, key, reason) and
the warnings (unknown keys dropped, migrations).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from app.paths import profiles_dir
from app.profiles.io import ProfileError, dump_profile, parse_profile, read_profile, write_atomic
from app.profiles.model import Profile, slugify

log = logging.getLogger(__name__)

BUILTIN_PACKAGE = "profiles"


@dataclass
class ProfileEntry:
    """One loaded profile: ``source`` ``builtin`` or ``user``; ``path`` its file (a
    package resource path for built-ins); ``warnings`` from loading it;
    ``shadows_builtin``: a user profile with a built-in's name."""

    profile: Profile
    source: str
    path: str
    warnings: list[str] = field(default_factory=list)
    shadows_builtin: bool = False

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def read_only(self) -> bool:
        return self.source == "builtin"


@dataclass
class ScanResult:
    """What :meth:`ProfileLibrary.scan` found: ``entries`` (user profiles first shadow
    built-ins of the same name; sorted by name), ``errors`` (one per unreadable file)."""

    entries: list[ProfileEntry] = field(default_factory=list)
    errors: list[ProfileError] = field(default_factory=list)

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def get(self, name: str) -> ProfileEntry | None:
        for e in self.entries:
            if e.name == name:
                return e
        key = slugify(name)
        for e in self.entries:
            if slugify(e.name) == key:
                return e
        return None


class ProfileNotFound(LookupError):
    """No profile of that name; the message lists the names there are."""

    def __str__(self) -> str:
        return str(self.args[0])


class ProfileLibrary:
    """The profiles a user can pick. ``directory``: user profiles (default
    :func:`app.paths.profiles_dir`); ``builtin``: include the package's built-ins."""

    def __init__(self, directory: str | Path | None = None, *, builtin: bool = True) -> None:
        if directory is None:
            directory = profiles_dir()
        self.directory = Path(directory)
        self.builtin = builtin
        try:  # where profiles are saved and imported to; a read-only home still lists them
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning("profiles folder %s cannot be made (%s): profiles can be read but not saved",
                        self.directory, e.strerror or e)

    # ------------------------------------------------------------------ reading
    def builtin_entries(self, errors: list[ProfileError] | None = None) -> list[ProfileEntry]:
        """The built-in profiles (bad ones go to ``errors``; they are a bug)."""
        out = []
        try:
            root = resources.files(BUILTIN_PACKAGE)
        except ModuleNotFoundError:
            return out
        for res in sorted(root.iterdir(), key=lambda r: r.name):
            if not res.name.endswith((".yaml", ".yml")):
                continue
            label = f"built-in {res.name}"
            warns: list[str] = []
            try:
                prof = parse_profile(res.read_text(encoding="utf-8"), label, warns)
            except ProfileError as e:
                log.error("%s", e)
                if errors is not None:
                    errors.append(e)
                continue
            out.append(ProfileEntry(prof, "builtin", str(res), warns))
        return out

    def user_files(self) -> list[Path]:
        """User profile files (hidden and temporary files left out)."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir()
                      if p.suffix in (".yaml", ".yml") and not p.name.startswith(".") and p.is_file())

    def scan(self) -> ScanResult:
        """Load everything; never raises for a bad file (see module docstring)."""
        res = ScanResult()
        user: list[ProfileEntry] = []
        for path in self.user_files():
            warns: list[str] = []
            try:
                prof = read_profile(path, warns)
            except ProfileError as e:
                log.warning("%s", e)
                res.errors.append(e)
                continue
            user.append(ProfileEntry(prof, "user", str(path), warns))
        builtins = self.builtin_entries(res.errors) if self.builtin else []
        user_names = {e.name for e in user}
        for e in user:
            e.shadows_builtin = any(b.name == e.name for b in builtins)
        res.entries = sorted(user + [b for b in builtins if b.name not in user_names],
                             key=lambda e: (e.name.lower(), e.source))
        return res

    def entry(self, name: str) -> ProfileEntry:
        """The profile called ``name`` (exact name, else the same slug). Raises
        :class:`ProfileNotFound` listing the names, or :class:`ProfileError` when
        the user's file of that name is unreadable."""
        res = self.scan()
        e = res.get(name)
        if e is not None:
            return e
        for err in res.errors:
            if Path(err.file).stem == slugify(name):
                raise err
        names = ", ".join(res.names()) or "(none)"
        raise ProfileNotFound(f"no profile named {name!r}; profiles: {names}")

    def get(self, name: str) -> Profile:
        """The Profile called ``name``; see :meth:`entry`."""
        return self.entry(name).profile

    # ------------------------------------------------------------------ writing
    def path_for(self, name: str) -> Path:
        """The user file a profile of this name is saved to."""
        return self.directory / f"{slugify(name)}.yaml"

    def save(self, profile: Profile, *, overwrite: bool = True) -> Path:
        """Write ``profile`` to the user directory atomically; returns the path.

        A built-in is never written: saving a profile with a built-in's name makes the
        user copy. With ``overwrite=False`` an existing user profile of the same file
        name raises FileExistsError naming it. A different profile whose name maps to
        the same file name also raises FileExistsError (rename one of them).
        """
        path = self.path_for(profile.name)
        if path.exists():
            if not overwrite:
                raise FileExistsError(f"a profile named {profile.name!r} exists ({path}); choose another name")
            try:
                old = read_profile(path)
                if old.name != profile.name:
                    raise FileExistsError(f"profile {old.name!r} already uses the file {path.name}; "
                                          f"choose a name that differs from it in letters or digits")
            except ProfileError:
                pass  # an unreadable file of that name: the save replaces it
        write_atomic(path, dump_profile(profile))
        return path

    def save_as(self, profile: Profile, new_name: str) -> tuple[Profile, Path]:
        """A copy named ``new_name`` saved (never overwrites). Returns (copy, path)."""
        copy = profile.updated(name=new_name)
        return copy, self.save(copy, overwrite=False)

    def delete(self, name: str) -> Path:
        """Delete the user profile ``name``; returns its path. Raises PermissionError for
        a built-in (read-only) and :class:`ProfileNotFound` when there is none."""
        e = self.entry(name)
        if e.read_only:
            raise PermissionError(f"{e.name!r} is a built-in profile and cannot be deleted; "
                                  "save a copy under another name to change it")
        Path(e.path).unlink()
        return Path(e.path)

    def rename(self, old: str, new: str) -> Path:
        """Rename a user profile (file and ``name``); returns the new path. A built-in
        is copied under the new name instead. Raises FileExistsError when ``new`` is
        taken."""
        e = self.entry(old)
        if self.path_for(new).exists() and slugify(new) != slugify(e.name):
            raise FileExistsError(f"a profile named {new!r} exists; choose another name")
        copy = e.profile.updated(name=new)
        old_path = Path(e.path)
        new_path = self.path_for(new)
        write_atomic(new_path, dump_profile(copy))
        if not e.read_only and old_path != new_path:
            old_path.unlink(missing_ok=True)
        return new_path
