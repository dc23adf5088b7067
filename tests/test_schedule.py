"""make test's schedule (conftest.py): a notebook's test is its own scope, any other test's scope is its module; scopes
are collected longest first by tests/durations.json, each scope's tests kept together and in order."""
import json
from types import SimpleNamespace

from conftest import DURATIONS, UNTIMED_S, longest_first, scope_of


def test_scope_of_a_notebook_and_of_a_module_test():
    assert scope_of("tests/test_notebooks.py::test_notebook[pix/04_reward]") == "tests/test_notebooks.py::test_notebook[pix/04_reward]"
    assert scope_of("tests/test_reward.py::test_x[shaped_v3c]") == "tests/test_reward.py"
    assert scope_of("tests/test_notebooks.py::test_a_failing_notebook_fails") == "tests/test_notebooks.py"


def test_longest_scope_first_and_each_scope_together():
    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/test_notebooks.py::test_notebook[x]",
           "tests/c.py::t1", "tests/b.py::t2"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    seconds = {"tests/a.py": 5.0, "tests/b.py": 50.0, "tests/test_notebooks.py::test_notebook[x]": 20.0}   # c: untimed
    got = [i.nodeid for i in longest_first(items, seconds)]
    assert UNTIMED_S < 20.0
    assert got == ["tests/b.py::t1", "tests/b.py::t2", "tests/test_notebooks.py::test_notebook[x]", "tests/c.py::t1",
                   "tests/a.py::t1", "tests/a.py::t2"]


def test_durations_file_names_scopes_with_seconds():
    "tests/durations.json (written by a run with PIXRL_TEST_DURATIONS): scope -> seconds, the notebooks' scopes among them."
    seconds = json.loads(DURATIONS.read_text())
    assert all(isinstance(v, (int, float)) and v >= 0 for v in seconds.values())
    assert scope_of("tests/test_notebooks.py::test_notebook[05_advantage]") in seconds
    assert "tests/test_reward.py" in seconds
