"""The evidence log is honest: every executed notebook under `runs/` printed its run record, the record's commit is in
this repository, no cell failed, every notebook has an entry in `runs/registry.json` (read by `pixrl.core.read_registry`)
and a run made on a dirty tree is `superseded` there; the results table (`runs/claims.json` → `runs/RESULTS.md` and
README.md's results block) quotes only what current runs print.

Every run has one record schema, in its `runs/registry.json` entry: `record` = {commit, dirty, seed, data_digest,
wall_s} (`pixrl.core.check_record`), which must equal what `pixrl.core.run_record_of` reads from the notebook — the
run record it printed (a JSON line, indented JSON, a Python dict, or a two-column markdown table with a `commit` row;
else the `record` of its `runs/<name>/summary.json`) and its wall (the last printed `wall …`, minutes converted; else
`wall_s` of its summary). A notebook must also show no `error` output and no papermill "An Exception was encountered"
marker.

Exceptions are listed by name in `EXCEPTIONS`, each with its reason. Notebooks with `"status": "superseded"` in
`runs/registry.json` are the ones whose numbers are not clean evidence; every notebook whose record says
`dirty: true`, or that has no record, must be one, with a `why` that says so ("dirty tree" / "no run record"). A
superseded notebook whose record is clean must not give "dirty tree" as its reason (re-run clean → change its status).
`runs/README.md` is the registry rendered (`pixrl.results.run_index`): every notebook, with its status.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pixrl.core import notebook_outputs, read_json, read_registry, run_record_of
from pixrl.results import FIGURES, results_block, results_table, run_index, write_figures

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"
NOTEBOOKS = sorted(RUNS.glob("*.ipynb"))
REGISTRY = read_registry(ROOT)

# Named exceptions (notebook stem -> the record fields it may lack, and why). Keep each one true: the tests below fail
# if an entry names a notebook that is gone, or lists a field its record has.
EXCEPTIONS: dict[str, dict] = {
    "offset_compare": dict(
        exempt={"seed", "data_digest", "wall_s"},
        why="trains and samples nothing: it only reads the other offset runs' records (runs/offset_*/metrics.json) "
            "and prints its own commit and dirty flag, so it has no seed, data digest or wall of its own"),
}
EXCEPTIONS["offset_dirty_compare"] = dict(EXCEPTIONS["offset_compare"], why="the same notebook, run on a dirty tree "
                                          "(offset_compare until 2026-12-02): " + EXCEPTIONS["offset_compare"]["why"])
PAPERMILL_MARKER = "An Exception was encountered"


# ---------------------------------------------------------------- reading a notebook

def read_run(path: Path) -> dict:
    """What the test knows about one executed notebook: its registry `record` (one schema for every run, checked by
    `pixrl.core.check_record`), `printed` (what `run_record_of` reads from the notebook now), `errors` (error outputs /
    papermill markers) and `exception` (its EXCEPTIONS entry)."""
    nb = json.loads(Path(path).read_text())
    name = Path(path).stem
    errors = []
    for k, cell in enumerate(nb.get("cells", [])):
        if PAPERMILL_MARKER in "".join(cell.get("source", "")):
            errors.append(f"cell {k}: papermill marker {PAPERMILL_MARKER!r}")
        for o in cell.get("outputs", []) or []:
            if o.get("output_type") == "error":
                errors.append(f"cell {k}: error output {o.get('ename')}: {str(o.get('evalue'))[:200]}")
    if PAPERMILL_MARKER in notebook_outputs(path):
        errors.append(f"output contains {PAPERMILL_MARKER!r}")
    if (nb.get("metadata", {}).get("papermill") or {}).get("exception"):
        errors.append("papermill metadata: exception = true")
    return dict(name=name, record=REGISTRY[name]["record"], printed=run_record_of(path), errors=errors,
                exception=EXCEPTIONS.get(name, {}))


def record_problems(run: dict) -> list[str]:
    "What is missing in a run's registry record (its types are check_record's), or differs from what it printed."
    rec, exc = run["record"], run["exception"]
    if rec != run["printed"]:
        return [f"registry record {rec} differs from what the notebook prints, {run['printed']}: "
                "set it to pixrl.core.run_record_of(notebook)"]
    if rec is None:
        return []          # no record: test_dirty_runs_are_superseded requires it superseded, 'no run record'
    missing = [f for f in ("seed", "data_digest", "wall_s") if rec[f] is None and f not in exc.get("exempt", ())]
    listed = sorted(f for f in exc.get("exempt", ()) if rec[f] is not None)
    return ([f"run record lacks {f!r}" for f in missing]
            + [f"EXCEPTIONS exempts {listed}, but the record has them: drop the exemption"] * bool(listed))


def superseded(root: Path = ROOT) -> dict[str, str]:
    "notebook stem -> reason (its `why`), of the registry entries whose status is `superseded`."
    return {name: e["why"] for name, e in read_registry(root).items() if e["status"] == "superseded"}


def superseded_problems(run: dict, listed: dict[str, str]) -> list[str]:
    "A dirty (or record-less) run must be listed with a fitting reason; a clean one must not be listed as dirty."
    rec, name = run["record"], run["name"]
    why = listed.get(name)
    if rec is None:
        if why is None:
            return [f"{name}.ipynb has no run record and is not superseded in runs/registry.json"]
        return [] if "no run record" in why.lower() else [f"{name}.ipynb: its Superseded reason must say 'no run record'"]
    if rec.get("dirty") is True:
        if why is None:
            return [f"{name}.ipynb ran on a dirty tree (commit {str(rec.get('commit'))[:10]}): re-run it from a clean "
                    "commit or make it superseded in runs/registry.json (why: 'run on a dirty tree …')"]
        return [] if "dirty tree" in why.lower() else [f"{name}.ipynb: its Superseded reason must say 'dirty tree'"]
    if why is not None and "dirty tree" in why.lower():
        return [f"{name}.ipynb is superseded for a dirty tree, but its record is clean: change its status in "
                "runs/registry.json"]
    return []


def missing_commits(commits: list[str], repo: Path = ROOT) -> list[str]:
    "The commits (full or unambiguous short hashes) that are not commit objects of the repository."
    if not commits:
        return []
    res = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"], capture_output=True, text=True,
                         input="".join(f"{c}^{{commit}}\n" for c in commits), timeout=30, check=True)
    lines = res.stdout.splitlines()
    assert len(lines) == len(commits), res.stdout
    return [c for c, line in zip(commits, lines) if line.split()[1:2] != ["commit"]]


# ---------------------------------------------------------------- the tests

_CACHE: dict[Path, dict] = {}


def _run(path: Path) -> dict:
    if path not in _CACHE:
        _CACHE[path] = read_run(path)
    return _CACHE[path]


def test_there_are_runs():
    assert NOTEBOOKS, f"no executed notebooks in {RUNS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_run_record_is_printed(path):
    assert record_problems(_run(path)) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_error_output(path):
    assert _run(path)["errors"] == []


def test_record_commits_exist():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout to look the commits up in")
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True).stdout.strip() == "true"
    commits = {}
    for p in NOTEBOOKS:
        rec = _run(p)["record"]
        if rec and isinstance(rec.get("commit"), str):
            commits.setdefault(rec["commit"], []).append(p.name)
    missing = missing_commits(sorted(commits))
    if missing and shallow:
        pytest.skip(f"shallow clone; commits not found: {missing}")
    assert not missing, {c: commits[c] for c in missing}


def test_dirty_runs_are_superseded():
    listed = superseded()
    problems = [p for path in NOTEBOOKS for p in superseded_problems(_run(path), listed)]
    assert problems == []


def test_superseded_list_names_existing_notebooks():
    listed = superseded()
    assert listed, "runs/registry.json has no superseded entry"
    names = {p.stem for p in NOTEBOOKS}
    assert sorted(set(listed) - names) == []
    assert all(why.strip() for why in listed.values())


def test_registry_has_every_notebook():
    "One registry entry per runs/*.ipynb and no other (read_registry refuses a name without a notebook)."
    registered = set(read_registry(ROOT))
    assert sorted({p.stem for p in NOTEBOOKS} - registered) == [], "add these notebooks to runs/registry.json"
    assert sorted(registered - {p.stem for p in NOTEBOOKS}) == []


def test_runs_index_is_generated():
    "runs/README.md is the registry rendered by `pixrl results` (run_index): one row per registered run, with its status."
    assert (RUNS / "README.md").read_text() == run_index(ROOT), "run `pixrl results`"
    rows = re.findall(r"^\| `([^`]+)` \| (current|historical|superseded) \|", (RUNS / "README.md").read_text(), re.M)
    assert sorted(rows) == sorted((n, e["status"]) for n, e in read_registry(ROOT).items())


def test_claims_print_what_they_say():
    "Every claim's `prints` is an exact substring of its notebook's printed outputs."
    claims = read_json(RUNS / "claims.json", "claims")
    missing = [(c["run"], c["prints"]) for c in claims if c["prints"] not in notebook_outputs(RUNS / f"{c['run']}.ipynb")]
    assert missing == []


def test_results_md_is_generated():
    "runs/RESULTS.md is what `pixrl results` writes now (results_table refuses a claim a current run does not print)."
    assert (RUNS / "RESULTS.md").read_text() == results_table(ROOT), "run `pixrl results`"


def test_readme_results_block():
    "README.md's block between the results markers is the same table."
    text = (ROOT / "README.md").read_text()
    assert "<!-- results:begin -->" in text and "<!-- results:end -->" in text, "README.md lost its results markers"
    start, end = results_block(text)
    assert text[start:end].strip() == results_table(ROOT).strip(), "run `pixrl results`"


def test_readme_is_a_front_page():
    "README.md stays a front page: at most 200 lines and 16 KB, every figure it shows is a file of runs/figures/."
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200 and len(text.encode()) <= 16 * 1024, (len(text.splitlines()), len(text.encode()))
    shown = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert shown and all((ROOT / f).is_file() and f.startswith("runs/figures/") for f in shown), shown


def test_figures_are_drawn_from_the_committed_runs(tmp_path):
    "write_figures re-draws every figure from the committed runs/b and runs/mem_ablation, at the committed sizes."
    import matplotlib.image
    for run in ("b", "mem_ablation"):
        shutil.copytree(RUNS / run, tmp_path / "runs" / run)
    paths = write_figures(tmp_path)
    assert [p.name for p in paths] == list(FIGURES)
    for p in paths:
        assert matplotlib.image.imread(p).shape == matplotlib.image.imread(RUNS / "figures" / p.name).shape, p.name


def test_exceptions_are_current():
    names = {p.stem for p in NOTEBOOKS}
    assert sorted(set(EXCEPTIONS) - names) == [], "EXCEPTIONS names a notebook that is not in runs/"
    assert all(e.get("why") for e in EXCEPTIONS.values())


# ---------------------------------------------------------------- no reference outside the repository
# Documents that live outside the repository must not be cited: what a citation meant is written into the
# notebook's prose or into docs/ (e.g. docs/mem.md). The patterns are built from pieces so that this file does not
# match itself and can be searched like any other.
OUTSIDE_REFERENCES = [re.compile(p) for p in (r"DESIGN" + r"\.md", r"REFERENCE" + r"\.md", r"\.\." + r"/shared")]
OUTSIDE_REFERENCES.append(re.compile(r"task" + r"\s+card", re.IGNORECASE))


def _reference_search_texts():
    "(where, text) of every searched source: notebook cell sources, package, tests, READMEs, runs/LOG.md, docs/."
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            src = cell.get("source", "")
            yield f"{nb.relative_to(ROOT)} cell {i}", "".join(src) if isinstance(src, list) else src
    paths = [*sorted((ROOT / "pixrl").rglob("*.py")), *sorted((ROOT / "tests").glob("*.py")),
             ROOT / "README.md", RUNS / "README.md", RUNS / "LOG.md",
             *sorted(p for p in (ROOT / "docs").rglob("*") if p.is_file())]
    for p in paths:
        if p.is_file():
            yield str(p.relative_to(ROOT)), p.read_text(encoding="utf-8", errors="replace")


def test_no_reference_outside_the_repository():
    "No notebook, module, test, README, runs/LOG.md or docs/ page cites a design or reference file kept outside the repo."
    hits = []
    for where, text in _reference_search_texts():
        for m in sorted((m for p in OUTSIDE_REFERENCES for m in p.finditer(text)), key=lambda m: m.start()):
            n = text.count("\n", 0, m.start())
            line = text.splitlines()[n] if text.splitlines() else ""
            hits.append(f"{where} line {n + 1}: {m.group(0)!r} in {line.strip()[:160]!r}")
    assert hits == [], "cites a document outside the repository (write it into the notebook or docs/):\n" + "\n".join(hits)
