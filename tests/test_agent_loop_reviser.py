"""agent_loop's `reviser`: a second in-process model writes the revision rounds, and the record and run record say which;
with a server (`base_url`) it is refused before anything runs."""
import json
from pathlib import Path

import papermill as pm
import pytest

NBS = Path(__file__).resolve().parents[1] / "nbs"


def test_a_second_model_writes_the_revisions(tmp_path, monkeypatch):
    monkeypatch.setenv("IN_TEST", "1")            # the notebook's test shape (1 task, 2 attempts, 1 round of 2), under the cache
    out = tmp_path / "out.ipynb"
    pm.execute_notebook(str(NBS / "agent_loop.ipynb"), str(out), cwd=str(NBS), kernel_name="python3", progress_bar=False,
                        parameters={"model": "pixrl-base", "reviser": "pixrl-base-mover", "revision": "move",
                                    "feedback": "regions", "compare_plain": False})
    text = "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))
    assert "first attempts by pixrl-base, revisions by pixrl-base-mover" in text
    from pixrl.core import cache_dir
    loop = json.loads((cache_dir("test_runs") / "test_agent_loop" / "loop.json").read_text())
    assert (loop["model"], loop["reviser"]) == ("pixrl-base", "pixrl-base-mover")
    assert loop["run"]["reviser"] == "pixrl-base-mover" and len(loop["run"]["reviser_weights_sha256"]) == 64


def test_a_second_model_with_a_server_is_refused(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match=r"reviser='pixrl-base-mover' with base_url='http://127.0.0.1:9': a second "
                                                           r"policy runs in-process only"):
        pm.execute_notebook(str(NBS / "agent_loop.ipynb"), str(tmp_path / "out.ipynb"), cwd=str(NBS), kernel_name="python3",
                            progress_bar=False, parameters={"model": "pixrl-base", "reviser": "pixrl-base-mover",
                                                            "base_url": "http://127.0.0.1:9", "run_name": "never_made",
                                                            "allow_dirty": True})
    assert not (NBS.parent / "runs" / "never_made").exists()
