#!/usr/bin/env bash
# bash recipes/dq-bart-translation.sh [DATA_DIR] [OUT_DIR]        (SCALE=small, the default, gpu or paper)
#
# DQ-BART Table 2 (DQ-mBART on WMT16 En-Ro, BLEU), small, on the Debian translations (PAIR=en-de, the default,
# or en-fr; ../shared/data/debian-translations, source/target pairs):
#   teacher  a Marian-shaped 6+6 transformer (d 256, 13 M parameters) with a joint byte-level BPE of 8,000 trained
#            on the pairs (recipes/translation_teacher.py: no pretrained multilingual model is installable here,
#            and MiniLM's uncased English vocabulary does not cover German or French), trained from scratch by
#            `distill --student`, the checkpoint best by BLEU on held-out validation rows kept
#   quant    8-8-8 and 2-2-8 direct, and 8-8-8 direct with the DQ-BART authors' activation clamp (--activation-clip
#            $CLIP, 2.5; CLIP=none leaves it out: their collapsed 8-8-8 row comes from it); distillation-aware 8-8-8 6-6 and 2-2-8 6-6, and with half the decoder
#            (decoder layers 0, 3, 5: the paper's 12-6 rows) 8-8-8 6-3 and 2-2-8 6-3, on the gold pairs
#   eval     every model on the first VALID_DOCS validation pairs (BLEU, chrF with 95% intervals), tested
#            against the float teacher; distillation-aware against direct, 6-3 against 6-6
#   table    python recipes/tables.py dqbart-mt OUT_DIR
#
#   SCALE=small  teacher TEACHER_STEPS=3000 steps of a 4,096-token budget (~6 epochs of en-de; measured 2.8 s a
#                step on 2 CPU cores: about 2.5 hours), lr 7e-4, 400 warmup; quantized models STEPS=600 (6-3:
#                1,200) at lr 1e-4; about a day on 2 CPU cores in all, so it continues over sessions
#   SCALE=gpu    the same teacher for TEACHER_STEPS=4000 steps of 16,384 tokens (about 30 epochs), validated every
#                TEACHER_EVERY=250 steps, stopped after 3 validations without a BLEU gain; quantized models 2,000
#                steps (6-3: 4,000) of 12,288 tokens, BLEU on 300 held-out rows every EVERY=200 steps, the best
#                kept, the same early stopping; validation and eval generate 64 documents a batch
#   SCALE=paper  the paper's schedule for the quantized models: 10 epochs (6-3: 20), batch 128, lr 3e-5
#   PATIENCE=N   (small) stops the teacher after N validations (every 500 steps) without a better BLEU:
#                TEACHER_STEPS=6000 PATIENCE=3 trains it until held-out BLEU stops rising (issue 55 measures its
#                10x form against a teacher that is done)
# Knobs: PAIR, CLIP, STEPS, TEACHER_STEPS, PATIENCE, TEACHER_EVERY, EVERY (gpu), VALID_DOCS (1000), STAGES, LAUNCH,
# JOBS/THREADS (recipes/lib/jobs.sh).
# Interrupted? Run it again: every step passes --resume.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${1:-../shared/data/debian-translations}
out=${2:-runs/repro-mt}
scale=${SCALE:-small}
pair=${PAIR:-en-de}
stages=${STAGES:-"teacher quant eval table"}
launch=${LAUNCH:-modelshrink}
teacher=$out/teacher
train=$data/$pair.train.jsonl.gz validation=$data/$pair.validation.jsonl.gz
valid=${VALID_DOCS:-1000}
dq=$out/dq-bart
dev=$dq/dev.jsonl  # the validation rows after the scored ones: checkpoints are chosen on these
select=(--validation "$dev" --metric bleu --num-beams 4 --max-length 128)
case $scale in
  small) tsteps=(--max-steps "${TEACHER_STEPS:-3000}" ${PATIENCE:+--early-stopping "$PATIENCE"}) ttokens=4096
         tevery=500 batch=()
         steps=${STEPS:-600} every=(--lr 1e-4 --warmup-ratio 0.05 --max-tokens 4096 --save-every 100)
         same=(--max-steps "$steps" "${every[@]}") fewer=(--max-steps $((2 * steps)) "${every[@]}") ;;
  gpu)   tsteps=(--max-steps "${TEACHER_STEPS:-4000}" --early-stopping 3) ttokens=16384
         tevery=${TEACHER_EVERY:-250} steps=${STEPS:-2000} batch=(--batch-size 64)
         every=(--lr 1e-4 --warmup-ratio 0.05 --max-tokens 12288 "${batch[@]}" "${select[@]}" --eval-limit 300
                --eval-every "${EVERY:-200}" --early-stopping 3 --save-every "${EVERY:-200}")
         same=(--max-steps "$steps" "${every[@]}") fewer=(--max-steps $((2 * steps)) "${every[@]}") ;;
  paper) tsteps=(--epochs 40 --early-stopping 5) ttokens=16384 tevery=2000 batch=(--batch-size 64)
         every=(--lr 3e-5 --warmup-ratio 0.05 --batch-size 128 "${select[@]}" --eval-every 500 --eval-limit 500
                --save-every 500)
         same=(--epochs 10 "${every[@]}") fewer=(--epochs 20 "${every[@]}") ;;
  *) echo "SCALE must be small, gpu or paper, not '$scale'" >&2; exit 2 ;;
esac
[[ -f $train ]] || { echo "no $train (the Debian translations; see ../shared/data/README.md)" >&2; exit 2; }
vlimit=(--limit "$valid")
mkdir -p "$dq"
[[ -s $dev ]] || python - "$validation" "$valid" "$dev" <<'EOF'
import gzip, sys
rows = gzip.open(sys.argv[1], "rt").read().splitlines()[int(sys.argv[2]):]
open(sys.argv[3], "w").write("".join(f"{row}\n" for row in rows))
EOF
gen=(--num-beams 4 --max-length 128 --max-source-length 128 "${batch[@]}")
# shellcheck disable=SC2086
run() { $launch "$@" --resume --quiet; }
source "$here/lib/jobs.sh"
source "$here/lib/dq_eval.sh"
[[ $jobs_max == 1 || $launch == modelshrink ]] || {
  echo "JOBS=$jobs_max runs one-process steps side by side on a CPU machine; with LAUNCH ($launch) keep JOBS=1" >&2; exit 2; }

if [[ $stages == *teacher* ]]; then
  [[ -f $out/teacher-init/config.json ]] || python "$here/translation_teacher.py" "$out/teacher-init" --data "$train"
  run distill "$train" --student "$out/teacher-init" -o "$teacher" "${tsteps[@]}" --lr 7e-4 --warmup-steps 400 \
    --max-tokens "$ttokens" "${batch[@]}" --max-source-length 128 --max-target-length 128 --validation "$dev" --eval-limit 300 \
    --eval-every "$tevery" --metric bleu --num-beams 4 --max-length 128 --save-every "$tevery" --seed 0 >/dev/null
fi

clip=${CLIP:-2.5}
models=(888-direct 228-direct 888-6-6 228-6-6 888-6-3 228-6-3)
[[ $clip == none ]] || models+=(888-direct-clip)
compared=(888-6-6:888-direct 228-6-6:228-direct 888-6-3:888-6-6 228-6-3:228-6-6)
if [[ $stages == *quant* ]]; then
  aware=(--data "$train" --max-source-length 128 --max-target-length 128 --seed 0)
  run quantize "$teacher" -o "$dq/888-direct" --bits 8-8-8 --method direct >/dev/null
  run quantize "$teacher" -o "$dq/228-direct" --bits 2-2-8 --method direct >/dev/null
  [[ $clip == none ]] ||
    run quantize "$teacher" -o "$dq/888-direct-clip" --bits 8-8-8 --method direct --activation-clip "$clip" >/dev/null
  spawn run quantize "$teacher" -o "$dq/888-6-6" --bits 8-8-8 "${aware[@]}" "${same[@]}" >/dev/null
  spawn run quantize "$teacher" -o "$dq/228-6-6" --bits 2-2-8 "${aware[@]}" "${same[@]}" >/dev/null
  spawn run quantize "$teacher" -o "$dq/888-6-3" --bits 8-8-8 --decoder-layers 3 "${aware[@]}" "${fewer[@]}" >/dev/null
  spawn run quantize "$teacher" -o "$dq/228-6-3" --bits 2-2-8 --decoder-layers 3 "${aware[@]}" "${fewer[@]}" >/dev/null
  settle
fi

if [[ $stages == *eval* ]]; then
  # the paper's claims are comparisons between rows: distillation-aware against direct, fewer decoder layers
  # against all six (re-tests of two finished evaluations' predictions: nothing is generated)
  dq_eval "$dq" "$teacher" "$validation" models compared "${vlimit[@]}" "${gen[@]}"
fi

if [[ $stages == *table* ]]; then
  python "$here/tables.py" dqbart-mt "$out"
fi
