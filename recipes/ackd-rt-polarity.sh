#!/usr/bin/env bash
# ACKD on rt-polarity (a small-scale ACKD Table 2 and Fig. 3):
#   bash recipes/ackd-rt-polarity.sh [DATA_DIR] [OUT_DIR]
# 1. fine-tunes the packaged MiniLM-L6 into the teacher (cross-entropy only);
# 2. trains 3-layer students copied from it (teacher layers 0, 3, 5), all with the same budget and
#    seed, by CE only, KD, KD + PT, full ACKD, ACKD without SAR and ACKD without the storage;
#    Students batch by a token budget (864 = 32 sentences of rt-polarity's mean 27 tokens): batches
#    of similar lengths, half the padded compute of random batches of 32.
# 3. prints their validation accuracy as a table (each run's validation.json) and, with matplotlib,
#    draws it as OUT_DIR/ackd-ablation.png (the paper's Fig. 3).
# Knobs: TEACHER_EPOCHS (default 3), STUDENT_EPOCHS (3), SEED (0), STAGES ("teacher students table"),
# STUDENTS (which students, default all: "ce kd kd-pt ackd ackd-no-sar ackd-no-storage"), and the loss
# weights ALPHA (0.5), BETA (20), GAMMA (5e-3), TEMPERATURE (5). A second setting can reuse a teacher:
#   mkdir -p runs/b60 && ln -s ../ackd-rt-polarity/teacher runs/b60/teacher
#   BETA=60 GAMMA=5e-2 STAGES="students table" bash recipes/ackd-rt-polarity.sh ../shared/data/rt-polarity runs/b60
set -euo pipefail
data=${1:-../shared/data/rt-polarity}
out=${2:-runs/ackd-rt-polarity}
teacher_epochs=${TEACHER_EPOCHS:-3}
student_epochs=${STUDENT_EPOCHS:-3}
seed=${SEED:-0}
stages=${STAGES:-"teacher students table"}
students=${STUDENTS:-"ce kd kd-pt ackd ackd-no-sar ackd-no-storage"}
alpha=${ALPHA:-0.5} beta=${BETA:-20} gamma=${GAMMA:-5e-3} temperature=${TEMPERATURE:-5}
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
      --alpha "$alpha" --beta "$beta" --gamma "$gamma" --temperature "$temperature" --epochs "$student_epochs" --max-tokens 864 \
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
  python - "$out" "$data/validation.jsonl" <<'PY'
import json, sys
from pathlib import Path

from modelshrink import classify
from modelshrink.metrics.stats import paired_test
from modelshrink.models import load_classifier

out, validation = Path(sys.argv[1]), sys.argv[2]
rows, names, correct = [], [], {}
gold = [r["label"] for r in classify.read_labeled(validation)]
print("| model | layers | parameters | loss | validation accuracy | p vs CE | p vs KD | best step |")
print("|---|---|---|---|---|---|---|---|")
for name in ["teacher", "student-ce", "student-kd", "student-kd-pt", "student-ackd", "student-ackd-no-sar",
             "student-ackd-no-storage"]:
    folder = out / name
    if not (folder / "modelshrink.json").exists():
        continue
    m = json.loads((folder / "modelshrink.json").read_text())
    v, o = m["metrics"].get("validation", {}), m["options"]
    used = [t for t in m["metrics"]["loss_terms"] if t != "kd" or o["alpha"] < 1]
    terms = " + ".join(used)
    if "acdl" in used:
        terms += "".join(s for s, on in ((" (no SAR)", o["sar"]), (" (no storage)", o["storage"])) if not on)
    model, tokenizer = load_classifier(str(folder))
    predicted = classify.predict(model, tokenizer, classify.read_labeled(validation), 64, "cpu", 128)
    correct[name] = [float(p == g) for p, g in zip(predicted, gold)]
    p = {ref: (f"{paired_test(correct[name], correct[ref]):.3f}" if ref in correct and ref != name else "–")
         for ref in ("student-ce", "student-kd")}
    print(f"| {name} | {model.config.num_hidden_layers} | {m['metrics']['parameters']:,} | {terms} | "
          f"{100 * sum(correct[name]) / len(gold):.2f} | {p['student-ce']} | {p['student-kd']} | {v.get('step', '-')} |")
    rows.append((name.removeprefix("student-"), 100 * sum(correct[name]) / len(gold)))
print("\np: paired permutation test (10,000 resamples) on per-sentence correctness.")
try:  # ACKD's Fig. 3, when matplotlib is there (pip install 'modelshrink[plot]')
    from modelshrink.figures import accuracy_bars
    teacher = dict(rows).pop("teacher", None)
    students = [r for r in rows if r[0] != "teacher"]
    if students:
        print(accuracy_bars(students, out / "ackd-ablation.png", "3-layer students on rt-polarity", teacher))
except Exception as e:  # the table is the result; the figure is a convenience
    print(f"(no figure: {e})")
PY
fi
