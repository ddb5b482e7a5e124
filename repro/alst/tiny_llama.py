"""A tiny Llama built locally, and an offline stand-in for the hub repo DeepSpeed's tests load.

Nothing here downloads anything. ``build`` saves a ``LlamaForCausalLM`` of a fixed ``LlamaConfig`` (the shape of
hf-internal-testing/tiny-random-LlamaForCausalLM) and seed; ``hub-cache`` lays it out in a Hugging Face hub cache
under that repo id, so that DeepSpeed's tests/unit/ulysses_alst/test_ulysses_sp_hf.py runs unchanged and offline
(docs/alst-recipe.md):

    python -m repro.tiny_llama build DIR            # save the model to DIR
    python -m repro.tiny_llama hub-cache HF_HOME    # build it into a hub cache; prints the env to use

Then, in a DeepSpeed checkout::

    HF_HUB_OFFLINE=1 HF_HOME=HF_HOME PYTHONPATH=.:$PWD/tests DS_ACCELERATOR=cpu LOCAL_SIZE=2 \\
        pytest tests/unit/ulysses_alst/test_ulysses_sp_hf.py -k TestUlyssesSPHF
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from repro.harness import exit_codes

HUB_REPO_ID = "hf-internal-testing/tiny-random-LlamaForCausalLM"
SEED = 20260917

# The hub repo's architecture, as plain data: the unit tests and the cache key need no transformers.
TINY_LLAMA_CONFIG: dict = dict(hidden_size=16, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                               rms_norm_eps=1e-6, hidden_act="silu", initializer_range=0.02, tie_word_embeddings=False,
                               bos_token_id=0, eos_token_id=1)

# A fixed, made-up revision: the cache needs one, and a fixed one keeps reruns identical.
CACHE_REVISION = "0" * 24 + "a1570000d5c0ffee"


class TransformersMissing(RuntimeError):
    """transformers is not installed: the caller turns this into a skip."""


def config_key(seed: int = SEED) -> str:
    """A short id of (architecture, seed, transformers version): the cache folder's name."""
    from repro.harness.env import dist_version

    tf_version = dist_version("transformers") or "none"
    blob = json.dumps({"config": TINY_LLAMA_CONFIG, "seed": seed, "transformers": tf_version}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def make_model(seed: int = SEED):
    """The tiny Llama in fp32, its weights a pure function of ``seed`` (CPU generator)."""
    try:
        import transformers
    except ImportError as err:
        raise TransformersMissing(
            "transformers is not installed (install the 'alst' extra: pip install 'zero3-sp-gradfix[alst]')") from err
    import torch

    config = transformers.LlamaConfig(**TINY_LLAMA_CONFIG)
    with torch.random.fork_rng(devices=[]):  # the global CPU generator is restored afterwards
        torch.manual_seed(seed)
        return transformers.LlamaForCausalLM(config).float()


def build(folder: Path, seed: int = SEED) -> Path:
    """Save the model to ``folder`` (config.json + model.safetensors) unless it is already there. Safe from several
    processes at once: each renames its private temporary folder into place; the race's loser discards its copy."""
    folder = Path(folder)
    if _complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.{os.getpid()}.", dir=folder.parent))
    try:
        make_model(seed).save_pretrained(tmp, safe_serialization=True)
        if not _complete(tmp):
            raise RuntimeError(f"transformers saved no config.json and model.safetensors into {tmp}")
        try:
            os.rename(tmp, folder)
        except OSError:
            if not _complete(folder):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def _remove_leftovers(folder: Path) -> None:
    """What a killed build left: an entry without its files, temporary folders of processes that are gone."""
    if folder.exists() and not _complete(folder):
        shutil.rmtree(folder, ignore_errors=True)
    for tmp in folder.parent.glob(f".{folder.name}.*"):
        pid = tmp.name.split(".")[2] if tmp.name.count(".") >= 3 else ""
        if not pid.isdigit() or not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def default_model_dir(seed: int = SEED) -> Path:
    from repro.harness.env import cache_root

    return cache_root() / "tiny-llama" / config_key(seed)


def populate_hub_cache(hf_home: Path, repo_id: str = HUB_REPO_ID, seed: int = SEED,
                       revision: str = CACHE_REVISION) -> Path:
    """Put the tiny model into ``hf_home``'s hub cache under ``repo_id`` (``refs/main`` -> the revision,
    ``snapshots/<revision>/``: what huggingface_hub reads offline); return the snapshot folder."""
    model_dir = build(default_model_dir(seed), seed)
    repo_dir = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))  # the hub cache's layout
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.is_file():
            shutil.copy2(item, snapshot / item.name)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return snapshot


def offline_env(hf_home: Path) -> dict[str, str]:
    """The variables under which ``from_pretrained(repo_id)`` reads only the cache above."""
    return {"HF_HOME": str(Path(hf_home).resolve()), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.tiny_llama", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="save the tiny Llama to DIR")
    p_build.add_argument("dir", type=Path, help="the folder to save the model and its config in")
    p_cache = sub.add_parser("hub-cache", help=f"lay the tiny Llama out in HF_HOME's hub cache as {HUB_REPO_ID}")
    p_cache.add_argument("hf_home", type=Path, help="the HF_HOME whose hub/ cache gets the model")
    p_cache.add_argument("--repo-id", default=HUB_REPO_ID, help="the hub name it is cached as (default %(default)s)")
    for p in (p_build, p_cache):
        p.add_argument("--seed", type=int, default=SEED, help="the weights' seed (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build(args.dir, args.seed))
        else:
            snapshot = populate_hub_cache(args.hf_home, args.repo_id, args.seed)
            print(f"# {args.repo_id} -> {snapshot}")
            for key, value in offline_env(args.hf_home).items():
                print(f"export {key}={value}")
    except TransformersMissing as err:
        print(f"SKIP: {err}")
        return exit_codes.SKIPPED
    return 0


if __name__ == "__main__":
    sys.exit(main())
