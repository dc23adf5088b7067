"""Load lerobot's VQ-BeT from the optional environment that scripts/lerobot_env.sh installs.

Only nbs/offset_lerobot.ipynb and tests/test_offset_lerobot.py import this file; pixrl never imports lerobot.
`load()` appends the private folder to sys.path (so nothing there shadows a package of .venv) and imports
lerobot's own `lerobot.policies.vqbet` modules, with two loader interventions, neither of which replaces
any lerobot code that VQ-BeT's head, GPT or VQ-VAE run:

1. `torchvision._meta_registrations` is pre-registered as an empty module. The only torchvision wheel for
   torch 2.13 here (0.28.0, PyPI) is a CUDA build whose C++ ops (nms, roi_align, ...) cannot load against
   .venv's CPU torch; its meta-kernel registrations for those ops then fail at import. VQ-BeT uses
   torchvision only for the ResNet backbone and crops of its image encoder (pure Python, unaffected).
2. `lerobot.policies` is pre-registered as a bare package (its folder as __path__), so its `__init__`, which
   eagerly imports every policy's configuration, does not run: GR00T's config dataclass does not build under
   .venv's transformers 5.x (lerobot 0.4.4 was released against transformers 4.x). VQ-BeT's modules and every
   module they import still run from lerobot's files.
"""
from __future__ import annotations
import importlib, json, os, sys, types
from pathlib import Path

LEROBOT_VERSION = "0.4.4"

def lerobot_dir() -> Path:
    "$PIXRL_LEROBOT_DIR, default $PIXRL_CACHE/envs/lerobot-0.4.4 (as in scripts/lerobot_env.sh)."
    cache = Path(os.environ.get("PIXRL_CACHE") or Path.home() / ".cache" / "pixrl")
    return Path(os.environ.get("PIXRL_LEROBOT_DIR") or cache / "envs" / f"lerobot-{LEROBOT_VERSION}")

def missing_reason() -> str | None:
    "None when the environment is installed; else a sentence saying what is missing and how to install it."
    stamp = lerobot_dir() / ".pixrl-lerobot.json"
    if not stamp.exists():
        return f"the optional lerobot environment is absent ({stamp} not found): run `make lerobot-env`"
    return None

def load() -> types.SimpleNamespace:
    """Import lerobot's VQ-BeT pieces. Returns a namespace: VQBeTConfig, VQBeTHead, VQBeTPolicy, GPT, MLP,
    PolicyFeature, FeatureType, AdamConfig-building presets via the config, `version` (lerobot's) and `versions`
    (every package of the private folder)."""
    reason = missing_reason()
    if reason: raise RuntimeError(reason)
    d = str(lerobot_dir())
    if d not in sys.path: sys.path.append(d)
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import lerobot
    if not lerobot.__file__.startswith(d):
        raise RuntimeError(f"lerobot was imported from {lerobot.__file__}, not from the private folder {d}")
    if "lerobot.policies" not in sys.modules:
        pkg = types.ModuleType("lerobot.policies")
        pkg.__path__ = [str(Path(lerobot.__file__).parent / "policies")]
        sys.modules["lerobot.policies"] = pkg
    modeling = importlib.import_module("lerobot.policies.vqbet.modeling_vqbet")
    utils = importlib.import_module("lerobot.policies.vqbet.vqbet_utils")
    config = importlib.import_module("lerobot.policies.vqbet.configuration_vqbet")
    types_ = importlib.import_module("lerobot.configs.types")
    stamp = json.loads((lerobot_dir() / ".pixrl-lerobot.json").read_text())
    return types.SimpleNamespace(VQBeTConfig=config.VQBeTConfig, VQBeTHead=modeling.VQBeTHead,
                                 VQBeTPolicy=modeling.VQBeTPolicy, VQBeTModel=modeling.VQBeTModel, MLP=modeling.MLP,
                                 GPT=utils.GPT, PolicyFeature=types_.PolicyFeature, FeatureType=types_.FeatureType,
                                 version=lerobot.__version__, versions=stamp["versions"], dir=d,
                                 modeling_file=modeling.__file__)
