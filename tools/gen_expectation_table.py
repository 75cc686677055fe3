"""Regenerate provider/trainpipe/spec/expectation_arguments.json from the installed Great Expectations
(after a GE upgrade: tests/spec/test_expectation_arguments.py says when)."""

from trainpipe.spec.expectations import TABLE_FILE, generate_table, render_table
from trainpipe.steps.validate.quality import expectation_class, expectation_names

if __name__ == "__main__":
    classes = {name: expectation_class(name) for name in expectation_names()}
    TABLE_FILE.write_text(render_table(generate_table(classes)), encoding="utf-8")
    print(f"wrote {TABLE_FILE.name}")
