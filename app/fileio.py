"""Files the app reads and writes: atomic writes (profiles, settings, exports), reads of
a bounded size, and the one YAML loader every YAML read of the project goes through.

YAML read from a file a user may have been given (profiles, ``settings.yaml``, a vLLM
``--config`` file, calibration files) is untrusted. :func:`load_yaml` parses it with
:class:`LimitedLoader`, a ``yaml.SafeLoader`` (no tag builds a Python object) that
enforces :class:`YamlLimits`:

- size: the text is measured before the parser sees it (:attr:`YamlLimits.max_bytes`);
  :func:`read_text_limited` refuses a larger file without reading it;
- depth: collections nested deeper than :attr:`YamlLimits.max_depth` are refused as the
  parser's events arrive, before a node that deep is built (PyYAML's composer recurses:
  50,000 levels of ``[`` hit Python's recursion limit);
- aliases: at most :attr:`YamlLimits.max_aliases` (0: anchors and aliases refused), and
  the document counted with every alias expanded is at most
  :attr:`YamlLimits.max_nodes` nodes ("billion laughs": 359 bytes that expand to 10⁹
  nodes when anything walks the result — repr, pydantic, a copy);
- integers: at most :attr:`YamlLimits.max_int_chars` characters (a 5,000-digit integer
  raises a ValueError in ``int()`` from Python 3.11 on, and a 4,000-digit one would reach
  the options);
- duplicate keys in one mapping are refused (YAML says keys are unique; PyYAML keeps the
  last one silently). Keys brought in by a merge (``<<:``) may be overridden, as YAML
  specifies.

Every failure is one :class:`YamlError` (a ``ValueError``) with the reason, the line and
the dotted key where it happened: never a RecursionError, a MemoryError or a traceback.
The figures of the worst inputs before and after these limits: ``benchmarks/yaml_limits.py``.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode


def write_atomic(path: str | Path, text: str, newline: str | None = None) -> None:
    """Replace ``path`` with ``text`` atomically: temporary file in the same directory
    (``.NAME.*.tmp``), flush + fsync, ``os.replace``, fsync of the directory. On any
    error the temporary file is removed and the old file is untouched (OSError raised).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(p.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ---------------------------------------------------------------------- bounded YAML
@dataclass(frozen=True)
class YamlLimits:
    """What :func:`load_yaml` accepts. ``max_bytes``: UTF-8 size of the text;
    ``max_depth``: nesting of collections (the top-level mapping is depth 1);
    ``max_aliases``: ``*name`` references (0 also refuses ``&name`` anchors);
    ``max_nodes``: scalars + collections with every alias expanded; ``max_int_chars``:
    characters of one integer scalar (sign, digits, ``0x``, ``_`` and ``:`` included).

    The defaults are far above any file the app writes (a profile is a few KiB, depth 4,
    50–1,500 values; the GPU catalog 2,875) and below what hurts: the worst inputs they
    accept (a 1 MiB string, 20,000 values) load in about 1 s and 35–50 MiB on the 2-core
    development machine, and every refused one in under 0.4 s and 33 MiB
    (``benchmarks/yaml_limits.py``)."""

    max_bytes: int = 1 << 20
    max_depth: int = 64
    max_aliases: int = 100
    max_nodes: int = 20_000
    max_int_chars: int = 40


#: the limits of every YAML read that has no reason for others
DEFAULT_YAML_LIMITS = YamlLimits()


class YamlError(ValueError):
    """YAML that :func:`load_yaml` refuses: ``reason`` (what and the fix), ``line``
    (1-based, None when unknown) and ``key`` (dotted path of the mapping keys and
    ``[i]`` list indices where it happened, None at the top). ``str()``:
    ``KEY: REASON (line N)``; :attr:`located` is the same without the key."""

    def __init__(self, reason: str, line: int | None = None, key: str | None = None,
                 column: int | None = None) -> None:
        self.reason, self.line, self.key, self.column = reason, line, key, column
        super().__init__((f"{key}: " if key else "") + self.located)

    @property
    def located(self) -> str:
        """The reason and the place: ``REASON (line N[, column M])``."""
        if not self.line:
            return self.reason
        return self.reason + f" (line {self.line}" + (f", column {self.column})" if self.column else ")")


def _line(mark: Any) -> int | None:
    return mark.line + 1 if mark is not None else None


class LimitedLoader(yaml.SafeLoader):
    """A ``yaml.SafeLoader`` that enforces :class:`YamlLimits` (see the module
    docstring) and refuses duplicate keys; use it through :func:`load_yaml`."""

    def __init__(self, stream: str, limits: YamlLimits = DEFAULT_YAML_LIMITS) -> None:
        super().__init__(stream)
        self.limits = limits
        self._depth = 0
        self._aliases = 0
        #: id(node) → its node count with aliases expanded (the nodes live while the loader does)
        self._weight: dict[int, int] = {}
        #: id(node) → the dotted key path where it was composed (for the constructor's errors)
        self._where: dict[int, str | None] = {}
        #: the keys and indices from the root to the node being composed
        self._path: list[str] = []

    # -------------------------------------------------------------- composing
    def where(self) -> str | None:
        """The key path being composed (``server.env.A``, ``levels[3]``; a deep one
        shortened in the middle), or None at the top."""
        parts = self._path if len(self._path) <= 8 else [*self._path[:4], "…", *self._path[-3:]]
        out = ""
        for p in parts:
            out += p if p.startswith("[") or p == "…" or not out or out.endswith("…") else "." + p
        return out or None

    def _fail(self, reason: str, mark: Any) -> YamlError:
        return YamlError(reason, _line(mark), self.where())

    def compose_node(self, parent, index):  # type: ignore[override]
        pushed = True
        if isinstance(parent, MappingNode) and index is not None:  # a value: named by its key
            self._path.append(str(index.value) if isinstance(index, ScalarNode) else "?")
        elif isinstance(parent, SequenceNode):
            self._path.append(f"[{index}]")
        else:
            pushed = False  # the document's root, or a key
        try:
            return self._compose_counted(parent, index)
        except yaml.MarkedYAMLError as e:  # the scanner's or parser's: said where it happened
            raise _broken(e, self.where()) from None
        finally:
            if pushed:
                self._path.pop()

    def _compose_counted(self, parent, index):
        lim = self.limits
        ev = self.peek_event()
        if isinstance(ev, yaml.AliasEvent):
            if lim.max_aliases <= 0:
                raise self._fail("YAML aliases (*name) are not allowed here; write the value out", ev.start_mark)
            self._aliases += 1
            if self._aliases > lim.max_aliases:
                raise self._fail(f"more than {lim.max_aliases} YAML aliases (*name): not a file the app "
                                 "writes; write the values out", ev.start_mark)
            node = super().compose_node(parent, index)
            if id(node) not in self._weight:
                raise self._fail(f"the alias *{ev.anchor} refers to a collection that contains it", ev.start_mark)
            return node
        if lim.max_aliases <= 0 and getattr(ev, "anchor", None):
            raise self._fail("YAML anchors (&name) are not allowed here; write the value out", ev.start_mark)
        collection = isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if collection:
            self._depth += 1
            if self._depth > lim.max_depth:
                raise self._fail(f"nested deeper than {lim.max_depth} levels: not a file the app writes",
                                 ev.start_mark)
        where = self.where()
        try:
            node = super().compose_node(parent, index)
        finally:
            if collection:
                self._depth -= 1
        if isinstance(node, SequenceNode):
            children: list = node.value
        elif isinstance(node, MappingNode):
            children = [c for pair in node.value for c in pair]
        else:
            children = []
        w = 1 + sum(self._weight[id(c)] for c in children)
        if w > lim.max_nodes:
            raise YamlError(f"more than {lim.max_nodes:,} values once its aliases are expanded (a \"billion "
                            "laughs\" file?): not a file the app writes", _line(node.start_mark), where)
        self._weight[id(node)] = w
        self._where[id(node)] = where
        return node

    # -------------------------------------------------------------- constructing
    def _bad(self, reason: str, node: Any) -> YamlError:
        return YamlError(reason, _line(node.start_mark), self._where.get(id(node)))

    def construct_object(self, node, deep=False):  # type: ignore[override]
        try:
            return super().construct_object(node, deep=deep)
        except YamlError:
            raise
        except yaml.constructor.ConstructorError as e:
            raise YamlError(_tag_problem(e.problem), _line(e.problem_mark or node.start_mark),
                            self._where.get(id(node))) from None
        except Exception as e:  # a scalar constructor's ValueError, KeyError, AttributeError: a bad value
            tag = node.tag.rsplit(":", 1)[-1]
            value = f"{node.value!r:.60} " if isinstance(node, ScalarNode) else ""
            raise self._bad(f"{value}is not a valid {tag} ({type(e).__name__}: {e})", node) from None

    def construct_yaml_int(self, node):  # type: ignore[override]
        if isinstance(node.value, str) and len(node.value) > self.limits.max_int_chars:
            raise self._bad(f"an integer of {len(node.value):,} characters: write a number of at most "
                            f"{self.limits.max_int_chars} characters", node)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        if isinstance(node, MappingNode):
            seen: dict[Any, int | None] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # merged keys may be overridden (YAML's merge key)
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:
                    continue  # unhashable: the base constructor says so
                if dup:
                    where = self._where.get(id(node))
                    raise YamlError(f"duplicate key {key!r} (first at line {seen[key]}): keep one of them",
                                    _line(key_node.start_mark), f"{where}.{key}" if where else str(key))
                seen[key] = _line(key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


LimitedLoader.add_constructor("tag:yaml.org,2002:int", LimitedLoader.construct_yaml_int)


def load_yaml(text: str | bytes, limits: YamlLimits = DEFAULT_YAML_LIMITS) -> Any:
    """Parse one YAML document within ``limits`` (see the module docstring): plain
    values only (dict, list, str, int, float, bool, None, dates). Raises
    :class:`YamlError` for anything else, broken YAML included."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise YamlError(f"not UTF-8 text (byte {e.start})") from None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise YamlError(f"{_size(size)} is larger than {_size(limits.max_bytes)}: not a file the app writes")
    try:
        loader = LimitedLoader(text, limits)
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (the reader checks them all first)
        ch = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise YamlError(f"a character YAML does not allow: {ch} at character {e.position}; remove it") from None
    try:
        return loader.get_single_data()
    except yaml.constructor.ConstructorError as e:
        raise YamlError(_tag_problem(e.problem), _line(e.problem_mark)) from None
    except yaml.MarkedYAMLError as e:
        raise _broken(e, None) from None
    except yaml.YAMLError as e:
        raise YamlError(f"broken YAML: {e}") from None
    except RecursionError:  # not reached within max_depth; kept so that no input ends in a traceback
        raise YamlError(f"nested too deeply (the limit is {limits.max_depth} levels)") from None
    finally:
        loader.dispose()


def _broken(e: yaml.MarkedYAMLError, key: str | None) -> YamlError:
    mark = e.problem_mark
    return YamlError(f"broken YAML: {e.problem or e}", _line(mark), key,
                     mark.column + 1 if mark is not None else None)


def _tag_problem(problem: str | None) -> str:
    p = problem or "cannot be built"
    if "could not determine a constructor" in p:
        return f"YAML tag not allowed: {p}; the file holds plain values only, nothing that builds objects"
    return p


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"


def read_text_limited(path: str | Path, max_bytes: int = DEFAULT_YAML_LIMITS.max_bytes) -> str:
    """The UTF-8 text of ``path`` when it is at most ``max_bytes``; a larger file is
    refused before it is read. Raises :class:`YamlError` (too large, not UTF-8) or
    OSError (cannot be read)."""
    p = Path(path)
    size = p.stat().st_size
    if size > max_bytes:
        raise YamlError(f"{_size(size)} is larger than {_size(max_bytes)}: not a file the app writes")
    with p.open("rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise YamlError("grew past the size limit while being read: not a file the app writes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise YamlError(f"not UTF-8 text (byte {e.start})") from None


def read_yaml(path: str | Path, limits: YamlLimits = DEFAULT_YAML_LIMITS) -> Any:
    """:func:`load_yaml` of the file ``path`` (read with :func:`read_text_limited`).
    Raises :class:`YamlError` or OSError."""
    return load_yaml(read_text_limited(path, limits.max_bytes), limits)
