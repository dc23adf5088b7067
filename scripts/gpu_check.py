"""`make gpu-check`: a smoke pix campaign on CUDA with a from-config Qwen2 model larger than pixrl-tiny.

Builds (no download) a ~30 M-parameter Qwen2 model with pixrl-tiny's character tokenizer, runs arm B in smoke mode
(2 GRPO steps per stage, levels 0-1, vLLM rollouts when `vllm` is installed, HF generate otherwise; force with
PIXRL_USE_VLLM=0/1), and prints the mean GRPO step time, tokens/s and the generation/evaluation/optimisation shares.
Refuses clearly when CUDA is not available.

usage: python scripts/gpu_check.py [--hidden 512] [--layers 8] [--keep] [--cpu-dry-run]

--cpu-dry-run runs the same path on the CPU (no CUDA, no vLLM; use small --hidden/--layers) to check the
script itself where no GPU is lent; its numbers are CPU numbers, not a GPU measurement.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    ap.add_argument("--cpu-dry-run", action="store_true", help="run the same path on the CPU to check the script")
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
    from pixrl.tiny import char_tokenizer, tiny_config, save_tiny
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
    cmd = [sys.executable, "-m", "pixrl.campaign", "run", "--arm", "B", "--model", str(mdir), "--runs-root",
           str(work / "runs"), "--name", "gpu", "--smoke", "--levels", "0,1", "--probe-per-level", "4",
           "--probe-k", "4", "--groups-per-step", "4", "--lora-rank", "32", "--save-steps", "1"]
    t0 = time.time()
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        print(f"gpu-check: FAILED (exit {r.returncode}); log: {work / 'runs' / 'gpu' / 'campaign.log'}", file=sys.stderr)
        return 1
    run = work / "runs" / "gpu"
    state = json.loads((run / "state.json").read_text())
    rows = [row for k in range(len(state["stages"])) for row in json.loads((run / f"metrics_{k}.json").read_text())
            if "step_time" in row]
    step_s = sum(x["step_time"] for x in rows) / len(rows)
    tokens = sum(x.get("num_tokens", 0) for x in rows[-1:])  # TRL's num_tokens is cumulative within a stage
    per_stage = []
    for k in range(len(state["stages"])):
        h = [x for x in json.loads((run / f"metrics_{k}.json").read_text()) if "step_time" in x]
        per_stage.append((h[-1]["num_tokens"], sum(x["step_time"] for x in h)))
    tok_s = sum(t for t, _ in per_stage) / sum(s for _, s in per_stage)
    shares = [s["time_shares"] for s in state["stages"] if s.get("time_shares")]
    gen = sum(x["generation"] for x in shares) / len(shares); ev = sum(x["evaluation"] for x in shares) / len(shares)
    print(json.dumps({"device": device_name, "params_M": round(n_params / 1e6, 1),
                      "mean_step_s": round(step_s, 3), "tokens_per_s": round(tok_s, 1),
                      "share_generation": round(gen, 3), "share_evaluation": round(ev, 3),
                      "share_optimisation": round(1 - gen - ev, 3), "wall_s": round(time.time() - t0, 1),
                      "use_vllm": os.environ.get("PIXRL_USE_VLLM", "auto")}, indent=1))
    if not a.keep: shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
