#!/usr/bin/env bash
# Runs the patch's test on transformers 5.25.0 before (test file only) and after (whole patch), once per
# given Python environment, and ruff 0.14.10 on the touched files; writes <tree>-<name>.{log,xml} and ruff.log
# beside this script, with this machine's folders replaced by <work>, <venv> and <tmp>.
#
#   run.sh NAME=VENV [NAME=VENV ...]      e.g. run.sh ds0.19.8-backport=$HOME/venvs/a ds0.19.8=$HOME/venvs/b
#
# Each VENV: torch, deepspeed, accelerate, pytest and transformers 5.25.0's dependencies (transformers itself
# comes from the tree, PYTHONPATH=src). RUFF (default: ruff on PATH) must be ruff 0.14.10, transformers' pin.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 NAME=VENV [NAME=VENV ...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
patch=$(ls "$here"/../*.patch)
test_file=tests/deepspeed/test_alst_ulysses_sp_gradients.py
ruff=${RUFF:-ruff}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pip download -q --no-deps --no-binary :all: -d "$work" transformers==5.25.0
for tree in before after; do
    mkdir "$work/$tree"
    tar xzf "$work/transformers-5.25.0.tar.gz" -C "$work/$tree" --strip-components=1
done
(cd "$work/before" && git apply --include="$test_file" "$patch")
(cd "$work/after" && patch -p1 --batch --forward -i "$patch")

sanitize() { sed -E -e "s#$work#<work>#g" -e "s#$1#<venv>#g" -e 's#/tmp/tmp[A-Za-z0-9_]+#<tmp>#g'; }

for spec in "$@"; do
    name=${spec%%=*}
    venv=$(cd "${spec#*=}" && pwd)
    for tree in before after; do
        out="$here/$tree-$name"
        (
            cd "$work/$tree"
            export PATH="$venv/bin:$PATH" PYTHONPATH=src DS_ACCELERATOR=cpu USE_HUB_KERNELS=0
            export TORCH_EXTENSIONS_DIR="$venv/torch-ext"
            echo "\$ cd <work>/$tree && DS_ACCELERATOR=cpu USE_HUB_KERNELS=0 PYTHONPATH=src python -m pytest $test_file -rA"
            python - <<'PY'
import importlib.metadata as md
import deepspeed.runtime.zero.stage3 as stage3
import transformers
print({d: md.version(d) for d in ("torch", "deepspeed", "accelerate")}, "transformers (tree):", transformers.__version__,
      "ZERO3_SP_GRADIENTS_SUMMED:", getattr(stage3, "ZERO3_SP_GRADIENTS_SUMMED", "absent"))
PY
            start=$(date +%s)
            set +e
            python -m pytest "$test_file" -p no:cacheprovider -rA --junitxml="$work/$tree-$name.xml"
            echo "exit code $? in $(( $(date +%s) - start )) s"
        ) 2>&1 | sanitize "$venv" > "$out.log"
        sanitize "$venv" < "$work/$tree-$name.xml" > "$out.xml"
        tail -n 2 "$out.log"
    done
done

files="src/transformers/integrations/deepspeed.py src/transformers/trainer.py $test_file"
(
    cd "$work/after"
    set +e
    echo "\$ $("$ruff" --version); cd <work>/after (config: its pyproject.toml)"
    echo "\$ ruff check $files"
    "$ruff" check $files; echo "exit code $?"
    echo "\$ ruff format --check $files"
    "$ruff" format --check $files; echo "exit code $?"
) 2>&1 | sed -e "s#$work#<work>#g" > "$here/ruff.log"
cat "$here/ruff.log"
