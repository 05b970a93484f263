#!/usr/bin/env bash
# ACKD on rt-polarity (a small-scale ACKD Table 2 and Fig. 3):
#   bash recipes/ackd-rt-polarity.sh [DATA_DIR] [OUT_DIR]
# 1. fine-tunes the packaged MiniLM-L6 into the teacher (cross-entropy only);
# 2. trains 3-layer students copied from it (teacher layers 0, 3, 5), all with the same budget and
#    seed, by CE only, KD, KD + PT, full ACKD, ACKD without SAR and ACKD without the storage;
#    Students batch by a token budget (864 = 32 sentences of rt-polarity's mean 27 tokens): batches
#    of similar lengths, half the padded compute of random batches of 32.
# 3. prints their validation accuracy as a table (each run's validation.json).
# Knobs: TEACHER_EPOCHS (default 3), STUDENT_EPOCHS (3), SEED (0), STAGES ("teacher students table"),
# STUDENTS (which students, default all: "ce kd kd-pt ackd ackd-no-sar ackd-no-storage").
set -euo pipefail
data=${1:-../shared/data/rt-polarity}
out=${2:-runs/ackd-rt-polarity}
teacher_epochs=${TEACHER_EPOCHS:-3}
student_epochs=${STUDENT_EPOCHS:-3}
seed=${SEED:-0}
stages=${STAGES:-"teacher students table"}
students=${STUDENTS:-"ce kd kd-pt ackd ackd-no-sar ackd-no-storage"}
mkdir -p "$out"
common=(--seed "$seed" --lr 5e-5 --batch-size 32 --validation "$data/validation.jsonl"
        --eval-every 124 --overwrite)

if [[ $stages == *teacher* ]]; then
  minilm=$(python -c "import modelshrink.warmstart as w; print(w.packaged_minilm())")
  modelshrink contrastive "$data/train.jsonl" -o "$out/teacher" --student "$minilm" --epochs "$teacher_epochs" "${common[@]}"
fi

if [[ $stages == *students* ]]; then
  student() {  # name, then the loss flags
    local name=$1; shift
    [[ " $students " == *" $name "* ]] || return 0
    modelshrink contrastive "$data/train.jsonl" -o "$out/student-$name" --teacher "$out/teacher" --layers 3 \
      --alpha 0.5 --beta 20 --gamma 5e-3 --temperature 5 --epochs "$student_epochs" --max-tokens 864 \
      "${common[@]}" "$@"
  }
  student ce --alpha 1 --no-pt --no-acdl
  student kd --no-pt --no-acdl
  student kd-pt --no-acdl
  student ackd
  student ackd-no-sar --no-sar
  student ackd-no-storage --no-storage
fi

if [[ $stages == *table* ]]; then
  python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| model | layers | parameters | loss | validation accuracy | best step |")
print("|---|---|---|---|---|---|")
for name in ["teacher", "student-ce", "student-kd", "student-kd-pt", "student-ackd", "student-ackd-no-sar",
             "student-ackd-no-storage"]:
    manifest = out / name / "modelshrink.json"
    if not manifest.exists():
        continue
    m = json.loads(manifest.read_text())
    v = m["metrics"].get("validation", {})
    o = m["options"]
    terms = " + ".join(m["metrics"]["loss_terms"]) + ("" if o["sar"] or "acdl" not in m["metrics"]["loss_terms"]
                                                     else " (no SAR)") + (
        "" if o["storage"] or "acdl" not in m["metrics"]["loss_terms"] else " (no storage)")
    layers = json.loads((out / name / "config.json").read_text())["num_hidden_layers"]
    print(f"| {name} | {layers} | {m['metrics']['parameters']:,} | {terms} | {v.get('accuracy', float('nan')):.2f} "
          f"| {v.get('step', '-')} |")
PY
fi
