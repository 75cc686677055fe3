"""Write (or check) the compiled plan and trainer config JSON of every example spec: tests/fixtures/compiled/.

`python tools/pin_compiled.py` rewrites the pins after an intended change of the plan or the trainer
config; tests/plan/test_compiled_pins.py fails on any other change (a restructuring keeps them byte-identical).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tests" / "fixtures" / "compiled"


def compiled(spec: Path) -> dict[str, str]:
    """{file name: text} of one example spec's plan and trainer config."""
    from trainpipe.compile.compiler import compile_file
    from trainpipe.settings import Settings

    plan = compile_file(spec, f"dag_configs/{spec.name}", configs_root=spec.parent, settings=Settings.from_env())
    plan_json = json.dumps(plan.to_dict(), indent=1, sort_keys=True, default=str) + "\n"
    # Where the checkout is differs per machine; the rest must not.
    plan_json = plan_json.replace(str(ROOT), "<repo>")
    return {f"{spec.stem}.plan.json": plan_json, f"{spec.stem}.trainer.json": plan.trainer.to_json() + "\n"}


def all_pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in sorted((ROOT / "dag_configs").glob("*.yaml")):
        out.update(compiled(spec))
    return out


if __name__ == "__main__":
    PINS.mkdir(parents=True, exist_ok=True)
    for name, text in all_pins().items():
        (PINS / name).write_text(text)
    print(f"wrote {len(list(PINS.glob('*.json')))} pins to {PINS.relative_to(ROOT)}", file=sys.stderr)
