#!/usr/bin/env bash
# bash recipes/plate-debian.sh [DATA_DIR] [OUT_DIR]        (SCALE=small, the default, or SCALE=paper)
#
# PLATE (Zhang et al.) on the Debian descriptions, as REPRODUCTION.md reports it:
#   teacher   recipes/teacher-debian.sh (skipped when OUT_DIR/teacher is complete)
#   labels    the teacher labels the same DOCS training documents at λ = 1 (regular), 1.5, 2 and
#             λ ~ U[1, 2] per document, recording its evident cross attention at that λ (Fig. 2) and
#             one document's heatmap (Fig. 1); each set is then scored for style (Table 6: length,
#             novel n-grams, copy and leading bias) against the gold synopses
#   students  6-2 students (encoder copied, decoder layers 0 and 5) trained with identical budgets on
#             gold, regular, λ = 1.5, λ = 2 and random-λ labels of those documents (Table 2)
#   eval      each student on VALID_DOCS validation documents: ROUGE with 95% intervals, style, attention,
#             and the paired permutation test against the Regular student (the paper's *); the teacher too
#   baselines (not in STAGES by default) Table 5: output temperature T = 0.5, sampling, nucleus 0.9
#   modules   (not in STAGES by default) Table 4: λ = 2 on one kind of attention only, decoder cross
#             attention (cross2), decoder self attention (dec2) or encoder self attention (enc2), the others at 1
#   table     the tables as markdown on stdout, and OUT_DIR/plate-fig2.png
#
#   SCALE=small  DOCS=4000 documents, students 400 steps of a 3,072-token budget (about 31 documents
#                a step, so ~3.1 epochs of the 4,000), VALID_DOCS=1000; about five hours on 2 CPU
#                cores after the teacher (JOBS=2), so it continues over sessions (see "Interrupted?").
#   SCALE=paper  every training document, students 6 epochs at lr 5e-5 (PLATE: 15,000 steps of ~80
#                documents on XSum, about 6 epochs), the whole validation set. For GPUs: set
#                LAUNCH="accelerate launch -m modelshrink" (README, "Scaling out").
# LONG=1: the same on the long documents only (>= 120 words: 3,441 training and 135 validation documents,
#   all of them), sources cut at 256 tokens instead of 128, under OUT_DIR/plate-long.
#   Fig. 1 plots its first training document (PLOT_DOC=ID names another; msmtp-mta otherwise).
# LRS="3e-4 5e-5": students (and their evaluations) at each learning rate (a rate other than the SCALE's own,
#   3e-4 small, 5e-5 paper, gets -lrX in its names, whatever LRS's order: LRS=5e-5 alone at SCALE=small makes
#   only the -lr5e-5 rows; PLATE tunes its students' in 1e-5..7e-5); SEEDS="0 1": each student
#   at each seed (-seedS in the name for S != 0), each tested against the Regular student of its own lr and seed.
# NAMES="gold regular random": only these label sets, students and evaluations of the STAGES run (names: gold,
#   regular, lambda1.5, lambda2, random, T0.5, sampling, nucleus, cross2, dec2, enc2, teacher), e.g. a second seed
#   of the rows whose difference from Regular is inside one interval; the Regular evaluation each is tested
#   against is still made first (kept, with --resume, when it exists).
# Knobs: DOCS, STUDENT_STEPS, VALID_DOCS, LONG, PLOT_DOC, LRS, SEEDS, NAMES, STAGES, LAUNCH, TEACHER (another seq2seq teacher folder), and
# JOBS=N: the label sets, the students and the evaluations run N at a time, THREADS (1) threads each
# (recipes/lib/jobs.sh; REPRODUCTION.md ran JOBS=2 on 2 CPU cores).
# Interrupted? Run it again: every step passes --resume (finished artifacts are kept as they are, label sets
# and evaluations continue from their last batch, students from their last checkpoint).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${1:-../shared/data/debian-descriptions}
out=${2:-runs/repro}
scale=${SCALE:-small}
stages=${STAGES:-"teacher labels students eval table"}
launch=${LAUNCH:-modelshrink}
teacher=${TEACHER:-$out/teacher}
long=${LONG:-0} seeds=${SEEDS:-0} names=${NAMES:-}
known=" gold regular lambda1.5 lambda2 random T0.5 sampling nucleus cross2 dec2 enc2 teacher "
for name in $names; do
  [[ $known == *" $name "* ]] || { echo "NAMES: unknown name '$name' (known:$known)" >&2; exit 2; }
done
wanted() { [[ -z $names || " $names " == *" $1 "* ]]; }  # is $1 among NAMES (or NAMES unset)?
case $scale in
  small) docs=${DOCS:-4000} valid=${VALID_DOCS:-1000} own_lr=3e-4
         budget=(--max-steps "${STUDENT_STEPS:-400}" --warmup-steps 40 --max-tokens 3072 --save-every 100) ;;
  paper) docs=${DOCS:-all} valid=${VALID_DOCS:-all} own_lr=5e-5
         budget=(--epochs 6 --warmup-steps 500 --max-tokens 8192 --save-every 2000) ;;
  *) echo "SCALE must be small or paper, not '$scale'" >&2; exit 2 ;;
esac
lrs=${LRS:-$own_lr}
limit=(); [[ $docs == all ]] || limit=(--limit "$docs")
vlimit=(); [[ $valid == all ]] || vlimit=(--limit "$valid")
train=$data/train.jsonl.gz validation=$data/validation.jsonl.gz
[[ -f $train ]] || { echo "no $train (the Debian descriptions; see ../shared/data/README.md)" >&2; exit 2; }
plate=$out/plate source_length=128
if [[ $long == 1 ]]; then  # every document of at least 120 words, for labels, students and evaluation alike
  plate=$out/plate-long source_length=256 limit=() vlimit=()
  mkdir -p "$plate"
  for split in train validation; do
    [[ -s $plate/$split.jsonl ]] || python - "$data/$split.jsonl.gz" "$plate/$split.jsonl" <<'EOF'
import gzip, json, sys
with gzip.open(sys.argv[1], "rt") as f, open(sys.argv[2], "w") as out:
    out.writelines(line for line in f if len(json.loads(line)["document"].split()) >= 120)
EOF
  done
  train=$plate/train.jsonl validation=$plate/validation.jsonl
fi
# Fig. 1's document: msmtp-mta is not among the long documents, which plot their first one instead
plot_doc=${PLOT_DOC:-msmtp-mta}
[[ $long == 1 && -z ${PLOT_DOC:-} ]] &&
  plot_doc=$(python -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["id"])' "$train")
mkdir -p "$plate"
gen=(--num-beams 4 --max-length 32 --no-repeat-ngram-size 3 --max-source-length "$source_length")
read -r -a lr_list <<< "$lrs"
read -r -a seed_list <<< "$seeds"
variant() {  # the name suffix of learning rate $1 and seed $2: none for the SCALE's own rate and seed 0
  local suffix=
  [[ $1 == "$own_lr" ]] || suffix+=-lr$1
  [[ $2 == 0 ]] || suffix+=-seed$2
  echo "$suffix"
}
# shellcheck disable=SC2086
run() { $launch "$@" --resume --quiet; }
source "$here/lib/jobs.sh"
[[ $jobs_max == 1 || $launch == modelshrink ]] || {
  echo "JOBS=$jobs_max runs one-process steps side by side on a CPU machine; with LAUNCH ($launch) keep JOBS=1" >&2; exit 2; }

if [[ $stages == *teacher* && $teacher == "$out/teacher" ]]; then
  SCALE=$scale bash "$here/teacher-debian.sh" "$data" "$out/teacher"
fi

# name, then the pseudolabel options that make it
labels() {
  local name=$1; shift
  wanted "$name" || return 0
  run pseudolabel "$teacher" "$train" -o "$plate/labels-$name" "${limit[@]}" "${gen[@]}" --max-tokens 4096 \
    --attention-stats --attention-plot "$plot_doc" "$@" >/dev/null
  # scored again only when the label set is newer than its score (a rerun keeps both)
  [[ $plate/labels-$name-style/modelshrink.json -nt $plate/labels-$name/modelshrink.json ]] ||
    modelshrink eval "$plate/labels-$name" -o "$plate/labels-$name-style" --resamples 100 --overwrite --quiet >/dev/null
}
if [[ $stages == *labels* ]]; then
  spawn labels regular --lambda 1.0
  spawn labels lambda1.5 --lambda 1.5
  spawn labels lambda2 --lambda 2.0
  spawn labels random --lambda-range 1 2 --seed 0
fi
if [[ $stages == *baselines* ]]; then
  spawn labels T0.5 --output-temperature 0.5
  spawn labels sampling --do-sample --num-beams 1 --seed 0
  spawn labels nucleus --do-sample --top-p 0.9 --num-beams 1 --seed 0
fi
if [[ $stages == *modules* ]]; then
  spawn labels cross2 --lambda-cross 2.0
  spawn labels dec2 --lambda-dec 2.0
  spawn labels enc2 --lambda-enc 2.0
fi
settle

students=(gold regular lambda1.5 lambda2 random)
[[ $stages == *baselines* ]] && students+=(T0.5 sampling nucleus)
[[ $stages == *modules* ]] && students+=(cross2 dec2 enc2)
if [[ $stages == *students* ]]; then
  for lr in "${lr_list[@]}"; do for seed in "${seed_list[@]}"; do
    for name in "${students[@]}"; do
      wanted "$name" || continue
      if [[ $name == gold ]]; then source=("$train" "${limit[@]}"); else source=("$plate/labels-$name"); fi
      spawn run distill "${source[@]}" -o "$plate/student-$name$(variant "$lr" "$seed")" --teacher "$teacher" \
        --decoder-layers 2 "${budget[@]}" --lr "$lr" --max-source-length "$source_length" --max-target-length 32 \
        --seed "$seed" >/dev/null
    done
  done; done
  settle
fi

if [[ $stages == *eval* ]]; then
  evaluate() {  # name, then more eval options: student-NAME (the teacher for NAME=teacher) into eval-NAME
    local name=$1 model=$plate/student-$1; shift
    [[ $name == teacher ]] && model=$teacher
    run eval "$model" "$validation" -o "$plate/eval-$name" "${vlimit[@]}" "${gen[@]}" \
      --attention-stats --latency-docs 0 "$@" >/dev/null
  }
  for lr in "${lr_list[@]}"; do for seed in "${seed_list[@]}"; do
    v=$(variant "$lr" "$seed")
    evaluate "regular$v"   # first, on all threads: the others of its rate and seed are tested against it
    for name in "${students[@]}"; do
      [[ $name == regular ]] || ! wanted "$name" || spawn evaluate "$name$v" --against "$plate/eval-regular$v"
    done
    # the teacher on the same documents, for scale (Table 2's last row): once, against the seed-0 Regular student
    [[ -n $v ]] || ! wanted teacher || spawn evaluate teacher --against "$plate/eval-regular"
    settle
  done; done
fi

if [[ $stages == *table* ]]; then
  python "$here/tables.py" plate "$out" $([[ $long == 1 ]] && echo --long)
fi
