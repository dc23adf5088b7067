"""pixrl.pix.preflight: a clean run passes; each gate fails on its own fault, naming the culprit
(tampered data cache / manifest, whitelist mismatch, token budget, dirty git tree, broken positive
control); the CLI exits non-zero on failure (preflight area)."""
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import pixrl.pix.geometry as G
import pixrl.pix.preflight as P
import pixrl.pix.prompt as PR
import pixrl.pix.reward as R
import pixrl.pix.tasks as T
from conftest import release_copy


class CharTokenizer:
    "One token per character (the `.encode` path of token_lengths)."
    def encode(self, text):
        return list(text)


class HFLikeTokenizer:
    "The Hugging Face path: batched __call__ returning input_ids (whitespace tokens), and a model_max_length."
    model_max_length = 300

    def __call__(self, texts, verbose=True):
        return {"input_ids": [t.split() for t in texts]}


class ChatTokenizer(HFLikeTokenizer):
    "An instruct tokenizer: prompts go through its chat template (3 extra whitespace tokens here)."
    chat_template = "{{ user }}"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert not tokenize and add_generation_prompt and messages[0]["role"] == "user"
        return "<user> " + messages[0]["content"] + " </user> <assistant>"


@pytest.fixture(scope="module")
def val():
    return T.load_split("validation")


def test_clean_run_passes_and_report_is_strict_json():
    rep = P.run_preflight(tokenizer=CharTokenizer(), max_prompt_tokens=5000)
    assert rep.ok, str(rep)
    assert [c.name for c in rep.checks] == list(P.CHECK_NAMES)
    assert all(c.status == "pass" for c in rep.checks)
    assert rep["data"].detail["counts"] == {s: T.SPLIT_SIZES[s] for s in ("train", "validation")}
    assert rep["data"].detail["release_digest"] == T.release_digest()
    n = T.SPLIT_SIZES["train"] + T.SPLIT_SIZES["validation"]
    assert rep["token_audit"].detail["n_prompts"] == n and rep["token_audit"].detail["n_over"] == 0
    pc = rep["positive_control"].detail
    assert pc["n"] == 40 and pc["per_level"] == {str(l): 8 for l in T.LEVELS} and pc["gt_min_reward"] >= 0.99
    assert pc["rect_n_judged"] > 0 and pc["rect_max_abs_dev"] <= P.RECT_FLOOR_TOL
    js = rep.to_json()
    assert json.loads(json.dumps(js, allow_nan=False)) == js and js["ok"] is True and js["failed"] == []
    md = rep._repr_markdown_()
    assert "Preflight PASSED" in md and all(f"`{n}`" in md for n in P.CHECK_NAMES)
    assert rep.raise_if_failed() is rep


def test_no_tokenizer_is_skipped_not_passed(val):
    rep = P.run_preflight(splits=("validation",), only=("token_audit",))
    c = rep["token_audit"]
    assert c.skipped and c.ok is None and c.status == "skipped"
    assert rep.ok and rep.raise_if_failed() is rep
    with pytest.raises(P.PreflightError, match="token_audit"):
        rep.raise_if_failed(allow_skipped=False)
    assert rep.to_json()["skipped"] == ["token_audit"]


def test_tampered_cache_fails_data_check_naming_the_task(tmp_path, monkeypatch, val):
    d = release_copy(tmp_path, monkeypatch)
    doc = json.loads((d / "validation.json").read_text())
    victim = doc["tasks"][7]["id"]
    doc["tasks"][7]["program"] = doc["tasks"][7]["program"].replace("1", "2", 1) + "# edited\n"
    (d / "validation.json").write_text(json.dumps(doc))
    rep = P.run_preflight(tokenizer=CharTokenizer(), max_prompt_tokens=5000, positive_control_n=5)
    data = rep["data"]
    assert not rep.ok and not data.ok
    assert victim in data.detail["errors"]["validation"] and victim in data.summary
    assert "DatasetIntegrityError" in data.detail["errors"]["validation"]
    assert data.detail["counts"] == {"train": T.SPLIT_SIZES["train"]}  # train still verified
    assert rep["positive_control"].skipped  # validation did not verify: nothing to control on
    assert not rep["token_audit"].ok  # a split it was asked to audit did not verify
    with pytest.raises(P.PreflightError, match=victim):
        rep.raise_if_failed()
    # running only the control does not hide the data failure it depends on
    only_pc = P.run_preflight(only=("positive_control",), positive_control_n=5)
    assert not only_pc.ok and [c.name for c in only_pc.failed] == ["data"] and victim in only_pc["data"].summary


def test_flipped_target_bit_names_the_task(tmp_path, monkeypatch, val):
    d = release_copy(tmp_path, monkeypatch)
    targets = np.load(d / "validation.targets.npy")
    targets[3, 100] ^= 0x01
    np.save(d / "validation.targets.npy", targets)
    rep = P.run_preflight(splits=("validation",), only=("data",))
    assert not rep.ok and val[3].id in rep["data"].summary


@pytest.mark.parametrize("fault", ["missing", "tampered"])
def test_bad_manifest_fails_data_check(tmp_path, monkeypatch, fault):
    m = json.loads(T.manifest_path().read_text())
    path = tmp_path / "manifest.json"
    if fault == "tampered":
        tid = sorted(m["splits"]["validation"]["tasks"])[0]
        m["splits"]["validation"]["tasks"][tid] = "0" * 64
        path.write_text(json.dumps(m))
    monkeypatch.setattr(T, "manifest_path", lambda release=T.RELEASE: path)
    rep = P.run_preflight(only=("data",))
    want = "is missing" if fault == "missing" else "release digest does not match"
    assert not rep.ok and want in rep["data"].summary and str(path) in rep["data"].summary


def test_documented_name_unknown_to_the_sandbox_fails_whitelist(monkeypatch):
    # the prompt's registry documents a function the gate's ALLOWED_NAMES (frozen at import) does not hold
    monkeypatch.setitem(G.API_REGISTRY, "spiral", G.ApiEntry("spiral", "spiral(cx, cy, turns)", "an Archimedean spiral"))
    assert "spiral(cx, cy, turns)  # an Archimedean spiral" in PR.api_doc()
    rep = P.run_preflight(only=("whitelist",))
    w = rep["whitelist"]
    assert not rep.ok and "spiral" in w.summary
    assert w.detail["documented_not_accepted"] == ["spiral"] and w.detail["accepted_not_documented"] == []
    assert "spiral" in w.detail["documented_rejected_by_gate"]
    with pytest.raises(P.PreflightError, match="spiral"):
        rep.raise_if_failed()


def test_name_the_prompt_does_not_document_fails_whitelist(monkeypatch):
    # the prompt's documented set misses a name the sandbox allows
    real = PR.documented_names
    monkeypatch.setattr(PR, "documented_names", lambda rep="py": real(rep) - {"ring"})
    w = P.run_preflight(only=("whitelist",))["whitelist"]
    assert not w.ok and w.detail["accepted_not_documented"] == ["ring"] and "ring" in w.summary
    assert w.detail["probes"]["ring"] == {"program": "ring(2, 2, 2, 2)\n", "kind": "accepted_only", "gate": None,
                                          "status": "OK"}


def test_rendered_doc_that_loses_a_registry_name_fails_whitelist(monkeypatch):
    # the registries agree, but the doc the prompt shows dropped the ring line
    real = PR.api_doc
    monkeypatch.setattr(PR, "api_doc", lambda rep="py": "\n".join(
        line for line in real(rep).splitlines() if not line.startswith("ring(")))
    w = P.run_preflight(only=("whitelist",))["whitelist"]
    assert not w.ok and w.detail["documented_not_in_doc_text"] == ["ring"] and "ring" in w.summary
    assert w.detail["documented_not_accepted"] == [] and w.detail["accepted_not_documented"] == []


def test_registry_entry_without_sandbox_implementation_fails(monkeypatch):
    # a drawing function added to the registry after the evaluator was imported (and absent from
    # every sandbox worker): the doc shows it, so the probes must catch that it cannot be used
    monkeypatch.setitem(G.API_REGISTRY, "spiral", G.ApiEntry("spiral", "spiral(cx, cy, turns)", "a spiral"))
    w = P.run_preflight(only=("whitelist",))["whitelist"]
    assert not w.ok and "spiral" in w.summary and "spiral" in w.detail["documented"]
    behaviour = {**w.detail["documented_rejected_by_gate"], **w.detail["documented_not_running"]}
    assert list(behaviour) == ["spiral"]
    assert w.detail["probes"]["spiral"]["program"] == "spiral(2, 2, 2)\n"
    assert w.detail["probes"]["spiral"]["status"] not in ("OK", "EMPTY")


def test_undocumented_name_accepted_by_the_gate_fails_whitelist(monkeypatch):
    # widen the gate's whitelist (the registry check_source passes to the gate) by one builtin it does not forbid
    import pixrl.pix.evaluator as E
    monkeypatch.setattr(E, "ALLOWED_NAMES", frozenset(E.ALLOWED_NAMES) | {"hex"})
    assert E.check_source("hex(1)\n") is None  # the patch really leaks
    w = P.run_preflight(only=("whitelist",))["whitelist"]
    assert not w.ok and w.detail["accepted_not_documented"] == ["hex"] and "hex" in w.summary
    assert {k: w.detail["probes"]["hex"][k] for k in ("program", "kind", "gate")} == {
        "program": "v = hex\n", "kind": "accepted_only", "gate": None}


def test_gate_leak_without_set_change_is_caught_by_the_sweep(monkeypatch):
    # the gate accepts `hex` but publishes an unchanged set: only the behavioural sweep can tell
    import pixrl.pix.evaluator as E
    real = E.check_source
    monkeypatch.setattr(E, "check_source", lambda src, rep="py", *a, **k: None if src == "hex(1)\n" else real(src, rep, *a, **k))
    w = P.run_preflight(only=("whitelist",))["whitelist"]
    assert not w.ok and w.detail["accepted_not_documented"] == [] and w.detail["undocumented_accepted_by_gate"] == ["hex"]


def test_svg_whitelist_passes_and_catches_a_documented_element_the_parser_rejects(monkeypatch):
    svg = PR.PromptSpec(representation="svg")
    ok = P.run_preflight(prompt_spec=svg, only=("whitelist",))["whitelist"]
    n = len(PR.documented_names("svg"))
    assert ok.ok and ok.summary.startswith(f"svg: {n} documented = {n} accepted elements, each passes"), ok.summary
    ellipse = PR.SvgEntry("ellipse", (("cx", ""), ("cy", ""), ("rx", ""), ("ry", "")), "ellipse")
    monkeypatch.setitem(PR.SVG_REGISTRY, "ellipse", ellipse)
    assert "<ellipse cx= cy= rx= ry=/>  # ellipse" in PR.api_doc("svg")
    bad = P.run_preflight(prompt_spec=svg, only=("whitelist",))["whitelist"]
    assert not bad.ok and bad.detail["documented_not_accepted"] == ["ellipse"] and "ellipse" in bad.summary
    assert list(bad.detail["documented_rejected_by_gate"]) == ["ellipse"]
    assert bad.detail["probes"]["ellipse"]["program"].endswith('<ellipse cx="2" cy="2" rx="2" ry="2"/></svg>')


def test_svg_element_the_prompt_does_not_document_fails_whitelist(monkeypatch):
    # the parser accepts <polygon>, the prompt's svg registry no longer documents it
    # a new dict, not delitem: undoing a delitem re-inserts at the end and would reorder the real doc
    monkeypatch.setattr(PR, "SVG_REGISTRY", {k: e for k, e in PR.SVG_REGISTRY.items() if k != "polygon"})
    assert "<polygon" not in PR.api_doc("svg")
    w = P.run_preflight(prompt_spec=PR.PromptSpec(representation="svg"), only=("whitelist",))["whitelist"]
    assert not w.ok and w.detail["accepted_not_documented"] == ["polygon"] and "polygon" in w.summary


def test_tiny_budget_fails_token_audit_naming_task_ids(val):
    spec = PR.PromptSpec(api_doc=False)
    lens = {t.id: len(PR.build_prompt(t, spec)) for t in val}
    budget = sorted(lens.values())[-4]  # at most the 3 longest prompts are over
    expect = sorted((i for i, n in lens.items() if n > budget), key=lambda i: (-lens[i], i))
    rep = P.run_preflight(tokenizer=CharTokenizer(), prompt_spec=spec, max_prompt_tokens=budget,
                          splits=("validation",), only=("token_audit",))
    c = rep["token_audit"]
    assert not rep.ok and 1 <= len(expect) <= 3
    assert c.detail["over_budget_ids"] == expect and c.detail["n_over"] == len(expect)
    assert c.detail["max"] == max(lens.values()) and all(i in c.summary for i in expect)
    with pytest.raises(P.PreflightError, match=expect[0]):
        rep.raise_if_failed()
    # the budget defaults to the tokenizer's model_max_length (HF-style tokenizer: whitespace tokens here)
    hf = P.run_preflight(tokenizer=HFLikeTokenizer(), splits=("validation",), only=("token_audit",))["token_audit"]
    assert hf.ok and hf.detail["budget"] == 300 and hf.detail["budget_source"] == "tokenizer.model_max_length"


def test_token_audit_counts_the_chat_template_and_prompt_fn(val):
    spec = PR.PromptSpec()
    plain = P.run_preflight(tokenizer=HFLikeTokenizer(), prompt_spec=spec, max_prompt_tokens=10**6,
                            splits=("validation",), only=("token_audit",))["token_audit"].detail
    chat = P.run_preflight(tokenizer=ChatTokenizer(), prompt_spec=spec, max_prompt_tokens=10**6,
                           splits=("validation",), only=("token_audit",))["token_audit"].detail
    assert chat["max"] == plain["max"] + 3 and chat["prompt_text"] == "build_prompt + chat template"
    longest = max(val, key=lambda t: len(PR.build_prompt(t, spec).split()))
    assert plain["max"] == len(PR.build_prompt(longest, spec).split())
    # an explicit prompt_fn (e.g. policy.prompt) is what gets measured
    fn = lambda t: "x " * (500 if t.id == val[9].id else 1)
    c = P.run_preflight(tokenizer=HFLikeTokenizer(), max_prompt_tokens=499, splits=("validation",),
                        only=("token_audit",), prompt_fn=fn)["token_audit"]
    assert not c.ok and c.detail["over_budget_ids"] == [val[9].id] and c.detail["max"] == 500


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(root)})


def test_require_clean_git_on_dirty_temp_repo_fails(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "init")
    clean = P.run_preflight(require_clean_git=True, only=("git",), git_root=repo)
    assert clean.ok and clean["git"].detail["dirty"] is False and len(clean["git"].detail["commit"]) == 40
    (repo / "a.txt").write_text("two\n")
    dirty = P.run_preflight(require_clean_git=True, only=("git",), git_root=repo)
    assert not dirty.ok and dirty["git"].detail["dirty"] is True and "dirty" in dirty["git"].summary
    with pytest.raises(P.PreflightError, match="git"):
        dirty.raise_if_failed()
    assert P.run_preflight(require_clean_git=False, only=("git",), git_root=repo).ok  # recorded, not required
    (tmp_path / "plain").mkdir()
    nogit = P.run_preflight(require_clean_git=True, only=("git",), git_root=tmp_path / "plain")
    assert not nogit.ok and "not a git repository" in nogit["git"].summary


def test_broken_ground_truth_program_fails_positive_control(monkeypatch, val):
    sample = P.control_sample(val, 10, seed=0)
    victim = sample[4]
    real = T.load_split

    def patched(split, release=T.RELEASE):
        ts = real(split, release)
        if split != "validation":
            return ts
        # a GT program with a footprint-filling rectangle appended: it covers the rectangle baseline,
        # so iou_n = 0 (IoU <= 0.9 on a degenerate target) and the reward is provably < 0.99
        W, H = victim.footprint_um
        return [replace(t, program=t.program + f"rect(0, 0, {W!r}, {H!r})\n") if t.id == victim.id else t for t in ts]

    monkeypatch.setattr(T, "load_split", patched)
    rep = P.run_preflight(only=("positive_control",), positive_control_n=10)
    c = rep["positive_control"]
    assert not rep.ok and [(f["id"], f["program"]) for f in c.detail["failures"]] == [(victim.id, "gt")]
    assert victim.id in c.summary and c.detail["gt_min_reward"] < P.GT_MIN_REWARD


@pytest.mark.parametrize("bug", ["not_running", "mirrored", "baseline_miscalibrated"])
def test_broken_rectangle_fails_positive_control(monkeypatch, bug):
    real_prog, real_base = R.rect_baseline_program, R.rect_baseline
    if bug == "not_running":  # wrong argument count: RUNTIME_ERROR, reward 0 instead of the floor
        monkeypatch.setattr(R, "rect_baseline_program", lambda t: "rect(0, 0, 1)\n")
    elif bug == "mirrored":  # y measured from the top (row convention): still at the clipped floor, wrong IoU
        def mirrored(t):
            (W, H), (ny, nx) = t.footprint_um, np.shape(t.target_mask)
            r0, r1, c0, c1 = R.ink_bbox(t.target_mask)
            return f"rect({c0 * W / nx!r}, {r0 * H / ny!r}, {(c1 - c0 + 1) * W / nx!r}, {(r1 - r0 + 1) * H / ny!r})\n"
        monkeypatch.setattr(R, "rect_baseline_program", mirrored)
    else:  # chamfer baseline on the wrong scale: the rectangle now beats its own baseline
        monkeypatch.setattr(R, "rect_baseline", lambda t: replace(real_base(t), ch_rect=2 * real_base(t).ch_rect))
    c = P.run_preflight(only=("positive_control",), positive_control_n=10)["positive_control"]
    rect_fail = [f for f in c.detail["failures"] if f["program"] == "rect"]
    gt_fail = [f for f in c.detail["failures"] if f["program"] == "gt"]
    assert not c.ok and rect_fail and not gt_fail, c.detail["failures"]
    want = {"not_running": "did not run OK", "mirrored": "!= iou_rect", "baseline_miscalibrated": "!= floor"}[bug]
    assert all(want in f["why"] for f in rect_fail if not f["degenerate"]) and want in c.summary


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="splits"):
        P.run_preflight(splits=("nope",))
    with pytest.raises(ValueError, match="only"):
        P.run_preflight(only=("data", "nope"))
    with pytest.raises(ValueError, match="positive_control_n"):
        P.run_preflight(positive_control_n=0)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        P.run_preflight(max_prompt_tokens=-3)
    with pytest.raises(ValueError, match="prompt_spec"):
        P.run_preflight(prompt_spec={"raster": 16})


def test_cli_exit_codes(tmp_path, monkeypatch, capsys):
    assert P.cli_main(["--splits", "validation", "--positive-control-n", "5"]) == 0
    assert "Preflight PASSED" in capsys.readouterr().out
    d = release_copy(tmp_path, monkeypatch)
    targets = np.load(d / "validation.targets.npy")
    targets[0, 0] ^= 0x80
    np.save(d / "validation.targets.npy", targets)
    # `python -m pixrl.pix.preflight` in a fresh interpreter sees the tampered copy through PIXRL_CACHE
    p = subprocess.run([sys.executable, "-m", "pixrl.pix.preflight", "--splits", "validation", "--positive-control-n", "5",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is False and out["failed"] == ["data"]
