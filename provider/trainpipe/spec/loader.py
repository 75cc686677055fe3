"""Stage 1 of compilation: YAML text -> plain data plus the line/column of every key.

``yaml.safe_load`` semantics only (no Python tags, no environment expansion). The positions are
kept on the side, keyed by the field path, so later stages can point at ``file:line:col``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainpipe.errors import SpecError, SpecProblem

FieldPath = tuple[str | int, ...]


# libyaml when available: same safe semantics, several times faster (parse speed matters to Airflow).
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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


def _walk(node: yaml.Node, path: FieldPath, loaded: LoadedYaml, problems: list[SpecProblem]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            child = (*path, key)
            position = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in seen:
                line, column = position
                problems.append(
                    SpecProblem(loaded.file, line, column, format_path(child),
                                "duplicate key; YAML would silently keep only the last one, remove one")
                )
            seen.add(key)
            loaded.positions.setdefault(child, position)
            _walk(value_node, child, loaded, problems)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            loaded.positions.setdefault(child, (item.start_mark.line + 1, item.start_mark.column + 1))
            _walk(item, child, loaded, problems)


def load_yaml_text(text: str, file: str) -> LoadedYaml:
    """Parse one YAML document safely; syntax errors and duplicate keys become a ``SpecError``."""
    loader = _SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        if isinstance(err, yaml.constructor.ConstructorError):
            reason = (f"{err.problem}; specs are read with yaml.safe_load, so language-specific tags "
                      "(!!python/...) are refused: write plain values")
        else:
            reason = f"YAML syntax error: {err.problem or err}"
        raise SpecError([SpecProblem(file, line, column, "", reason)]) from None
    except yaml.YAMLError as err:
        raise SpecError([SpecProblem(file, None, None, "", f"YAML error: {err}")]) from None
    finally:
        loader.dispose()
    loaded = LoadedYaml(file=file, data=data)
    problems: list[SpecProblem] = []
    if node is not None:
        loaded.positions[()] = (node.start_mark.line + 1, node.start_mark.column + 1)
        _walk(node, (), loaded, problems)
    if problems:
        raise SpecError(problems)
    return loaded


def load_yaml_file(path: Path, display_name: str | None = None) -> LoadedYaml:
    return load_yaml_text(path.read_text(encoding="utf-8"), display_name or str(path))


def merge_defaults(defaults: LoadedYaml, spec: LoadedYaml) -> LoadedYaml:
    """``spec`` over ``defaults``: mappings merge key by key, anything else in the spec wins whole.

    Positions of values taken from the defaults keep pointing into the defaults file.
    """
    if not isinstance(defaults.data, dict) or not isinstance(spec.data, dict):
        return spec
    merged = LoadedYaml(file=spec.file, data=None, positions=dict(spec.positions), origins=dict(spec.origins))

    def take_from_defaults(path: FieldPath) -> None:
        for key, position in defaults.positions.items():
            if key[: len(path)] == path and key not in merged.positions:
                merged.positions[key] = position
                merged.origins[key] = defaults.origins.get(key, defaults.file)

    def merge(base: Any, top: Any, path: FieldPath) -> Any:
        if isinstance(base, dict) and isinstance(top, dict):
            out = dict(top)
            for key, value in base.items():
                if key in top:
                    out[key] = merge(value, top[key], (*path, key))
                else:
                    out[key] = value
                    take_from_defaults((*path, key))
            return out
        return top

    merged.data = merge(defaults.data, spec.data, ())
    return merged
