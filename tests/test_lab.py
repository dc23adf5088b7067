"`make lab` as users open it: a real JupyterLab on loopback, rooted at the repository, serving runs/ notebooks."
import json, socket, subprocess, time, urllib.request
from pathlib import Path
from pixrl.lab import lab_command
from pixrl.core import repo_root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, json.loads(r.read())


def test_lab_serves_runs_and_nbs(tmp_path):
    port, token = _free_port(), "pixrl-test"
    run_nb = sorted(p.name for p in (Path(repo_root()) / "runs").glob("*.ipynb"))[0]
    proc = subprocess.Popen(lab_command(port=port, token=token, browser=False), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=tmp_path)   # started elsewhere: the root comes from the flag
    base = f"http://127.0.0.1:{port}/api/contents"
    try:
        deadline, status = time.time() + 90, None
        while time.time() < deadline and proc.poll() is None:
            try:
                status, listing = _get(f"{base}?token={token}&content=1")
                break
            except OSError:
                time.sleep(0.5)
        assert status == 200, f"lab did not serve (exit {proc.poll()}): {proc.stdout.read().decode()[-2000:] if proc.poll() is not None else ''}"
        assert {"nbs", "runs"} <= {item["name"] for item in listing["content"]}
        status, model = _get(f"{base}/runs/{run_nb}?token={token}&content=0")
        assert status == 200 and model["type"] == "notebook" and model["path"] == f"runs/{run_nb}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
