"""Stage 1 of compilation: YAML text -> plain data plus the line/column of every key.

``yaml.safe_load`` semantics only (no Python tags, no environment expansion). The positions are
kept on the side, keyed by the field path, so later stages can point at ``file:line:col``.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainpipe.errors import SpecError, SpecProblem

FieldPath = tuple[str | int, ...]

# What one spec file may be (ADR 0004). A real spec is a few KB, a few hundred nodes, nested under
# ten levels; each limit is far above that and far below what would stall a DAG-file parse. They
# are checked before any value is built, so a hostile file costs milliseconds, not gigabytes.
MAX_SPEC_BYTES = 1_048_576  # 1 MiB, checked before the file is read in full
# Keys, values and items, each alias counting as the nodes it stands for. Also bounds validation:
# a file of 10,000 mistakes takes about a second of CPU to report (a did-you-mean per mistake).
MAX_SPEC_NODES = 10_000
MAX_SPEC_DEPTH = 32  # mappings and lists nested in one another
# A file with at most this many YAML indicators (each mapping or list needs one of `[ { - ? : ,`
# of its own) holds at most twice as many nodes, nested at most this deep, so libyaml composes it
# with a short C recursion (about 1.3 MB of stack). A longer one has its events counted first: a
# 200 KB run of `[` overflows the composer's C stack. Every example spec is shorter than this.
_COMPOSE_WITHOUT_SCAN = 4_000


_TAGS: dict[tuple[Any, ...], str] = {}


class _SpecLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """``yaml.safe_load``'s loader (libyaml when available), with its implicit-tag resolution memoised.

    Resolving a plain scalar's tag runs up to a dozen regular expressions; it depends only on the
    node kind, the text and the implicit flags (the safe loader has no path resolvers), and the same
    keys and values recur in every spec, so the answers are kept.
    """

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        key = (kind, value, implicit)
        tag = _TAGS.get(key)
        if tag is None:
            tag = super().resolve(kind, value, implicit)
            if len(_TAGS) < 100_000:
                _TAGS[key] = tag
        return tag

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        pass  # path resolvers only; the safe loader has none

    def ascend_resolver(self) -> None:
        pass


@dataclass(slots=True)
class LoadedYaml:
    file: str
    data: Any
    # Position (1-based line, column) of each mapping key / sequence item, by field path.
    positions: dict[FieldPath, tuple[int, int]] = field(default_factory=dict)
    # Paths whose value came from another file (a _defaults.yaml), with that file's name.
    origins: dict[FieldPath, str] = field(default_factory=dict)

    def location_of(self, path: FieldPath) -> tuple[str, int | None, int | None]:
        """File, line and column of ``path``, or of its nearest ancestor that has a position."""
        for end in range(len(path), -1, -1):
            key = tuple(path[:end])
            found = self.positions.get(key)
            if found is not None:
                return self.origins.get(key, self.file), found[0], found[1]
        return self.file, None, None

    def problem(self, path: FieldPath, message: str) -> SpecProblem:
        file, line, column = self.location_of(path)
        return SpecProblem(file, line, column, format_path(path), message)


def format_path(path: FieldPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
# Plain scalars built directly, with PyYAML's own safe constructors (same YAML 1.1 rules as safe_load).
_SCALARS = {
    tag: yaml.constructor.SafeConstructor.yaml_constructors[tag]
    for tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
}
_SPECIAL_KEYS = ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")


def _position(node: yaml.Node) -> tuple[int, int]:
    """1-based line and column where ``node`` starts."""
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    """One pass over the composed node tree: builds the values and records every key's position.

    Building the values here instead of in a second pass (``construct_document``) takes a quarter
    off loading a spec, 0.64 -> 0.47 ms for the example (Airflow re-parses every spec every few
    seconds). Anything beyond plain maps, lists, strings, numbers, booleans and nulls (timestamps,
    merge keys, explicit tags) is handed to PyYAML's safe constructor, so the result is always what
    ``yaml.safe_load`` returns.

    The same pass enforces ``MAX_SPEC_NODES`` and ``MAX_SPEC_DEPTH``: an alias is walked again each
    time it is used (values are built anew, as ``safe_load``'s copies would be walked by pydantic),
    and each collection adds its children to the count before any of them is built, so the walk
    stops within one collection of the limit instead of expanding an alias bomb.
    """

    def __init__(self, loader: Any, loaded: LoadedYaml, text: str) -> None:
        self.loader = loader
        self.loaded = loaded
        self.text = text
        self.problems: list[SpecProblem] = []
        self._open: set[int] = set()  # nodes being built: an alias back to one of them is a cycle
        self.nodes = 1  # the root

    def _enter(self, node: yaml.Node, path: FieldPath) -> None:
        """Cycle, depth and node-count checks for a mapping or sequence about to be walked."""
        if id(node) in self._open:
            raise yaml.constructor.ConstructorError(None, None, "found a recursive alias", node.start_mark)
        if len(path) >= MAX_SPEC_DEPTH:
            raise SpecError([SpecProblem(self.loaded.file, *_position(node), format_path(path), _DEPTH_MESSAGE)])
        self.nodes += 2 * len(node.value) if isinstance(node, yaml.MappingNode) else len(node.value)
        if self.nodes > MAX_SPEC_NODES:
            raise _too_many_nodes(self.text, self.loaded.file, node)
        self._open.add(id(node))

    def build(self, node: yaml.Node, path: FieldPath) -> Any:
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _STR:
                return node.value
            scalar = _SCALARS.get(node.tag)
            return scalar(self.loader, node) if scalar else self.loader.construct_object(node, deep=True)
        self._enter(node, path)
        try:
            if isinstance(node, yaml.MappingNode):
                if node.tag == _MAP and not any(key.tag in _SPECIAL_KEYS for key, _ in node.value):
                    return self._mapping(node, path)
            elif node.tag == _SEQ:
                items = []
                for index, item in enumerate(node.value):
                    child = (*path, index)
                    self.loaded.positions.setdefault(child, _position(item))
                    items.append(self.build(item, child))
                return items
            self._record(node, path)
            return self.loader.construct_object(node, deep=True)
        finally:
            self._open.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: FieldPath) -> Any:
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.build(key_node, (*path, "<key>"))
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                        "found unhashable key", key_node.start_mark) from None
            child = (*path, key)
            position = _position(key_node)
            if key in mapping:
                self.problems.append(SpecProblem(
                    self.loaded.file, *position, format_path(child),
                    "duplicate key; YAML would silently keep only the last one, remove one"))
            self.loaded.positions.setdefault(child, position)
            mapping[key] = self.build(value_node, child)
        return mapping

    def _record(self, node: yaml.Node, path: FieldPath) -> None:
        """Positions inside a node PyYAML builds (keys of merged mappings, items of tagged sequences),
        and the limits for everything under it (``node`` itself was counted by ``_enter``)."""
        if isinstance(node, yaml.MappingNode):
            pairs: list[tuple[yaml.Node, FieldPath]] = []
            for key_node, value_node in node.value:
                # A key that is itself a collection gets the path _mapping gives a key's own nodes.
                child = (*path, key_node.value if isinstance(key_node, yaml.ScalarNode) else "<key>")
                pairs += ((key_node, child), (value_node, child))
        elif isinstance(node, yaml.SequenceNode):
            pairs = [(item, (*path, index)) for index, item in enumerate(node.value)]
        else:
            return
        for child_node, child in pairs:
            self.loaded.positions.setdefault(child, _position(child_node))
            if not isinstance(child_node, yaml.ScalarNode):
                self._enter(child_node, child)
                try:
                    self._record(child_node, child)
                finally:
                    self._open.discard(id(child_node))


_DEPTH_MESSAGE = f"nested more than {MAX_SPEC_DEPTH} levels deep, the limit for a spec; flatten this part of the file"


def _nodes_message(alias: str | None, size: int) -> str:
    limit = f"the limit of {MAX_SPEC_NODES:,} YAML nodes per spec (an alias counts as the nodes it stands for)"
    if alias is not None:
        return (f"alias *{alias} stands for {size:,} nodes and takes the file past {limit}; aliases of aliases "
                "multiply (\"billion laughs\"): write the values out, or alias only small values")
    return f"the file goes past {limit}; split it into smaller specs"


def _scan_events(text: str, file: str, *, check_depth: bool) -> None:
    """Walk the YAML events (libyaml's parser keeps its own stack, so any depth is safe here) and
    raise at the first event that takes the file past ``MAX_SPEC_DEPTH`` (if ``check_depth``) or
    ``MAX_SPEC_NODES``, located at that event: an alias counts as the nodes of its anchor's value.
    Returns when the file is within the limits, or is not YAML (composing it reports the error)."""
    nodes = 0
    sizes: dict[str, int] = {}  # anchor -> nodes in its value
    open_anchors: list[tuple[str | None, int]] = []  # per open collection: its anchor, nodes before it
    loader = _SpecLoader(text)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.AliasEvent):
                size = sizes.get(event.anchor, 1)
                nodes += size
                alias: str | None = event.anchor
            elif isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent):
                nodes += 1
                alias, size = None, 1
                if isinstance(event, yaml.ScalarEvent):
                    if event.anchor is not None:
                        sizes[event.anchor] = 1
                else:
                    open_anchors.append((event.anchor, nodes - 1))
                    if check_depth and len(open_anchors) > MAX_SPEC_DEPTH:
                        raise SpecError([SpecProblem(file, *_mark_position(event.start_mark), "", _DEPTH_MESSAGE)])
            else:
                if isinstance(event, yaml.CollectionEndEvent):
                    anchor, before = open_anchors.pop()
                    if anchor is not None:
                        sizes[anchor] = nodes - before
                continue
            if nodes > MAX_SPEC_NODES:
                raise SpecError([SpecProblem(file, *_mark_position(event.start_mark), "", _nodes_message(alias, size))])
    except yaml.YAMLError:
        return
    finally:
        loader.dispose()


def _too_many_nodes(text: str, file: str, node: yaml.Node) -> SpecError:
    """The builder went past ``MAX_SPEC_NODES``; the event scan finds the alias (or node) that did it,
    which the composed tree cannot tell (an alias is the anchor's own node there)."""
    try:
        _scan_events(text, file, check_depth=False)
    except SpecError as err:
        return err
    return SpecError([SpecProblem(file, *_position(node), "", _nodes_message(None, 0))])


def _mark_position(mark: Any) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


def _offset_position(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of byte ``offset``; the bytes before it are UTF-8."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", errors="replace")) + 1
    return data.count(b"\n", 0, offset) + 1, column


def _too_big(file: str) -> SpecError:
    return SpecError([SpecProblem(file, 1, 1, "", (
        f"the file is larger than {MAX_SPEC_BYTES:,} bytes, the limit for a spec (a spec is a few KB); "
        "split it into smaller specs"))])


def load_yaml_text(text: str, file: str) -> LoadedYaml:
    """Parse one YAML document safely; syntax errors, duplicate keys and files beyond the limits
    (``MAX_SPEC_*``) become a ``SpecError`` located at the offending line and column."""
    if len(text) > MAX_SPEC_BYTES:  # characters <= bytes: a longer text is over the byte limit too
        raise _too_big(file)
    # Counting is cheap (C), scanning is not: only a file that could nest deep enough to matter is scanned.
    if len(text) > _COMPOSE_WITHOUT_SCAN and sum(map(text.count, "[{-?:,")) > _COMPOSE_WITHOUT_SCAN:
        _scan_events(text, file, check_depth=True)
    loaded = LoadedYaml(file=file, data=None)
    loader = _SpecLoader(text)
    builder = _Builder(loader, loaded, text)
    try:
        node = loader.get_single_node()
        if node is None:
            loaded.positions[()] = (1, 1)  # an empty or comment-only file: its errors point at its start
        else:
            loaded.positions[()] = _position(node)
            loaded.data = builder.build(node, ())
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line, column = _mark_position(mark) if mark else (1, 1)
        if isinstance(err, yaml.constructor.ConstructorError) and "constructor for the tag" in (err.problem or ""):
            reason = (f"{err.problem}; specs are read with yaml.safe_load, so language-specific tags "
                      "(!!python/...) are refused: write plain values")
        elif isinstance(err, yaml.constructor.ConstructorError):
            reason = f"{err.problem}; write plain values"
        else:
            reason = f"YAML syntax error: {err.problem or err}"
        raise SpecError([SpecProblem(file, line, column, "", reason)]) from None
    except yaml.reader.ReaderError as err:
        # A character YAML does not allow (a control character): located by its offset in the UTF-8 text.
        line, column = _offset_position(text.encode("utf-8", errors="replace"), err.position)
        code = err.character if isinstance(err.character, int) else ord(err.character)  # libyaml: int
        raise SpecError([SpecProblem(file, line, column, "", (
            f"YAML does not allow the character U+{code:04X} ({err.reason}); remove it"))]) from None
    except yaml.YAMLError as err:
        raise SpecError([SpecProblem(file, 1, 1, "", f"YAML error: {err}")]) from None
    finally:
        loader.dispose()
    if builder.problems:
        raise SpecError(builder.problems)
    return loaded


LINK_OUT_OF_FOLDER = ("a symbolic link (or a linked folder) to a file outside the specs folder; trainpipe reads only the "
                      "specs folder's own files: copy the file into the folder, or link to a file inside it")


def read_spec_text(path: Path, display_name: str | None = None, *, inside: Path | None = None) -> str:
    """The text of a spec or defaults file: refused by size before it is read in full, and located
    at the first byte that is not UTF-8. ``OSError`` (missing, unreadable) is the caller's.

    ``inside``: the specs folder (resolved) the file belongs to. A symbolic link is then followed only
    to a file inside it; one to anywhere else is refused unread, the same whether its target exists or
    not, so no error ever shows a line of a worker's file (``/etc/shadow``, a token) or says it exists."""
    file = display_name or str(path)
    # Non-blocking, so that a named pipe dropped into the folder is refused instead of hanging the parse.
    flags = os.O_RDONLY | os.O_NONBLOCK
    try:
        fd = os.open(path, flags if inside is None else flags | os.O_NOFOLLOW)
    except OSError as err:
        if inside is None or err.errno != errno.ELOOP:
            raise
        # A link (the common case pays nothing: a plain file opens at once): its target, if inside.
        target = Path(os.path.realpath(path))
        if not target.is_relative_to(inside):
            raise SpecError([SpecProblem(file, 1, 1, "", LINK_OUT_OF_FOLDER)]) from None
        fd = os.open(target, flags | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SpecError([SpecProblem(file, 1, 1, "", "not a regular file (a folder, pipe or device); a spec is a "
                                                         "plain text file: rename or move it")])
        if info.st_size > MAX_SPEC_BYTES:
            raise _too_big(file)
        # Read what the size promises, plus whatever the file grew by, never past the limit.
        chunks: list[bytes] = []
        total, wanted = 0, info.st_size + 1
        while total <= MAX_SPEC_BYTES:
            chunk = os.read(fd, min(max(wanted - total, 65_536), MAX_SPEC_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > MAX_SPEC_BYTES:
        raise _too_big(file)
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = _offset_position(data, err.start)
        raise SpecError([SpecProblem(file, line, column, "", (
            f"the file is not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start}, as an editor saving "
            "Latin-1 or Windows-1252 writes an accented letter); save the file as UTF-8"))]) from None


def load_yaml_file(path: Path, display_name: str | None = None) -> LoadedYaml:
    return load_yaml_text(read_spec_text(path, display_name), display_name or str(path))


def merge_defaults(defaults: LoadedYaml, spec: LoadedYaml) -> LoadedYaml:
    """``spec`` over ``defaults``: mappings merge key by key, anything else in the spec wins whole.

    Positions of values taken from the defaults keep pointing into the defaults file.
    """
    if not isinstance(defaults.data, dict) or not isinstance(spec.data, dict):
        return spec
    merged = LoadedYaml(file=spec.file, data=None, positions=dict(spec.positions), origins=dict(spec.origins))
    taken: set[FieldPath] = set()  # paths whose whole value comes from the defaults

    def merge(base: Any, top: Any, path: FieldPath) -> Any:
        if isinstance(base, dict) and isinstance(top, dict):
            out = dict(top)
            for key, value in base.items():
                if key in top:
                    out[key] = merge(value, top[key], (*path, key))
                else:
                    out[key] = value
                    taken.add((*path, key))
            return out
        return top

    merged.data = merge(defaults.data, spec.data, ())
    # One pass over the defaults' positions (each checked against its at most MAX_SPEC_DEPTH
    # prefixes), not one per taken key: that was quadratic in the size of a _defaults.yaml.
    if taken:
        for key, position in defaults.positions.items():
            if key not in merged.positions and any(key[:end] in taken for end in range(1, len(key) + 1)):
                merged.positions[key] = position
                merged.origins[key] = defaults.origins.get(key, defaults.file)
    return merged
