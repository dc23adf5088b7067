"""The operating point of arms C/D (thinking on, long budget) vs the others (thinking off), on a reasoning-style chat
template: prompts, extraction of the answer after the thought, and a C smoke campaign."""
import json, os, shutil, subprocess, sys
from pathlib import Path

import pytest

from pixrl.pix.campaign import THINK_MAX_NEW_TOKENS, operating_point
from pixrl.pix.grpo import rl_dataset, sft_dataset
from pixrl.pix.policy import load_policy
from pixrl.pix.prompt import prompt_text
from pixrl.pix.reward import extract_program
from pixrl.pix.tasks import load_split
from pixrl.pix.tiny import tiny_dir
from conftest import cache_with_data

REPO = Path(__file__).resolve().parents[1]
# Qwen3's rule in plain characters: no-think mode pre-fills an empty thought in the generation prompt
THINK_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:\n{% if enable_thinking is defined and enable_thinking is false %}"
                  "<think>\n\n</think>\n\n{% endif %}{% endif %}")
EMPTY_THOUGHT = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def think_dir(tmp_path_factory):
    "pixrl-tiny's weights behind a reasoning-style chat template (enable_thinking)."
    d = tmp_path_factory.mktemp("think") / "model"
    shutil.copytree(tiny_dir(), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = THINK_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    meta = json.loads((d / "pixrl.json").read_text())
    meta.pop("can_think")          # detected from the template
    meta["max_new_tokens"] = 48
    (d / "pixrl.json").write_text(json.dumps(meta))
    return d


@pytest.fixture(scope="module")
def task():
    return load_split("validation")[0]


def test_operating_point_per_arm():
    for arm in "ABEFGI":
        assert operating_point({"arm": arm, "max_new_tokens": None}) == {"thinking": False, "max_new_tokens": None}
    for arm in "CDcd":
        assert operating_point({"arm": arm, "max_new_tokens": None}) == {"thinking": True,
                                                                           "max_new_tokens": THINK_MAX_NEW_TOKENS}
    assert operating_point({"arm": "C", "max_new_tokens": 64})["max_new_tokens"] == 64
    assert operating_point({"arm": "B", "max_new_tokens": 64}) == {"thinking": False, "max_new_tokens": 64}


def test_thinking_switch_reaches_the_prompt(think_dir, task):
    on, off, default = (load_policy(str(think_dir), thinking=x) for x in (True, False, None))
    assert on.can_think and off.can_think
    text = prompt_text(task, on.prompt_spec)
    assert on.prompt(task) == default.prompt(task) == f"user: {text}\nassistant:\n"   # the template's default thinks
    assert off.prompt(task) == f"user: {text}\nassistant:\n{EMPTY_THOUGHT}"
    # SFT and RL rows carry the same operating point as the probe
    assert rl_dataset(off, [task])[0]["prompt"] == sft_dataset(off, [task])[0]["prompt"] == off.prompt(task)
    assert rl_dataset(on, [task])[0]["prompt"] == on.prompt(task)


def test_thinking_refused_on_a_model_that_cannot_think(task):
    with pytest.raises(ValueError, match="cannot think"):
        load_policy("pixrl-tiny", thinking=True)
    tiny = load_policy("pixrl-tiny", thinking=False)      # no template: the raster prompt, unchanged
    assert tiny.prompt(task) == prompt_text(task, tiny.prompt_spec)


def test_answer_after_the_thought_is_scored():
    code = "```python\nrect(0, 0, 1, 1)\n```"
    assert extract_program(f"<think>draft: ```python\ncircle(1, 1, 1)\n```</think>\n{code}") == "rect(0, 0, 1, 1)\n"
    assert extract_program(f"{EMPTY_THOUGHT}{code}") == "rect(0, 0, 1, 1)\n"
    assert extract_program(f"<think>still thinking {code}") == ""          # cut off by the budget: no answer


@pytest.mark.slow
def test_arm_c_smoke_runs_at_the_thinking_operating_point(think_dir, tmp_path):
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", "C", "--model", str(think_dir), "--runs-root",
           str(tmp_path / "runs"), "--name", "c", "--smoke", "--levels", "0", "--probe-per-level", "1",
           "--probe-k", "2", "--num-generations", "4", "--groups-per-step", "1", "--max-new-tokens", "40"]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = tmp_path / "runs" / "c"
    stage = json.loads((run / "stage_0.json").read_text())
    assert stage["operating_point"] == {"thinking": True, "max_new_tokens": 40} and stage["global_step"] == 2
    hist = json.loads((run / "metrics_0.json").read_text())
    lengths = [h["completions/max_length"] for h in hist if "completions/max_length" in h]
    assert lengths and max(lengths) <= 40
