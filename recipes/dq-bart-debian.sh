#!/usr/bin/env bash
# bash recipes/dq-bart-debian.sh [DATA_DIR] [OUT_DIR]        (SCALE=small, the default, or SCALE=paper)
#
# DQ-BART Table 1 on the Debian descriptions, with the seq2seq teacher of recipes/teacher-debian.sh
# as the full-precision model (32-32-32 6-6):
#   teacher  recipes/teacher-debian.sh (skipped when OUT_DIR/teacher is complete)
#   quant    8-8-8 and 2-2-8 direct quantization (no training); 8-8-8 6-6, 2-2-8 6-6 and 2-2-8 6-3
#            (decoder layers 0, 3, 5) by distillation-aware quantization on the gold training pairs:
#            task cross-entropy + MSE on logits, attention (the student's before dropout) and hidden
#            states, the float teacher teaching; 6-3 gets twice the steps (the paper: 20 epochs, not 10).
#            Each row twice: as modelshrink quantizes by default, and with the DQ-BART authors'
#            activation clamp (--activation-clip $CLIP, rows named *-clip; CLIP=none leaves them out)
#   eval     every model on the first VALID_DOCS validation documents, against the float teacher (paired
#            test); then distillation-aware against direct, 6-3 against 6-6 and clamped against unclamped
#            (paired tests of those scores). Checkpoints are chosen (SCALE=gpu, paper) on the validation
#            rows after those, never on the scored ones.
#   table    the table as markdown: bytes on disk and compression as stored (ternary at 1.6 bits) and
#            as the paper counts it (2 bits a weight), ROUGE with 95% intervals
#
#   SCALE=small  STEPS=300 training steps of a 3,072-token budget (~31 pairs) at lr 1e-4 per
#                distillation-aware model, VALID_DOCS=1000; about three hours on 2 CPU cores after the
#                teacher (JOBS=2; measured: 13 to 20 s a step, median 15 to 17, on one thread beside another
#                job, 75 to 90 minutes a model, three models in two rounds, then evaluations of about 6
#                minutes each), so it continues over sessions.
#   SCALE=gpu    what REPRODUCTION.md ran on one H200: batches of 12,288 tokens (about the paper's 128
#                pairs), STEPS=240 (6-3: 480), lr 1e-4, 5% warmup, ROUGE-L on 300 held-out validation
#                rows every 60 steps, the best checkpoint kept, stopped after 3 validations without gain.
#   SCALE=paper  the paper's schedule: 10 epochs (quantization only) or 20 (quantization + fewer
#                layers), batch 128, lr 3e-5, 5% warmup, best checkpoint by ROUGE-L on the held-out
#                validation rows. For GPUs: LAUNCH="accelerate launch -m modelshrink".
# ROWS="228-6-6": only these rows (of 888-direct 228-direct 888-6-6 228-6-6 228-6-3), their clamp twins, and the
# comparisons between rows both named; an unknown name stops the recipe before anything runs.
# EVERY (SCALE=gpu): validate and checkpoint every EVERY steps (default 60).
# Knobs: STEPS, EVERY, ROWS, DOCS (training pairs; default all), VALID_DOCS, CLIP, STAGES, LAUNCH, TEACHER, and JOBS=N: the
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
valid=${VALID_DOCS:-1000} clip=${CLIP:-2.5}
dq=$out/dq-bart
dev=$dq/dev.jsonl  # the validation rows after the scored ones: checkpoints are chosen on these
select=(--validation "$dev" --metric rougeL --num-beams 4 --max-length 32)
case $scale in
  small) steps=${STEPS:-300}
         every=(--lr 1e-4 --warmup-ratio 0.05 --max-tokens 3072 --save-every 100)
         same=(--max-steps "$steps" "${every[@]}") fewer=(--max-steps $((2 * steps)) "${every[@]}") ;;
  gpu)   steps=${STEPS:-240}
         every=(--lr 1e-4 --warmup-ratio 0.05 --max-tokens 12288 "${select[@]}" --eval-limit 300
                --eval-every "${EVERY:-60}" --early-stopping 3 --save-every "${EVERY:-60}")
         same=(--max-steps "$steps" "${every[@]}") fewer=(--max-steps $((2 * steps)) "${every[@]}") ;;
  paper) every=(--lr 3e-5 --warmup-ratio 0.05 --batch-size 128 "${select[@]}" --eval-every 500 --eval-limit 500
                --save-every 500)
         same=(--epochs 10 "${every[@]}") fewer=(--epochs 20 "${every[@]}") ;;
  *) echo "SCALE must be small, gpu or paper, not '$scale'" >&2; exit 2 ;;
esac
[[ -f $train ]] || { echo "no $train (the Debian descriptions; see ../shared/data/README.md)" >&2; exit 2; }
limit=(); [[ -n ${DOCS:-} ]] && limit=(--limit "$DOCS")
vlimit=(--limit "$valid")
mkdir -p "$dq"
[[ $scale == small || -s $dev ]] || python - "$validation" "$valid" "$dev" <<'EOF'
import gzip, sys
rows = gzip.open(sys.argv[1], "rt").read().splitlines()[int(sys.argv[2]):]
open(sys.argv[3], "w").write("".join(f"{row}\n" for row in rows))
EOF
gen=(--num-beams 4 --max-length 32 --no-repeat-ngram-size 3 --max-source-length 128)
# shellcheck disable=SC2086
run() { $launch "$@" --resume --quiet; }
source "$here/lib/jobs.sh"
source "$here/lib/dq_eval.sh"
[[ $jobs_max == 1 || $launch == modelshrink ]] || {
  echo "JOBS=$jobs_max runs one-process steps side by side on a CPU machine; with LAUNCH ($launch) keep JOBS=1" >&2; exit 2; }

rows=(888-direct 228-direct 888-6-6 228-6-6 228-6-3)
pairs=(888-6-6:888-direct 228-6-6:228-direct 228-6-3:228-6-6)
if [[ -n ${ROWS:-} ]]; then
  for name in $ROWS; do
    [[ " ${rows[*]} " == *" $name "* ]] || { echo "ROWS: unknown row '$name' (known: ${rows[*]})" >&2; exit 2; }
  done
  named() { [[ " $ROWS " == *" $1 "* ]]; }
  kept=() kept_pairs=()
  for name in "${rows[@]}"; do if named "$name"; then kept+=("$name"); fi; done
  for pair in "${pairs[@]}"; do if named "${pair%%:*}" && named "${pair##*:}"; then kept_pairs+=("$pair"); fi; done
  rows=("${kept[@]}") pairs=("${kept_pairs[@]}")
fi
wanted() { [[ " ${rows[*]} " == *" $1 "* ]]; }  # is row $1 made (ROWS unset, or named there)?

if [[ $stages == *teacher* && $teacher == "$out/teacher" ]]; then
  SCALE=$scale bash "$here/teacher-debian.sh" "$data" "$out/teacher"
fi

variants=(""); [[ $clip == none ]] || variants+=(-clip)
models=() compared=()
for v in "${variants[@]}"; do
  models+=("${rows[@]/%/$v}")
  for pair in "${pairs[@]}"; do compared+=("${pair%%:*}$v:${pair##*:}$v"); done
done
[[ $clip == none ]] || for row in "${rows[@]}"; do compared+=("$row-clip:$row"); done
if [[ $stages == *quant* ]]; then
  aware=(--data "$train" "${limit[@]}" --max-source-length 128 --max-target-length 32 --seed 0)
  for v in "${variants[@]}"; do
    c=(); [[ -z $v ]] || c=(--activation-clip "$clip")
    ! wanted 888-direct || run quantize "$teacher" -o "$dq/888-direct$v" --bits 8-8-8 --method direct "${c[@]}" >/dev/null
    ! wanted 228-direct || run quantize "$teacher" -o "$dq/228-direct$v" --bits 2-2-8 --method direct "${c[@]}" >/dev/null
  done
  for v in "${variants[@]}"; do
    c=(); [[ -z $v ]] || c=(--activation-clip "$clip")
    ! wanted 888-6-6 || spawn run quantize "$teacher" -o "$dq/888-6-6$v" --bits 8-8-8 "${c[@]}" "${aware[@]}" \
      "${same[@]}" >/dev/null
    ! wanted 228-6-6 || spawn run quantize "$teacher" -o "$dq/228-6-6$v" --bits 2-2-8 "${c[@]}" "${aware[@]}" \
      "${same[@]}" >/dev/null
    ! wanted 228-6-3 || spawn run quantize "$teacher" -o "$dq/228-6-3$v" --bits 2-2-8 --decoder-layers 3 "${c[@]}" \
      "${aware[@]}" "${fewer[@]}" >/dev/null
  done
  settle
fi

if [[ $stages == *eval* ]]; then
  # the paper's claims are comparisons between rows: distillation-aware against direct, fewer decoder layers
  # against all six (re-tests of two finished evaluations' predictions: nothing is generated)
  dq_eval "$dq" "$teacher" "$validation" models compared "${vlimit[@]}" "${gen[@]}"
fi

if [[ $stages == *table* ]]; then
  python "$here/tables.py" dqbart "$out"
fi
