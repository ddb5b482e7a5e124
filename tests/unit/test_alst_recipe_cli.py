"""repro/alst_recipe.py's preflight and flags (repro.alst), tiny_llama's offline cache layout: no ranks are started."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.alst import measure as alst_measure, run as alst_run, tiny_llama
from repro.harness.cli import ReproArgs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "repro" / "alst_recipe.py"


def _args(sp, world_size=None):
    return ReproArgs(world_size=world_size or sp, sp=sp, backend="gloo", expect="fixed", json=None, timeout=60,
                     keep_logs=False)


@pytest.mark.parametrize("sp,ok", [(1, False), (2, True), (3, False), (4, True), (8, False)])
def test_sp_must_split_heads_and_sequence(sp, ok):
    assert (alst_run.usage_error(_args(sp)) is None) == ok


def test_sample_masks_a_prompt_and_keeps_tokens_in_every_shard():
    for dp_index in range(2):
        input_ids, position_ids, labels = alst_measure.sample(dp_index)
        assert input_ids.shape == position_ids.shape == labels.shape == (1, alst_measure.SEQ_LEN)
        assert (labels[0, :alst_measure.MASKED_PREFIX] == -100).all()
        assert (labels[0, alst_measure.MASKED_PREFIX:] == input_ids[0, alst_measure.MASKED_PREFIX:]).all()
        # What UlyssesSPDataLoaderAdapter does: pad with -100, shift left, cut into sp shards.
        shifted = list(labels[0, 1:].tolist()) + [-100]
        for sp in (2, 4):
            n = alst_measure.SEQ_LEN // sp
            counts = [sum(t != -100 for t in shifted[i * n:(i + 1) * n]) for i in range(sp)]
            assert min(counts) >= 1 and len(set(counts)) > 1  # unequal weights: the weighting is exercised
    assert not (alst_measure.sample(0)[0] == alst_measure.sample(1)[0]).all()  # dp groups see different samples


def _stub_tree(tmp_path, name, files):
    pkg = tmp_path / name
    pkg.mkdir(parents=True)
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _run(env_path, *argv):
    env = {**os.environ, "PYTHONPATH": f"{env_path}{os.pathsep}{ROOT}"}
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env, timeout=120)


def test_deepspeed_without_ulysses_is_skipped(tmp_path):
    # A DeepSpeed as before 0.17.2: the package exists, UlyssesSPAttentionHF does not.
    stub = _stub_tree(tmp_path, "deepspeed", {"__init__.py": "", "runtime/sequence_parallel/layer.py": ""})
    _stub_tree(tmp_path, "transformers", {"__init__.py": ""})
    run = _run(stub, "--backend", "gloo")
    assert run.returncode == 77, run.stdout + run.stderr
    assert "SKIP:" in run.stdout and "UlyssesSPAttentionHF" in run.stdout


def test_skip_reason_names_transformers(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name))
    assert "transformers is not installed" in alst_measure.skip_reason()


def test_bad_sp_is_a_usage_error():
    run = subprocess.run([sys.executable, str(SCRIPT), "--sp", "1", "--world-size", "2"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "--sp must be >= 2" in run.stderr


def test_tiny_llama_shape_is_the_hub_repos():
    cfg = tiny_llama.TINY_LLAMA_CONFIG
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 4  # head_dim 4, as DeepSpeed's test notes
    assert (cfg["num_hidden_layers"], cfg["vocab_size"], cfg["intermediate_size"]) == (2, 32000, 64)


def test_offline_env(tmp_path):
    env = tiny_llama.offline_env(tmp_path)
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == str(tmp_path.resolve())


def test_config_key_depends_on_the_seed():
    assert tiny_llama.config_key(1) != tiny_llama.config_key(2)
    assert tiny_llama.config_key(1) == tiny_llama.config_key(1)


def test_hub_cache_is_read_offline(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("ZERO3_SP_CACHE", str(tmp_path / "cache"))
    snapshot = tiny_llama.populate_hub_cache(tmp_path / "hf")
    repo = tmp_path / "hf" / "hub" / "models--hf-internal-testing--tiny-random-LlamaForCausalLM"  # the hub's layout
    assert snapshot == repo / "snapshots" / tiny_llama.CACHE_REVISION
    assert (repo / "refs" / "main").read_text() == tiny_llama.CACHE_REVISION
    assert (snapshot / "config.json").exists() and (snapshot / "model.safetensors").exists()
    code = ("from transformers import AutoModelForCausalLM as A; "
            f"m = A.from_pretrained('{tiny_llama.HUB_REPO_ID}'); "
            "print(sum(p.numel() for p in m.parameters()), m.config.num_attention_heads)")
    env = {**os.environ, **tiny_llama.offline_env(tmp_path / "hf")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["1032272", "4"], transformers.__version__


class _GlooShapeBug:

    def __iter__(self):
        return self

    def __next__(self):
        raise RuntimeError("ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (), got (1))")


def test_manual_sharding_matches_the_adapter_semantics():
    input_ids, position_ids, labels = alst_measure.sample(0)
    notes: dict[str, str] = {}
    shards = [
        alst_measure._first_shard(_GlooShapeBug(), input_ids, position_ids, labels, r, 2, notes) for r in range(2)
    ]
    import torch

    assert torch.equal(torch.cat([s["input_ids"] for s in shards], 1), input_ids)
    assert torch.equal(torch.cat([s["position_ids"] for s in shards], 1), position_ids)
    shift = torch.cat([s["shift_labels"] for s in shards], 1)
    assert torch.equal(shift[0, :-1], labels[0, 1:]) and int(shift[0, -1]) == -100
    assert "gloo" in notes["adapter"] and not hasattr(alst_measure, "ADAPTER_NOTE")  # the caller's, not module state


def test_other_adapter_errors_propagate():

    class Broken:

        def __iter__(self):
            return self

        def __next__(self):
            raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        alst_measure._first_shard(Broken(), *alst_measure.sample(0), 0, 2, {})


@pytest.mark.parametrize(
    "argv",
    [[str(ROOT / "repro" / "alst_recipe.py"), "--help"], [str(ROOT / "repro" / "downstream_clients.py"), "--help"],
     [str(ROOT / "repro" / "alst_optimizer_effect.py"), "--help"], [str(ROOT / "repro" / "tiny_llama.py"), "--help"],
     ["-m", "repro.tiny_llama", "--help"]])
def test_the_thin_scripts_still_run(argv):
    # The documented commands: each script is a thin wrapper of its package's main.
    run = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "usage:" in run.stdout
