#!/usr/bin/env bash
# bash recipes/eval-lead-baselines.sh [DATA] [RUNS]
#
# Two simple systems on an extreme-summarization set, scored by `modelshrink eval` and tested for
# significance against each other: the document's first sentence, and its first 8 words.
# DATA defaults to the Debian validation set beside the project; RUNS to ./runs.
set -euo pipefail
data=${1:-../shared/data/debian-descriptions/validation.jsonl.gz}
runs=${2:-runs}
mkdir -p "$runs"
python - "$data" "$runs" <<'PY'
import gzip, json, sys
from modelshrink.metrics.rouge import split_sentences

data, runs = sys.argv[1], sys.argv[2]
opener = gzip.open if data.endswith(".gz") else open
with opener(data, "rt", encoding="utf-8") as f, open(f"{runs}/lead-sentence.jsonl", "w") as s, \
        open(f"{runs}/lead-8-words.jsonl", "w") as w:
    for line in f:
        row = json.loads(line)
        sentences = split_sentences(row["document"]) or [""]
        s.write(json.dumps({"id": row["id"], "prediction": sentences[0]}) + "\n")
        w.write(json.dumps({"id": row["id"], "prediction": " ".join(row["document"].split()[:8])}) + "\n")
PY
modelshrink eval "$runs/lead-sentence.jsonl" --references "$data" -o "$runs/eval-lead-sentence" --overwrite
modelshrink eval "$runs/lead-8-words.jsonl" --references "$data" -o "$runs/eval-lead-8-words" \
    --against "$runs/eval-lead-sentence" --limited-length-recall --overwrite
modelshrink eval --compare "$runs/eval-lead-sentence" "$runs/eval-lead-8-words" -o "$runs/compare-lead" --overwrite
