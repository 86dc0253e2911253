#!/usr/bin/env bash
# What only a GPU machine shows, in one call of the device tool (see the guide's `device`): the
# examples under `run` with CUDA (their traces, JSON and logs come back in $OUT/gpu_examples.tgz),
# then issue 30's DataLoader pairs on an otherwise idle machine (benchmarks/loader_pairs.py).
# Needs the wheels the machine lacks in .whl/ (polars, msgspec: see benchmarks/README.md).
set -u
export PYTHONUNBUFFERED=1
REPO=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO
python3 -c "import torch, typer, polars, rich; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'typer', typer.__version__, 'polars', polars.__version__)"
nvidia-smi -L
mkdir -p /tmp/ex && cd /tmp/ex || exit 1
for s in ${EXAMPLES:-item_every_step item_every_step_fixed tensor_branch tensor_branch_fixed pageable_copy pageable_copy_fixed serial_dataloader serial_dataloader_fixed}; do
  start=$(date +%s)
  timeout 120 python3 -m traceinsight run --trace "$s.pt.trace.json.gz" --json "$s.json" --no-html "$REPO/examples/$s.py" >"$s.log" 2>&1
  echo "=== $s rc=$? $(($(date +%s) - start)) s"
  grep -v "^step \|^epoch " "$s.log" | tail -22
done
tar czf "$OUT/gpu_examples.tgz" ./*.json ./*.gz ./*.log
cd "$REPO" || exit 1
if [ "${PAIRS:-4}" -gt 0 ]; then  # PAIRS=0: the examples alone
  timeout "${PAIRS_TIMEOUT:-330}" python3 benchmarks/loader_pairs.py --pairs "${PAIRS:-4}" --python python3 2>&1 | tee "$OUT/loader_pairs.log"
fi
