"""The evidence log is honest: every executed notebook under `runs/` printed its run record, the record's commit is in
this repository, no cell failed, every notebook has an entry in `runs/registry.json` (read by `pixrl.core.read_registry`)
and a run made on a dirty tree is `superseded` there; the results table (`runs/claims.json` → `runs/RESULTS.md` and
README.md's results block) quotes only what current runs print.

What a notebook must show in its cell outputs:

* a run record — a dict holding at least `commit` and `dirty` (and `seed`, `data_digest`) — in any of the formats the
  campaign notebooks print: a JSON line (`train.ipynb`: `{"commit": …, "dirty": true, …}`), indented JSON
  (`offset_ab`, `offset_retrain`), a Python dict (`run record: {'commit': …}` or the dict a cell displays), or a
  two-column markdown table with a `commit` row;
* its wall time: a printed `wall …` (`wall time 115.0 s`, `Wall time (this notebook): 12.0 min.`, `wall 72 s`,
  `| wall_s | 127.3 |`, `wall 3.1 min`), or else `wall_s` in the run's own artefact `runs/<name>/summary.json`
  (or `runs/<name>/<name>.json`), which the notebook writes from the same timer;
* no `error` output and no papermill "An Exception was encountered" marker.

Exceptions are listed by name in `EXCEPTIONS`, each with its reason. Notebooks with `"status": "superseded"` in
`runs/registry.json` are the ones whose numbers are not clean evidence; every notebook whose record says
`dirty: true`, or that has no record, must be one, with a `why` that says so ("dirty tree" / "no run record"). A
superseded notebook whose record is clean must not give "dirty tree" as its reason (re-run clean → change its status).
The `## Superseded` table of `runs/README.md` (rows `| `name.ipynb` | reason |`), while it exists, lists the same
notebooks.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pixrl.core import notebook_outputs, read_json, read_registry, results_block, results_table

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"
NOTEBOOKS = sorted(RUNS.glob("*.ipynb"))
FIELDS = ("commit", "dirty", "seed", "data_digest", "wall")

# Named exceptions (notebook stem -> what differs and why). Keep each one true: the tests below fail if an entry
# names a notebook that is gone, or if a "no_record" notebook turns out to print one.
EXCEPTIONS: dict[str, dict] = {
    "offset_compare": dict(
        exempt={"seed", "data_digest", "wall"},
        why="trains and samples nothing: it only reads the other offset runs' records (runs/offset_*/metrics.json) "
            "and prints its own commit and dirty flag, so it has no seed, data digest or wall of its own"),
    "tiny_model": dict(
        record_file="tiny_model/summary.json", wall_key="seconds",
        why="the pixrl-tiny build notebook keeps its run record in runs/tiny_model/summary.json (written by its last "
            "cell) instead of printing it; its wall is the build's `seconds` there (printed as '801,152 parameters, "
            "914 s')"),
    "tiny_model_phase1": dict(
        no_record=True,
        why="phase 1 of the base build, run by the earlier single-phase notebook, which wrote its record only to "
            "runs/tiny_model/summary.json — overwritten by phase 2 (tiny_model.ipynb); kept as the tokenizer "
            "negative result, so it must be listed as superseded"),
}

_RECORD_START = re.compile(r"""\{\s*["']commit["']\s*:""")
_WALL = re.compile(r"\bwall(?:[ _]?time|_s)?\b[^\d\n]{0,30}?(\d+(?:\.\d+)?)", re.I)
_TABLE_ROW = re.compile(r"^\|\s*`?([A-Za-z_]+)`?\s*\|\s*`?([^|`]*?)`?\s*\|\s*$", re.M)
_HEX = re.compile(r"[0-9a-f]+")
PAPERMILL_MARKER = "An Exception was encountered"


# ---------------------------------------------------------------- reading a notebook

def output_texts(nb: dict) -> list[str]:
    "Every text an output shows, in cell order (streams, plain text and markdown of results/displays, tracebacks)."
    out = []
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []) or []:
            if o.get("output_type") == "stream":
                out.append("".join(o.get("text", "")))
            elif o.get("output_type") in ("execute_result", "display_data"):
                for mime in ("text/plain", "text/markdown"):
                    v = o.get("data", {}).get(mime)
                    if v:
                        out.append("".join(v))
            elif o.get("output_type") == "error":
                out.append(f"{o.get('ename')}: {o.get('evalue')}")
    return out


def _dicts_with_commit(text: str):
    "Dicts starting with a `commit` key printed in `text`, as JSON or as a Python literal."
    for m in _RECORD_START.finditer(text):
        i = m.start()
        try:
            obj, _ = json.JSONDecoder().raw_decode(text, i)
            if isinstance(obj, dict):
                yield obj
            continue
        except ValueError:
            pass
        j = text.find("}", i)
        while j != -1:
            try:
                obj = ast.literal_eval(text[i:j + 1])
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                j = text.find("}", j + 1)
                continue
            if isinstance(obj, dict):
                yield obj
            break


def _table_record(text: str) -> dict | None:
    "A `| key | value |` markdown table with a `commit` row, as a dict."
    rows = dict(_TABLE_ROW.findall(text))
    if "commit" not in rows:
        return None
    rec = {}
    for k, v in rows.items():
        if k == "dirty" and v.lower() in ("true", "false"):
            v = v.lower() == "true"
        elif k == "seed" and re.fullmatch(r"-?\d+", v):
            v = int(v)
        rec[k] = v
    return rec


def find_record(texts: list[str]) -> dict | None:
    "The first printed run record (a dict with `commit` and `dirty`) in the outputs."
    for t in texts:
        for d in _dicts_with_commit(t):
            if "dirty" in d:
                return d
        d = _table_record(t)
        if d is not None and "dirty" in d:
            return d
    return None


def find_wall(texts: list[str]) -> float | None:
    "The last printed wall time (a number following 'wall', 'wall time', 'wall_s'): the total comes at the end."
    found = [m for t in texts for m in _WALL.finditer(t)]
    return float(found[-1].group(1)) if found else None


def _artefact_json(name: str, rel: str | None = None) -> list[dict]:
    paths = [RUNS / rel] if rel else [RUNS / name / "summary.json", RUNS / name / f"{name}.json"]
    out = []
    for p in paths:
        if p.is_file():
            d = json.loads(p.read_text())
            if isinstance(d, dict):
                out.append(d)
    return out


def read_run(path: Path) -> dict:
    """What the test knows about one executed notebook: `record` (dict with commit, dirty, seed, data_digest, wall,
    whatever was found), `errors` (error outputs / papermill markers) and `exception` (its EXCEPTIONS entry)."""
    nb = json.loads(Path(path).read_text())
    name = Path(path).stem
    exc = EXCEPTIONS.get(name, {})
    texts = output_texts(nb)
    errors = []
    for k, cell in enumerate(nb.get("cells", [])):
        if PAPERMILL_MARKER in "".join(cell.get("source", "")):
            errors.append(f"cell {k}: papermill marker {PAPERMILL_MARKER!r}")
        for o in cell.get("outputs", []) or []:
            if o.get("output_type") == "error":
                errors.append(f"cell {k}: error output {o.get('ename')}: {str(o.get('evalue'))[:200]}")
    errors += [f"output contains {PAPERMILL_MARKER!r}" for t in texts if PAPERMILL_MARKER in t]
    if (nb.get("metadata", {}).get("papermill") or {}).get("exception"):
        errors.append("papermill metadata: exception = true")
    if "record_file" in exc:
        found = _artefact_json(name, exc["record_file"])
        record = dict(found[0].get("record", {})) if found else None
        if record is not None and exc.get("wall_key") in found[0]:
            record["wall"] = found[0][exc["wall_key"]]
    else:
        record = find_record(texts)
        if record is not None:
            record = dict(record)
            wall = find_wall(texts)
            if wall is None:
                wall = next((d["wall_s"] for d in _artefact_json(name) if isinstance(d.get("wall_s"), (int, float))),
                            None)
            if wall is not None:
                record["wall"] = wall
    return dict(name=name, record=record, errors=errors, exception=exc)


def record_problems(run: dict) -> list[str]:
    "What is missing or malformed in a run's record (empty = fine)."
    rec, exc = run["record"], run["exception"]
    if rec is None:
        return [] if exc.get("no_record") else ["no run record printed (a dict with 'commit' and 'dirty')"]
    if exc.get("no_record"):
        return ["EXCEPTIONS says it has no run record, but one was found: drop the exception"]
    probs = []
    for f in FIELDS:
        if f in exc.get("exempt", ()):
            continue
        if f not in rec:
            probs.append(f"run record lacks {f!r}" + (" (print 'wall …' or write wall_s to summary.json)"
                                                      if f == "wall" else ""))
    c = rec.get("commit")
    if not (isinstance(c, str) and 7 <= len(c) <= 40 and _HEX.fullmatch(c)):
        probs.append(f"commit {c!r} is not a 7–40 digit hex hash")
    if not isinstance(rec.get("dirty"), bool):
        probs.append(f"dirty {rec.get('dirty')!r} is not a bool")
    seeds = rec.get("seed") if isinstance(rec.get("seed"), list) else [rec.get("seed")]   # a multi-seed run lists them
    if "seed" in rec and (not seeds or any(isinstance(x, bool) or not isinstance(x, int) for x in seeds)):
        probs.append(f"seed {rec['seed']!r} is not an int or a non-empty list of ints")
    d = rec.get("data_digest")
    if "data_digest" in rec and not (isinstance(d, str) and len(d) >= 12 and _HEX.fullmatch(d)):
        probs.append(f"data_digest {d!r} is not a hex digest")
    if "wall" in rec and not (isinstance(rec["wall"], (int, float)) and rec["wall"] > 0):
        probs.append(f"wall {rec['wall']!r} is not a positive number")
    return probs


def superseded(root: Path = ROOT) -> dict[str, str]:
    "notebook stem -> reason (its `why`), of the registry entries whose status is `superseded`."
    return {name: e["why"] for name, e in read_registry(root).items() if e["status"] == "superseded"}


def readme_superseded(readme: Path = RUNS / "README.md") -> dict[str, str]:
    "notebook stem -> reason, from the `## Superseded` table of runs/README.md (empty when it has none)."
    text = readme.read_text()
    m = re.search(r"^## Superseded[^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if m is None:
        return {}
    return {n: why for n, why in re.findall(r"^\|\s*`([^`|]+)\.ipynb`\s*\|\s*(.*?)\s*\|\s*$", m.group(1), re.M)}


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


def test_readme_superseded_table_matches_registry():
    "While runs/README.md keeps its '## Superseded' table, it names the registry's superseded notebooks."
    table = readme_superseded()
    if not table:
        pytest.skip("runs/README.md has no '## Superseded' table")
    assert sorted(table) == sorted(superseded())


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
