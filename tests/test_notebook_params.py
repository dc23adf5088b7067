"""Every papermill notebook's parameters are visible to `papermill --help-notebook`.

papermill's Python inspector reads a parameters cell line by line and drops (with only a log warning) any line
with more than one `=`: a comment such as `# 0 = the model default` hid `max_new_tokens` from the help of
bench, agent_loop and harvest. This test parses each `parameters` cell with papermill's own inspector."""
import json
import re
from pathlib import Path

import pytest
from papermill.translators import PythonTranslator

NBS = Path(__file__).parents[1] / "nbs"
ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)\s*(:[^=]+)?=")       # a top-level `name = …` or `name: type = …`


def parameter_cells():
    for path in sorted(NBS.glob("*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"]
                 if "parameters" in c.get("metadata", {}).get("tags", [])]
        if cells:
            yield path.name, "".join(cells[0]["source"])


def declared(source: str) -> list:
    "Names the parameters cell assigns at top level (the plain-regex reading, independent of papermill)."
    return [m.group(1) for line in source.splitlines() if (m := ASSIGNMENT.match(line))]


def test_the_suite_sees_parameter_cells():
    names = dict(parameter_cells())
    assert {"train.ipynb", "bench.ipynb", "base.ipynb"} <= set(names), sorted(names)


@pytest.mark.parametrize("name,source", list(parameter_cells()), ids=lambda v: v if v.endswith(".ipynb") else "")
def test_papermill_infers_every_parameter(name, source):
    inferred = [p.name for p in PythonTranslator.inspect({"source": source})]
    missing = [n for n in declared(source) if n not in inferred]
    assert not missing, f"{name}: papermill cannot parse {missing} (a second '=' on the line, e.g. in its comment)"


def test_a_second_equals_sign_hides_a_parameter():
    "The failure this guards against, shown on papermill itself: the same line with `0 = …` in its comment."
    ok = PythonTranslator.inspect({"source": "limit: int = 0   # 0: all tasks\n"})
    hidden = PythonTranslator.inspect({"source": "limit: int = 0   # 0 = all tasks\n"})
    assert [p.name for p in ok] == ["limit"] and hidden == []
