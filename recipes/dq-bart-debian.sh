#!/usr/bin/env bash
# bash recipes/dq-bart-debian.sh [DATA_DIR] [OUT_DIR]        (SCALE=small, the default, or SCALE=paper)
#
# DQ-BART Table 1 on the Debian descriptions, with the seq2seq teacher of recipes/teacher-debian.sh
# as the full-precision model (32-32-32 6-6):
#   teacher  recipes/teacher-debian.sh (skipped when OUT_DIR/teacher is complete)
#   quant    8-8-8 and 2-2-8 direct quantization (no training); 8-8-8 6-6, 2-2-8 6-6 and 2-2-8 6-3
#            (decoder layers 0, 3, 5) by distillation-aware quantization on the gold training pairs:
#            task cross-entropy + MSE on logits, attention (the student's before dropout) and hidden
#            states, the float teacher teaching
#   eval     every model on VALID_DOCS validation documents, against the float teacher (paired test);
#            then distillation-aware against direct and 6-3 against 6-6 (paired tests of those scores)
#   table    the table as markdown: bytes on disk and compression as stored (ternary at 1.6 bits) and
#            as the paper counts it (2 bits a weight), ROUGE with 95% intervals
#
#   SCALE=small  STEPS=300 training steps of a 3,072-token budget (~31 pairs) at lr 1e-4 per
#                distillation-aware model, VALID_DOCS=1000; about three hours on 2 CPU cores after the
#                teacher (JOBS=2; measured: 13 to 20 s a step, median 15 to 17, on one thread beside another
#                job, 75 to 90 minutes a model, three models in two rounds, then evaluations of about 6
#                minutes each), so it continues over sessions.
#   SCALE=paper  the paper's schedule: 10 epochs (quantization only) or 20 (quantization + fewer
#                layers), batch 128, lr 3e-5, 5% warmup, best checkpoint by ROUGE-L on validation; the
#                whole validation set. For GPUs: LAUNCH="accelerate launch -m modelshrink".
# Knobs: STEPS, DOCS (training pairs; default all), VALID_DOCS, STAGES, LAUNCH, TEACHER, and JOBS=N: the
# distillation-aware models and the evaluations run N at a time, THREADS (1) threads each (recipes/lib/jobs.sh;
# REPRODUCTION.md ran JOBS=2 on 2 CPU cores).
# Interrupted? Run it again: every step passes --resume (models continue from their last checkpoint,
# evaluations from their last batch).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${1:-../shared/data/debian-descriptions}
out=${2:-runs/repro}
scale=${SCALE:-small}
stages=${STAGES:-"teacher quant eval table"}
launch=${LAUNCH:-modelshrink}
teacher=${TEACHER:-$out/teacher}
train=$data/train.jsonl.gz validation=$data/validation.jsonl.gz
case $scale in
  small) valid=${VALID_DOCS:-1000}
         same=(--max-steps "${STEPS:-300}" --lr 1e-4 --warmup-ratio 0.05 --max-tokens 3072 --save-every 100)
         fewer=("${same[@]}") ;;
  paper) valid=${VALID_DOCS:-all}
         every=(--lr 3e-5 --warmup-ratio 0.05 --batch-size 128 --validation "$validation" --eval-every 500
                --eval-limit 500 --metric rougeL --save-every 500)
         same=(--epochs 10 "${every[@]}") fewer=(--epochs 20 "${every[@]}") ;;
  *) echo "SCALE must be small or paper, not '$scale'" >&2; exit 2 ;;
esac
[[ -f $train ]] || { echo "no $train (the Debian descriptions; see ../shared/data/README.md)" >&2; exit 2; }
limit=(); [[ -n ${DOCS:-} ]] && limit=(--limit "$DOCS")
vlimit=(); [[ $valid == all ]] || vlimit=(--limit "$valid")
dq=$out/dq-bart
mkdir -p "$dq"
gen=(--num-beams 4 --max-length 32 --no-repeat-ngram-size 3 --max-source-length 128)
# shellcheck disable=SC2086
run() { $launch "$@" --resume --quiet; }
source "$here/lib/jobs.sh"
[[ $jobs_max == 1 || $launch == modelshrink ]] || {
  echo "JOBS=$jobs_max runs one-process steps side by side on a CPU machine; with LAUNCH ($launch) keep JOBS=1" >&2; exit 2; }

if [[ $stages == *teacher* && $teacher == "$out/teacher" ]]; then
  SCALE=$scale bash "$here/teacher-debian.sh" "$data" "$out/teacher"
fi

models=(888-direct 228-direct 888-6-6 228-6-6 228-6-3)
if [[ $stages == *quant* ]]; then
  run quantize "$teacher" -o "$dq/888-direct" --bits 8-8-8 --method direct >/dev/null
  run quantize "$teacher" -o "$dq/228-direct" --bits 2-2-8 --method direct >/dev/null
  aware=(--data "$train" "${limit[@]}" --max-source-length 128 --max-target-length 32 --seed 0)
  spawn run quantize "$teacher" -o "$dq/888-6-6" --bits 8-8-8 "${aware[@]}" "${same[@]}" >/dev/null
  spawn run quantize "$teacher" -o "$dq/228-6-6" --bits 2-2-8 "${aware[@]}" "${same[@]}" >/dev/null
  spawn run quantize "$teacher" -o "$dq/228-6-3" --bits 2-2-8 --decoder-layers 3 "${aware[@]}" "${fewer[@]}" >/dev/null
  settle
fi

if [[ $stages == *eval* ]]; then
  run eval "$teacher" "$validation" -o "$dq/eval-float" "${vlimit[@]}" "${gen[@]}" --latency-docs 0 >/dev/null
  for name in "${models[@]}"; do   # after the float model's: each is tested against it
    spawn run eval "$dq/$name" "$validation" -o "$dq/eval-$name" "${vlimit[@]}" "${gen[@]}" --latency-docs 0 \
      --reference-size "$teacher" --against "$dq/eval-float" >/dev/null
  done
  settle
  # the paper's claims are comparisons between rows: distillation-aware against direct, fewer decoder
  # layers against all six; each re-tests two finished evaluations' predictions (nothing is generated)
  for pair in 888-6-6:888-direct 228-6-6:228-direct 228-6-3:228-6-6; do
    a=${pair%%:*} b=${pair##*:}
    [[ -f $dq/eval-$a-vs-$b/metrics.json ]] ||
      $launch eval "$dq/eval-$a" -o "$dq/eval-$a-vs-$b" --against "$dq/eval-$b" --overwrite --quiet >/dev/null
  done
fi

if [[ $stages == *table* ]]; then
  python "$here/tables.py" dqbart "$out"
fi
