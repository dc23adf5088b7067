"""`make gpu-check`: a smoke pix campaign on CUDA with a from-config Qwen2 model larger than pixrl-tiny.

Builds (no download) a ~30 M-parameter Qwen2 model with pixrl-tiny's character tokenizer, runs arm B in smoke mode
(2 GRPO steps per stage, levels 0-1, vLLM rollouts when `vllm` is installed, HF generate otherwise; force with
PIXRL_USE_VLLM=0/1), and prints the mean GRPO step time, tokens/s and the generation/evaluation/optimisation shares.
Refuses clearly when CUDA is not available.

usage: python scripts/gpu_check.py [--hidden 512] [--layers 8] [--keep] [--cpu-dry-run] [--timeout S]

--cpu-dry-run runs the same path on the CPU (no CUDA, no vLLM; use small --hidden/--layers) to check the
script itself where no GPU is lent; its numbers are CPU numbers, not a GPU measurement.
--timeout stops the campaign (its whole process group) after S seconds and reports it like a failure.
On failure the tail of the campaign's campaign.log is printed (the stages log only there) and the run directory is
kept. When $OUT is set (the device tool's output folder) the final JSON goes to $OUT/gpu_check.json and a copy of
campaign.log to $OUT/campaign.log. On a machine without internet, see scripts/gpu_check_device.sh.
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, time
from pathlib import Path

LOG_TAIL_LINES = 120


def _report_log(log: Path, tail: bool) -> None:
    "Print the last lines of the campaign log (when `tail`) and copy it to $OUT when that is set."
    if not log.exists():
        print(f"gpu-check: no campaign log at {log}", file=sys.stderr); return
    if tail:
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        print(f"gpu-check: ---- last {len(lines)} lines of {log} ----", file=sys.stderr)
        print("\n".join(lines), file=sys.stderr)
        print("gpu-check: ---- end of campaign log ----", file=sys.stderr, flush=True)
    if os.environ.get("OUT"):
        try: shutil.copy(log, Path(os.environ["OUT"]) / "campaign.log")
        except OSError as e: print(f"gpu-check: could not copy the log to $OUT: {e}", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    ap.add_argument("--cpu-dry-run", action="store_true", help="run the same path on the CPU to check the script")
    ap.add_argument("--timeout", type=float, default=0, help="stop the campaign after this many seconds (0: never)")
    a = ap.parse_args(argv)
    import torch
    device_name = "cpu (dry run)" if a.cpu_dry_run else None
    if a.cpu_dry_run:
        os.environ["PIXRL_USE_VLLM"] = "0"
    elif not torch.cuda.is_available():
        print("gpu-check: refused — no CUDA device is visible to torch "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); run it on a GPU machine", file=sys.stderr)
        return 2
    device_name = device_name or torch.cuda.get_device_name(0)
    from pixrl.pix.tiny import char_tokenizer, tiny_config, save_tiny
    from transformers import Qwen2ForCausalLM
    from pixrl.core import set_seed
    work = Path(tempfile.mkdtemp(prefix="pixrl-gpu-check-"))
    set_seed(0)
    cfg = tiny_config(hidden=a.hidden, layers=a.layers, heads=max(4, a.hidden // 64), kv_heads=2,
                      intermediate=3 * a.hidden, max_positions=2048)
    model = Qwen2ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    mdir = save_tiny(model, char_tokenizer(), work / "model", {"note": "gpu-check from-config model (untrained)"})
    print(f"gpu-check: {device_name}; model {n_params / 1e6:.1f} M params (hidden {a.hidden}, "
          f"{a.layers} layers) at {mdir}")
    env = {**os.environ, "PIXRL_CACHE": str(work / "cache")}
    cmd = [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", "B", "--model", str(mdir), "--runs-root",
           str(work / "runs"), "--name", "gpu", "--smoke", "--levels", "0,1", "--probe-per-level", "4",
           "--probe-k", "4", "--groups-per-step", "4", "--lora-r", "32", "--save-steps", "1"]
    t0 = time.time()
    run = work / "runs" / "gpu"; log = run / "campaign.log"
    sys.stdout.flush()
    # Its own process group (same session), so that a timeout, Ctrl-C or SIGTERM here ends its stage processes too.
    p = subprocess.Popen(cmd, env=env, preexec_fn=os.setpgrp)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rc = p.wait(timeout=a.timeout or None)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL); p.wait(); rc = f"timed out after {a.timeout:g} s"
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL); raise
    if rc != 0:
        _report_log(log, tail=True)
        print(f"gpu-check: FAILED ({rc if isinstance(rc, str) else f'exit {rc}'}); kept {work}; log: {log}",
              file=sys.stderr)
        return 1
    try:
        res = _summary(run, device_name, n_params, t0)
    except Exception:
        _report_log(log, tail=True)
        print(f"gpu-check: FAILED summarising the run; kept {work}; log: {log}", file=sys.stderr)
        raise
    _report_log(log, tail=False)
    print(json.dumps(res, indent=1))
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "gpu_check.json").write_text(json.dumps(res, indent=1) + "\n")
    if not a.keep: shutil.rmtree(work, ignore_errors=True)
    else: print(f"gpu-check: kept {work}")
    return 0


def _summary(run: Path, device_name: str, n_params: int, t0: float) -> dict:
    "The check's result from the finished campaign's state.json and metrics_*.json."
    state = json.loads((run / "state.json").read_text())
    rows = [row for k in range(len(state["stages"])) for row in json.loads((run / f"metrics_{k}.json").read_text())
            if "step_time" in row]
    step_s = sum(x["step_time"] for x in rows) / len(rows)
    per_stage = []
    for k in range(len(state["stages"])):
        h = [x for x in json.loads((run / f"metrics_{k}.json").read_text()) if "step_time" in x]
        per_stage.append((h[-1]["num_tokens"], sum(x["step_time"] for x in h)))  # TRL's num_tokens is cumulative
    tok_s = sum(t for t, _ in per_stage) / sum(s for _, s in per_stage)
    shares = [s["time_shares"] for s in state["stages"] if s.get("time_shares")]
    gen = sum(x["generation"] for x in shares) / len(shares); ev = sum(x["evaluation"] for x in shares) / len(shares)
    return {"device": device_name, "params_M": round(n_params / 1e6, 1),
            "mean_step_s": round(step_s, 3), "tokens_per_s": round(tok_s, 1),
            "share_generation": round(gen, 3), "share_evaluation": round(ev, 3),
            "share_optimisation": round(1 - gen - ev, 3), "wall_s": round(time.time() - t0, 1),
            "use_vllm": os.environ.get("PIXRL_USE_VLLM", "auto")}


if __name__ == "__main__":
    sys.exit(main())
