"""Every notebook, run as `nbdev_test` runs it: nbdev's own `test_nb` (IN_TEST set, the cells tagged with settings.ini's
`tst_flags` skipped, the notebook's folder as working directory), one test per notebook, each its own scheduling scope (conftest.py).
`make test` runs the notebooks here rather than through `nbdev_test` so that one pool of workers schedules notebooks
and tests together, longest first (conftest.py): the two pools in a row left a worker idle at each one's end.
`nbdev_test` itself runs the same notebooks the same way."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from nbdev.config import get_config
from nbdev.doclinks import nbglob
from nbdev import test as nbdev_test                   # nbdev_test's module (its test_nb is not a test of ours)

from pixrl import core

CFG = get_config()
NBS = CFG.nbs_path.absolute()
NOTEBOOKS = [f.absolute() for f in sorted(nbglob(None, as_path=True)) if nbdev_test._keep_file(f, ".notest")]   # nbdev_test's list


def notebook_id(path) -> str:
    "A notebook's test id: its path under nbs/, without .ipynb."
    return str(path.relative_to(NBS).with_suffix(""))


def run_notebook(nb, monkeypatch) -> tuple[bool, float]:
    "(ran to its end, seconds) for notebook `nb` under nbdev_test's settings; the worker's environment restored after."
    environ = dict(os.environ)
    threads = torch.get_num_threads()
    path = list(sys.path)
    try:
        with monkeypatch.context() as m:
            m.setattr(core, "IN_TEST", True)             # as when pixrl.core is first imported under nbdev_test
            m.chdir(NBS)
            return nbdev_test.test_nb(nb, skip_flags=CFG.tst_flags.split(), basepath=CFG.config_path)
    finally:
        os.environ.clear()
        os.environ.update(environ)                       # IN_TEST and whatever the notebook set
        torch.set_num_threads(threads)
        sys.path[:] = path


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=notebook_id)
def test_notebook(nb, monkeypatch):
    "The notebook runs to its end under nbdev_test's settings."
    ok, seconds = run_notebook(nb, monkeypatch)
    assert ok, f"{notebook_id(nb)} failed after {seconds:.0f} s (its traceback is in the captured stderr)"


def _notebook(path, *sources) -> Path:
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": s} for s in sources]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_a_notebook_sees_in_test_and_leaves_the_worker_as_it_found_it(tmp_path, monkeypatch):
    nb = _notebook(tmp_path / "ok.ipynb", "from pixrl.core import IN_TEST\nassert IN_TEST",
                   "import os, torch\nos.environ['PIXRL_NB_SET'] = '1'\ntorch.set_num_threads(3)",
                   "#| notest\nraise RuntimeError('a cell tagged with a tst_flag is skipped')")
    threads, in_test, flag = torch.get_num_threads(), os.environ.get("IN_TEST"), core.IN_TEST
    assert run_notebook(nb, monkeypatch)[0]
    assert "PIXRL_NB_SET" not in os.environ and os.environ.get("IN_TEST") == in_test and core.IN_TEST == flag
    assert torch.get_num_threads() == threads


def test_a_failing_notebook_fails(tmp_path, monkeypatch):
    nb = _notebook(tmp_path / "bad.ipynb", "x = 1", "assert x == 2, 'the cell that fails'")
    assert not run_notebook(nb, monkeypatch)[0]


def test_the_notebook_list_is_nbdev_tests():
    "The notebooks here are those nbdev_test runs: every .ipynb under nbs/ but those nbdev skips (_ or . names)."
    names = {notebook_id(p) for p in NOTEBOOKS}
    assert "05_advantage" in names and "pix/04_reward" in names and "mem/22_mem_train" in names
    assert not any(part.startswith(("_", ".")) for n in names for part in n.split("/"))
    every = [p for p in NBS.rglob("*.ipynb") if not any(s.startswith(("_", ".")) for s in p.relative_to(NBS).parts)]
    assert sorted(NOTEBOOKS) == sorted(p.absolute() for p in every)
