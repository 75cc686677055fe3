"""Write docs/reference/spec.md, the spec field reference, from the spec's JSON Schema.

    python tools/gen_spec_reference.py           # rewrite the page
    python tools/gen_spec_reference.py --check   # exit 1 when the committed page is stale

The schema is generated from the pydantic models (``trainpipe.spec.schema``), so a field's type,
default, description and examples are written once, on the model; this page only lays them out:
one table per mapping of the spec, every field with its path. ``make docs`` runs it first, and
``tests/docs/test_spec_reference.py`` fails when the committed page differs from its output.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REFERENCE_PATH = REPO / "docs" / "reference" / "spec.md"
COMMAND = "python tools/gen_spec_reference.py"

# The schema's spelling of a duration ("30m", "1h30m"); see trainpipe.spec.types.
DURATION_PATTERN = r"^\s*(\d+\s*[smhdw]\s*)+$"
ISO_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")

Schema = dict[str, Any]


@dataclass
class Section:
    """One mapping of the spec: the fields under ``path`` (its first place in the spec)."""

    path: str
    schema: Schema
    also_at: list[str] = field(default_factory=list)


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if ref else node


def _variants(node: Schema) -> list[Schema]:
    """The alternatives of a field (``anyOf``), flattened; a plain node is its own one variant."""
    if "anyOf" not in node:
        return [node]
    return [leaf for option in node["anyOf"] for leaf in _variants(option)]


def _is_duration(variants: list[Schema]) -> bool:
    return any(v.get("pattern") == DURATION_PATTERN for v in variants)


def _is_mapping_with_fields(node: Schema) -> bool:
    return "properties" in node


def _anchor(path: str) -> str:
    # The same slug MkDocs' toc extension gives the heading "`path`": word characters and dashes only.
    return re.sub(r"[^\w\- ]", "", path).strip().lower().replace(" ", "-")


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def _literal(value: Any) -> str:
    """A value as a spec author would write it in YAML (flow style), in a code span."""
    if isinstance(value, str):
        return _code(value) if value.strip() else _code(json.dumps(value))
    return _code(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))


def _friendly_duration(iso: str) -> str | None:
    match = ISO_DURATION.match(iso)
    if not match or iso in {"P", "PT"}:
        return None
    days, hours, minutes, seconds = match.groups()
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    if seconds:
        parts.append(f"{float(seconds):g}s")
    return "".join(parts) or None


class Reference:
    def __init__(self, schema: Schema) -> None:
        self.defs: dict[str, Schema] = schema.get("$defs", {})
        self.root = schema
        self.sections: list[Section] = []
        self._section_of: dict[int, Section] = {}  # id() of a mapping's schema -> its section

    # ---- walking ------------------------------------------------------------------------------
    def collect(self) -> None:
        """Every mapping of the spec, depth first in the models' field order (a page reads top down)."""
        self._visit("", self.root)

    def _visit(self, path: str, schema: Schema) -> None:
        self._add_section(path, schema)
        for name, prop in schema.get("properties", {}).items():
            field_path = f"{path}.{name}" if path else name
            for child_path, child in self._mappings_below(field_path, prop):
                known = self._section_of.get(id(child))
                if known is None:
                    self._visit(child_path, child)
                elif child_path != known.path and child_path not in known.also_at:
                    known.also_at.append(child_path)

    def _add_section(self, path: str, schema: Schema) -> Section:
        section = Section(path=path, schema=schema)
        self.sections.append(section)
        self._section_of[id(schema)] = section
        return section

    def _mappings_below(self, path: str, node: Schema) -> list[tuple[str, Schema]]:
        """The mappings with fields that a field holds: itself, its list items, or its map values."""
        found = []
        for variant in _variants(node):
            target = _resolve(variant, self.defs)
            if _is_mapping_with_fields(target):
                found.append((path, target))
            elif target.get("type") == "array" and isinstance(target.get("items"), dict):
                found += self._mappings_below(f"{path}[]", target["items"])
            elif isinstance(target.get("additionalProperties"), dict):
                found += self._mappings_below(f"{path}.<name>", target["additionalProperties"])
        return found

    # ---- rendering ----------------------------------------------------------------------------
    def type_of(self, node: Schema, path: str) -> str:
        variants = _variants(node)
        if _is_duration(variants):
            rest = [v for v in variants if v.get("pattern") != DURATION_PATTERN and v.get("type") != "integer"]
            return " or ".join(["duration", *(self._one_type(v, path) for v in rest)])
        return " or ".join(dict.fromkeys(self._one_type(v, path) for v in variants))

    def _one_type(self, variant: Schema, path: str) -> str:
        target = _resolve(variant, self.defs)
        if "const" in target:
            return _literal(target["const"])
        if "enum" in target:
            return "one of " + ", ".join(_literal(v) for v in target["enum"])
        if _is_mapping_with_fields(target):
            section = self._section_of.get(id(target))
            return f"mapping ([fields](#{_anchor(section.path)}))" if section else "mapping"
        kind = target.get("type")
        if isinstance(kind, list):
            return " or ".join("mapping" if k == "object" else k for k in kind)
        if kind == "array":
            if "prefixItems" in target:
                return "[" + ", ".join(self._one_type(item, path) for item in target["prefixItems"]) + "]"
            items = target.get("items")
            item_type = self.type_of(items, f"{path}[]") if isinstance(items, dict) else "values"
            return f"list of ({item_type})" if " or " in item_type else f"list of {item_type}"
        if kind == "object":
            values = target.get("additionalProperties")
            if isinstance(values, dict):
                return "mapping of name to " + self.type_of(values, f"{path}.<name>")
            if "patternProperties" in target:
                return "mapping of one name to its arguments"
            return "mapping"
        words = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean", "null": "null"}
        text = words.get(kind, kind or "any")
        return text + self._bounds(target)

    @staticmethod
    def _bounds(target: Schema) -> str:
        bounds = []
        for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
            if key in target:
                bounds.append(f"{sign} {target[key]:g}" if isinstance(target[key], float) else f"{sign} {target[key]}")
        if "minItems" in target:
            bounds.append(f"at least {target['minItems']} items")
        return f" ({', '.join(bounds)})" if bounds else ""

    def default_of(self, name: str, node: Schema, required: set[str]) -> str:
        if name in required:
            return "required"
        if "default" not in node:
            return "optional"
        default = node["default"]
        if isinstance(default, str) and _is_duration(_variants(node)):
            friendly = _friendly_duration(default)
            if friendly:
                return _code(friendly)
        return _literal(default)

    @staticmethod
    def example_of(node: Schema) -> str:
        examples = node.get("examples") or []
        return "<br>".join(_literal(example) for example in examples[:2])

    @staticmethod
    def _cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    def render(self) -> str:
        lines = [
            "# Spec field reference",
            "",
            f"<!-- Generated from the spec's JSON Schema by `{COMMAND}`: edit the pydantic models in",
            "provider/trainpipe/spec/, not this page. -->",
            "",
            "Every field of a spec, generated from its JSON Schema (`trainpipe schema`, committed as",
            "`provider/trainpipe/spec/schema.json`, which editors use for completion). A path names a field",
            "from the top of the file; `[]` is an item of a list and `<name>` a key you choose. A duration",
            "is written `30d`, `20m`, `1h30m` (s, m, h, d, w) or as whole seconds. How the fields work",
            "together: [Writing specs](../specs.md).",
            "",
        ]
        for section in self.sections:
            title = "Top level" if not section.path else _code(section.path)
            lines += [f"## {title}", ""]
            if section.also_at:
                lines += ["The same fields at " + ", ".join(_code(p) for p in section.also_at) + ".", ""]
            description = section.schema.get("description")
            if description and section.path:
                lines += [self._cell(description), ""]
            lines += ["| field | type | default | description | example |", "| --- | --- | --- | --- | --- |"]
            required = set(section.schema.get("required", []))
            for name, prop in section.schema.get("properties", {}).items():
                path = f"{section.path}.{name}" if section.path else name
                row = [
                    _code(path),
                    self.type_of(prop, path),
                    self.default_of(name, prop, required),
                    prop.get("description", ""),
                    self.example_of(prop),
                ]
                lines.append("| " + " | ".join(self._cell(cell) for cell in row) + " |")
            lines.append("")
        return "\n".join(lines)


def render_reference(schema: Schema) -> str:
    reference = Reference(schema)
    reference.collect()
    return reference.render()


def current_reference() -> str:
    from trainpipe.spec.schema import spec_json_schema

    return render_reference(spec_json_schema())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed page is stale")
    args = parser.parse_args(argv)
    text = current_reference()
    relative = REFERENCE_PATH.relative_to(REPO)
    if args.check:
        if not REFERENCE_PATH.exists() or REFERENCE_PATH.read_text(encoding="utf-8") != text:
            print(f"{relative} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    REFERENCE_PATH.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
