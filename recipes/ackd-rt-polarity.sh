#!/usr/bin/env bash
# bash recipes/ackd-rt-polarity.sh [DATA_DIR] [OUT_DIR]        (SCALE=small, the default, or SCALE=paper)
#
# ACKD Table 2 and Fig. 3, small: on rt-polarity (sentence sentiment, like SST-2)
# 1. fine-tunes the packaged MiniLM-L6 into the teacher (cross-entropy only);
# 2. for every seed in SEEDS, trains students of LAYERS layers, all with the same budget, by CE only,
#    KD, KD + PT, full ACKD and the paper's Fig. 3 ablations: ACKD without SAR, without the storage,
#    without KD (α·CE + β·PT + γ·A-CDL) and without PT. INIT=pretrained (the default; PKD's and ACKD's
#    students): MiniLM's first LAYERS pretrained layers under a fresh head
#    (OUT_DIR/pretrained/seed-S/student-NAME); INIT=teacher: the fine-tuned teacher's layers 0, 3, 5
#    with its head (OUT_DIR/seed-S/student-NAME, REPRODUCTION.md's first runs). PT and A-CDL compare
#    POOLING features (default mean: MiniLM's [CLS] is the same vector for every sentence at layers
#    1-5, which `contrastive` measures and warns about; POOLING=cls is the paper's reading). Students
#    batch by a token budget (864 = 32 sentences of rt-polarity's mean 27 tokens);
# 3. prints the table (mean ± standard deviation over seeds, paired permutation tests on per-sentence
#    correctness pooled over seeds) and draws OUT_DIR/ackd-fig3.png (recipes/tables.py ackd).
#
#   SCALE=small  teacher 3 epochs at lr 5e-5, batch 32; students 3 layers, 2 epochs, lr 5e-5; seeds
#                0-4. On 2 CPU cores: the teacher 30 minutes, then with JOBS=2 about 14 minutes a
#                student, two at a time (40 students: about 5 hours).
#   SCALE=paper  the paper's teacher recipe (lr 2e-5, batch 8, 3 epochs) and students of 3 and 6
#                layers, 4 epochs; seeds 0-4. Its per-task search (lr, batch, α, β, γ) is not run:
#                set the knobs below to the point you want.
# JOBS=N trains N students at once, each with THREADS (1) threads (recipes/lib/jobs.sh; REPRODUCTION.md ran
# JOBS=2 on 2 CPU cores). The default, 1, trains them one by one with the machine's threads.
# TASK=five: the harder task, rt-polarity's mean rating `score` in 5 classes (below -2, -2 to -1, -1 to 1,
#   1 to 2, 2 and above: 19, 26, 10, 24 and 22% of the training sentences; the middle class holds only
#   0.5 <= |score| < 1, the rest having been dropped), its own teacher and students under OUT_DIR/five.
# Knobs: SEEDS, LAYERS, INIT, POOLING, TASK, TEACHER_EPOCHS, STUDENT_EPOCHS, STAGES ("teacher students table"), STUDENTS
# (default all: "ce kd kd-pt ackd ackd-no-sar ackd-no-storage ackd-no-kd ackd-no-pt"), and the loss weights ALPHA (0.5),
# BETA (20), GAMMA (5e-3), TEMPERATURE (5), plus EXTRA (more contrastive options for every student).
# Follow-up students, run only when named in STUDENTS (REPRODUCTION.md, "why PT and A-CDL move nothing"):
#   kd-pt-mean, ackd-mean (--feature-pooling mean: PT and A-CDL on the token mean, not [CLS])
#   ackd-mean-tau01 (the same with --contrast-temperature 0.1 and γ 5e-2, the top of the paper's grid)
#   kd-first, ackd-first (--layer-selection first: teacher layers 0, 1, 2 instead of 0, 3, 5)
# python recipes/ackd_terms.py OUT_DIR/teacher measures each term's pull on the student beforehand.
# A second setting can reuse a teacher:
#   mkdir -p runs/b60 && ln -s ../repro/ackd/teacher runs/b60/teacher
#   BETA=60 GAMMA=5e-2 STAGES="students table" bash recipes/ackd-rt-polarity.sh ../shared/data/rt-polarity runs/b60
# Interrupted? Run it again: every step passes --resume.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${1:-../shared/data/rt-polarity}
out=${2:-runs/repro/ackd}
scale=${SCALE:-small}
case $scale in
  small) seeds=${SEEDS:-"0 1 2 3 4"} layers=${LAYERS:-3} teacher_epochs=${TEACHER_EPOCHS:-3}
         student_epochs=${STUDENT_EPOCHS:-2} teacher_lr=5e-5 teacher_batch=32 ;;
  paper) seeds=${SEEDS:-"0 1 2 3 4"} layers=${LAYERS:-"3 6"} teacher_epochs=${TEACHER_EPOCHS:-3}
         student_epochs=${STUDENT_EPOCHS:-4} teacher_lr=2e-5 teacher_batch=8 ;;
  *) echo "SCALE must be small or paper, not '$scale'" >&2; exit 2 ;;
esac
stages=${STAGES:-"teacher students table"}
init=${INIT:-pretrained} pooling=${POOLING:-mean} task=${TASK:-binary}
case $init in pretrained|teacher) ;; *) echo "INIT must be pretrained or teacher, not '$init'" >&2; exit 2 ;; esac
case $task in binary|five) ;; *) echo "TASK must be binary or five, not '$task'" >&2; exit 2 ;; esac
students=${STUDENTS:-"ce kd kd-pt ackd ackd-no-sar ackd-no-storage ackd-no-kd ackd-no-pt"}
alpha=${ALPHA:-0.5} beta=${BETA:-20} gamma=${GAMMA:-5e-3} temperature=${TEMPERATURE:-5}
read -r -a extra <<< "${EXTRA:-}"
[[ -f $data/train.jsonl ]] || { echo "no $data/train.jsonl (see ../shared/data/README.md)" >&2; exit 2; }
if [[ $task == five ]]; then  # the same sentences, labelled by their mean rating in five bins
  out=$out/five
  mkdir -p "$out/data"
  for split in train validation; do
    [[ -s $out/data/$split.jsonl ]] || python - "$data/$split.jsonl" "$out/data/$split.jsonl" <<'EOF'
import bisect, json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for row in rows:
        f.write(json.dumps({**row, "label": bisect.bisect_right([-2.0, -1.0, 1.0, 2.0], row["score"])}) + "\n")
EOF
  done
  data=$out/data
fi
mkdir -p "$out"
source "$here/lib/jobs.sh"
minilm=
if [[ $stages == *teacher* || ($stages == *students* && $init == pretrained) ]]; then
  minilm=$(python -c "import modelshrink.models.warmstart as w; print(w.packaged_minilm())")
fi
start=(); [[ $init == teacher ]] || start=(--student "$minilm" --layer-selection first)
students_dir=$out; [[ $init == teacher ]] || students_dir=$out/pretrained
common=(--lr 5e-5 --validation "$data/validation.jsonl" --eval-every 124 --resume --quiet)

if [[ $stages == *teacher* ]]; then
  modelshrink contrastive "$data/train.jsonl" -o "$out/teacher" --student "$minilm" --epochs "$teacher_epochs" \
    --seed 0 --batch-size "$teacher_batch" "${common[@]}" --lr "$teacher_lr" >/dev/null
fi

if [[ $stages == *students* ]]; then
  student() {  # seed, layers, name, then the loss flags
    local seed=$1 n=$2 name=$3; shift 3
    [[ " $students " == *" $name "* ]] || return 0
    local dir=$students_dir/seed-$seed; [[ $n == 3 ]] || dir=$students_dir/layers-$n/seed-$seed
    mkdir -p "$dir"
    local cmd=(modelshrink contrastive "$data/train.jsonl" -o "$dir/student-$name" --teacher "$out/teacher"
      --layers "$n" "${start[@]}" --feature-pooling "$pooling" --alpha "$alpha" --beta "$beta" --gamma "$gamma"
      --temperature "$temperature"
      --epochs "$student_epochs" --max-tokens 864 --seed "$seed" "${common[@]}" "${extra[@]}" "$@")
    spawn "${cmd[@]}" >/dev/null
  }
  for n in $layers; do
    for seed in $seeds; do
      student "$seed" "$n" ce --alpha 1 --no-pt --no-acdl
      student "$seed" "$n" kd --no-pt --no-acdl
      student "$seed" "$n" kd-pt --no-acdl
      student "$seed" "$n" ackd
      student "$seed" "$n" ackd-no-sar --no-sar
      student "$seed" "$n" ackd-no-storage --no-storage
      student "$seed" "$n" ackd-no-kd --no-kd
      student "$seed" "$n" ackd-no-pt --no-pt
      student "$seed" "$n" kd-pt-mean --no-acdl --feature-pooling mean
      student "$seed" "$n" ackd-mean --feature-pooling mean
      student "$seed" "$n" ackd-mean-tau01 --feature-pooling mean --contrast-temperature 0.1 --gamma 5e-2
      student "$seed" "$n" kd-first --no-pt --no-acdl --layer-selection first
      student "$seed" "$n" ackd-first --layer-selection first
    done
  done
  settle
fi

if [[ $stages == *table* ]]; then
  for n in $layers; do
    dir=$students_dir; [[ $n == 3 ]] || dir=$students_dir/layers-$n
    python "$here/tables.py" ackd "$dir" --data "$data" --teacher "$out/teacher"
  done
fi
