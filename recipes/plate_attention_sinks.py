"""python recipes/plate_attention_sinks.py [TEACHER] [DATA] [DOCS] [MAX_SOURCE_LENGTH]

PLATE Fig. 2 follow-up: how much of a BERT-style teacher's evident cross attention (> 0.15) lands on
the special tokens [CLS] and [SEP] (attention sinks at the first and last positions), and the
evident-weight shares by fifth of the document over the content tokens alone, at λ = 1 and λ = 2.
Defaults: runs/repro/teacher, the Debian training set, its first 100 documents (beam 4), sources cut at 128
tokens. The long documents (recipes/plate-debian.sh LONG=1):
    python recipes/plate_attention_sinks.py runs/repro/teacher runs/repro/plate-long/train.jsonl 100 256
"""
import gzip
import json
import sys

import numpy as np

from modelshrink.models.loading import load_seq2seq
from modelshrink.generation.plate import attention_temperature, lambdas_by_kind
from modelshrink.generation.attention_stats import cross_attention
from modelshrink.generation.settings import resolve_generation, generate_ids
teacher = sys.argv[1] if len(sys.argv) > 1 else "runs/repro/teacher"
data = sys.argv[2] if len(sys.argv) > 2 else "../shared/data/debian-descriptions/train.jsonl.gz"
n_docs = int(sys.argv[3]) if len(sys.argv) > 3 else 100
max_source_length = int(sys.argv[4]) if len(sys.argv) > 4 else 128
model, tok, fam = load_seq2seq(teacher, "teacher", False, "cpu")
docs = [json.loads(line)["document"] for _, line in zip(range(n_docs), (gzip.open if data.endswith(".gz") else open)(data, "rt"))]
settings = resolve_generation(model.generation_config, num_beams=4, max_length=32, no_repeat_ngram_size=3)
special = {tok.cls_token_id, tok.sep_token_id}
for lam in (1.0, 2.0):
    ev_sp = ev_all = n_all = 0
    bins = np.zeros(5)
    with attention_temperature(fam.attention_modules(model), lambdas_by_kind(lam)):
        for i in range(0, n_docs, 20):
            enc = tok(docs[i:i+20], truncation=True, max_length=max_source_length, padding=True, return_tensors="pt")
            ids = generate_ids(model, enc["input_ids"], enc["attention_mask"], settings)
            for b, w in enumerate(cross_attention(model, enc["input_ids"], enc["attention_mask"], ids)):
                src = enc["input_ids"][b][enc["attention_mask"][b].bool()].tolist()
                sp = np.array([t in special for t in src])
                e = w > 0.15
                ev_all += e.sum()
                ev_sp += e[..., sp].sum()
                n_all += w.size
                pos = (np.arange(len(src)) + 1) / len(src)
                bin_of = np.minimum(np.ceil(pos * 5) - 1, 4).astype(int)
                per = e[..., ~sp].reshape(-1, len(src) - sp.sum()).sum(0)
                if per.sum():
                    bins += np.bincount(bin_of[~sp], weights=per, minlength=5) / per.sum()
    print(f"lambda {lam}: evident {100*ev_all/n_all:.2f}% of weights; on [CLS]/[SEP] {100*ev_sp/max(ev_all,1):.1f}% of evident; "
          f"content-token evident share by fifth {np.round(100*bins/bins.sum(),1).tolist()}")
