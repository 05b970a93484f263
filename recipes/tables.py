"""python recipes/tables.py {teacher,plate,dqbart,dqbart-mt,ackd} RUNS [--figures DIR]

The tables and figures of REPRODUCTION.md, read from the artifacts the recipes wrote under RUNS
(default runs/repro): markdown on stdout, PNGs into --figures (default RUNS). Nothing here trains or
generates; every number comes from an artifact's metrics.json or modelshrink.json, except `ackd`'s: it runs
each classifier still on disk over the validation sentences (CPU minutes) for the paired tests, and with
--record keeps those predictions, so that a table outlives the weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _rouge(m: dict, key: str) -> str:
    low, high = m["ci95"][key]
    return f"{m[key]:.2f} [{low:.2f}, {high:.2f}]"


def _p_text(p: float, star: bool = True) -> str:
    """A p-value as the tables write it, starred below 0.05."""
    return ("< 0.001" if p < 0.001 else f"{p:.3f}") + ("*" if star and p < 0.05 else "")


def _p(m: dict, key: str) -> str:
    if "against" not in m:
        return "–"
    return _p_text(m["against"]["p"][key])


def _delta_p(m: dict, key: str) -> str:
    """The signed difference from the model tested against, with its p: a star alone would not say
    whether a significant difference is a gain or a loss."""
    if "against" not in m:
        return "–"
    return f"{m['against']['delta'][key]:+.2f} ({_p(m, key)})"


def teacher(runs: Path, figures: Path) -> None:
    folder = runs / "teacher"
    m = _json(runs / "teacher-eval" / "metrics.json")
    if m is None:
        sys.exit(f"no {runs / 'teacher-eval'}: run recipes/teacher-debian.sh first")
    print("| system | ROUGE-1 | ROUGE-2 | ROUGE-L | words | p vs first sentence (R-1, R-2, R-L) |")
    print("|---|---|---|---|---|---|")
    systems = [(_json(runs / "lead" / f"eval-lead-{key}" / "metrics.json"), name)
               for key, name in (("sentence", "first sentence of the document"), ("8-words", "first 8 words"))]
    for row, name in [*systems, (m, "teacher (bert2bert 6-6)")]:
        if row is not None:
            ps = ", ".join(_p(row, k) for k in ("rouge1", "rouge2", "rougeL")) if "against" in row else ""
            print(f"| {name} | {_rouge(row, 'rouge1')} | {_rouge(row, 'rouge2')} | {_rouge(row, 'rougeL')} | "
                  f"{row['length_words']:.1f} | {ps} |")
    print(f"\n{m['documents'] if 'documents' in m else ''} validation documents; "
          f"p: paired permutation test, 10,000 resamples; * p < 0.05.\n")
    gold = m.get("reference_style")
    if gold and "novel_ngrams" in m:
        print(f"Style (references in brackets): {m['length_words']:.1f} words ({gold['length_words']:.1f}), "
              f"{m['novel_ngrams']['1']:.1f}% novel unigrams ({gold['novel_ngrams']['1']:.1f}%), "
              f"{m['copy_bias']:.1f}% of 4-grams copied ({gold['copy_bias']:.1f}%), "
              f"{m['leading_bias']:.1f}% leading bias ({gold['leading_bias']:.1f}%).\n")
    print("Validation curve (first 200 validation documents, beam 4, during training):\n")
    print("| step | epoch | train loss (one batch) | ROUGE-1 | ROUGE-2 | ROUGE-L |")
    print("|---|---|---|---|---|---|")
    log = [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines()]
    last = {}
    for row in log:
        if row.get("event") == "validation":
            print(f"| {row['step']} | {last.get('epoch', 0):.2f} | {last.get('loss', float('nan')):.3f} | "
                  f"{row['rouge1']:.2f} | {row['rouge2']:.2f} | {row['rougeL']:.2f} |")
        elif "loss" in row:
            last = row


PLATE_LABELS = [("regular", "λ = 1 (regular)"), ("lambda1.5", "λ = 1.5"), ("lambda2", "λ = 2"),
                ("random", "λ ~ U[1, 2]"), ("T0.5", "output T = 0.5"), ("sampling", "sampling"),
                ("nucleus", "nucleus p = 0.9"), ("cross2", "λ = 2 on cross attention only"),
                ("dec2", "λ = 2 on decoder self attention only"), ("enc2", "λ = 2 on encoder self attention only")]


def _bins(attention: dict | None) -> str:
    """Evident cross attention by fifth of the document (`--attention-stats`), or a dash where none was recorded."""
    return " / ".join(f"{x:.0f}" for x in attention["evident_share_by_bin"]) if attention else "–"


def _style_row(name: str, m: dict, attention: dict | None) -> str:
    novel = " | ".join(f"{m['novel_ngrams'][k]:.1f}" for k in ("1", "2", "3", "4"))
    return (f"| {name} | {m['length_words']:.2f} | {novel} | {m['copy_bias']:.1f} | {m['leading_bias']:.1f} | "
            f"{m['rouge1']:.2f} | {_bins(attention)} |")


def _student_row(name: str, m: dict) -> str:
    """A Table 2 row: ROUGE with intervals, the paired test against Regular, the summaries' style and where the
    model's evident cross attention fell (by fifth of the document; `eval --attention-stats`)."""
    ps = " | ".join(_delta_p(m, k) for k in ("rouge1", "rouge2", "rougeL"))
    return (f"| {name} | {_rouge(m, 'rouge1')} | {_rouge(m, 'rouge2')} | {_rouge(m, 'rougeL')} | {ps} | "
            f"{m['length_words']:.2f} | {m['novel_ngrams']['1']:.1f} | {m['copy_bias']:.1f} | "
            f"{m['leading_bias']:.1f} | {_bins(m.get('attention'))} |")


def _documents(path: Path) -> str:
    words = [len(json.loads(line)["document"].split()) for line in path.read_text().splitlines() if line.strip()]
    return f"{len(words):,} {path.stem} documents of {sum(words) / max(len(words), 1):.0f} words on average"


def plate(runs: Path, figures: Path, long: bool = False) -> None:
    folder = runs / ("plate-long" if long else "plate")
    splits = [folder / f"{split}.jsonl" for split in ("train", "validation")]
    if long and all(path.is_file() for path in splits):  # the recipe's LONG=1 copies of the long documents
        print("Long documents: " + ", ".join(_documents(path) for path in splits) + "\n")
    print("Table 6 (pseudo labels of the same training documents): words, novel n-grams (%), copy bias "
          "(% of 4-grams copied), leading bias (% of sentences from the first 40%), ROUGE-1 against the gold "
          "synopsis, evident cross attention (> 0.15) by fifth of the document (%)\n")
    print("| labels | words | novel 1-g | 2-g | 3-g | 4-g | copy | leading | R-1 vs gold | attention by fifth |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    gold, bars = None, []
    for key, name in PLATE_LABELS:
        m = _json(folder / f"labels-{key}-style" / "metrics.json")
        if m is None:
            continue
        manifest = _json(folder / f"labels-{key}" / "modelshrink.json")
        attention = manifest["metrics"].get("attention")
        gold = gold or m["reference_style"]
        print(_style_row(name, m, attention))
        if attention:
            bars.append((name, attention["evident_share_by_bin"], attention["bins"],
                         attention["evident_share_of_all_weights"], attention.get("evident_share_of_attention_mass")))
    if gold:
        novel = " | ".join(f"{gold['novel_ngrams'][k]:.1f}" for k in ("1", "2", "3", "4"))
        print(f"| gold synopses | {gold['length_words']:.2f} | {novel} | {gold['copy_bias']:.1f} | "
              f"{gold['leading_bias']:.1f} | 100 | – |")
    if bars:
        print("\nEvident weights as a share of all cross-attention weights, by count: " +
              ", ".join(f"{name} {share:.2f}%" for name, _, _, share, _ in bars))
        if all(mass is not None for *_, mass in bars):
            print("\nand by attention mass (the part of each row's sum of 1 that they carry): " +
                  ", ".join(f"{name} {mass:.1f}%" for name, *_, mass in bars))
        try:
            from modelshrink.figures import position_bars

            name = "plate-long-fig2.png" if long else "plate-fig2.png"
            path = position_bars([(n, s) for n, s, *_ in bars], bars[0][2], figures / name,
                                 "Evident cross attention of the teacher while labelling, by position")
            print(f"\n![PLATE Fig. 2]({path})")
        except Exception as e:  # the table is the result; the figure is a convenience
            print(f"(no figure: {e})")

    print("\nTable 2 (6-2 students, identical budgets; validation documents; 95% bootstrap intervals; p: paired "
          "permutation test against the Regular student, * p < 0.05; Δ: ROUGE minus the Regular student's)\n")
    print("| student trained on | ROUGE-1 | ROUGE-2 | ROUGE-L | Δ R-1 (p) | Δ R-2 (p) | Δ R-L (p) | words | "
          "novel 1-g | copy | leading | attention by fifth |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    # the recipe's LRS and SEEDS variants (-lrX, -seedS) after the seed-0 students at the scale's own rate
    variants = sorted({p.name.split("regular", 1)[1] for p in folder.glob("eval-regular*")} or {""},
                      key=lambda v: (len(v), v))
    for variant in variants:
        for key, name in [("gold", "gold synopses")] + PLATE_LABELS:
            m = _json(folder / f"eval-{key}{variant}" / "metrics.json")
            if m is not None:
                print(_student_row(name + _variant_label(variant), m))
    # the teacher on the same validation documents (`eval TEACHER ... -o eval-teacher --against eval-regular`)
    m = _json(folder / "eval-teacher" / "metrics.json")
    if m is not None:
        print(_student_row("*the teacher (6-6), for scale*", m))
    _pooled_seeds(folder, variants)


def _variant_label(variant: str) -> str:
    """" (lr 5e-5, seed 1)" for the recipe's "-lr5e-5-seed1" name suffix ("" for none); a learning rate's own
    hyphen ("5e-5") is kept."""
    import re

    if not variant:
        return ""
    found = re.fullmatch(r"(?:-lr(.+?))?(?:-seed(\d+))?", variant)
    if found is None:
        return f" ({variant.lstrip('-')})"
    parts = ([f"lr {found[1]}"] if found[1] else []) + ([f"seed {found[2]}"] if found[2] else [])
    return f" ({', '.join(parts)})"


def _document_scores(folder: Path) -> dict[str, list[float]] | None:
    """Per-document ROUGE F1 of an evaluation (its predictions.jsonl), by metric, in document order."""
    path = folder / "predictions.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {"id": [r.get("id") for r in rows], **{k: [r["scores"][k] for r in rows] for k in ("rouge1", "rouge2", "rougeL")}}


def _pooled_seeds(folder: Path, variants: list[str]) -> None:
    """Students trained at more than one seed (the recipe's SEEDS; -seedS names): ROUGE-1 by seed, each seed's
    difference from the Regular student of the same seed, and one paired permutation test over every (seed,
    document) pair, so that two seeds' documents weigh in one comparison."""
    import re

    from modelshrink.metrics.stats import paired_test

    groups: dict[str, list[str]] = {}
    for v in variants:
        groups.setdefault(re.sub(r"-seed\d+$", "", v), []).append(v)
    lines = []
    for base, seeds in groups.items():
        regular = {v: _document_scores(folder / f"eval-regular{v}") for v in seeds}
        for key, name in [("gold", "gold synopses")] + PLATE_LABELS:
            if key == "regular":
                continue
            found = [(v, _document_scores(folder / f"eval-{key}{v}")) for v in seeds if regular[v] is not None]
            found = [(v, d) for v, d in found if d is not None]
            if len(found) < 2:
                continue
            for v, d in found:
                if d["id"] != regular[v]["id"]:
                    raise SystemExit(f"eval-{key}{v} and eval-regular{v} scored different documents")
            mean = statistics.mean
            by_seed = ", ".join(f"{mean(d['rouge1']):.2f}" for _, d in found)
            regular_by_seed = ", ".join(f"{mean(regular[v]['rouge1']):.2f}" for v, _ in found)
            deltas = ", ".join(f"{mean(d['rouge1']) - mean(regular[v]['rouge1']):+.2f}" for v, d in found)
            pooled = []
            for metric in ("rouge1", "rouge2", "rougeL"):
                a = [x for _, d in found for x in d[metric]]
                b = [x for v, _ in found for x in regular[v][metric]]
                pooled.append(f"{mean(a) - mean(b):+.2f} ({_p_text(paired_test(a, b))})")
            lines.append(f"| {name}{_variant_label(base)} | {len(found)} | {by_seed} | {regular_by_seed} | {deltas} | "
                         + " | ".join(pooled) + " |")
    if lines:
        print("\nStudents at more than one seed (ROUGE-1 by seed, seed 0 first; Δ against the Regular student of "
              "the same seed; pooled: one paired permutation test over every seed's documents, pairs matched by "
              "seed and document)\n")
        print("| student trained on | seeds | R-1 by seed | Regular's R-1 by seed | Δ R-1 by seed | pooled Δ R-1 (p) | "
              "pooled Δ R-2 (p) | pooled Δ R-L (p) |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(lines))



DQ_ROWS = [("float", "32-32-32 6-6 (the teacher)"), ("888-direct", "8-8-8 6-6, direct"),
           ("228-direct", "2-2-8 6-6, direct"), ("888-6-6", "8-8-8 6-6, distillation-aware"),
           ("228-6-6", "2-2-8 6-6, distillation-aware"), ("228-6-3", "2-2-8 6-3, distillation-aware")]
DQ_PAIRS = [("888-6-6", "888-direct"), ("228-6-6", "228-direct"), ("228-6-3", "228-6-6")]  # recipe's eval-A-vs-B
# the same rows with the authors' activation clamp (--activation-clip, the recipe's CLIP), and each against its
# unclamped twin
DQ_ROWS += [(f"{key}-clip", f"{name}, clamp ±2.5") for key, name in DQ_ROWS[1:]]
DQ_PAIRS += [(f"{a}-clip", f"{b}-clip") for a, b in DQ_PAIRS] + [(f"{key}-clip", key) for key, _ in DQ_ROWS[1:6]]
# a longer budget for a row that was still improving (SCALE=gpu STEPS=...); named by its recipe key + "-long"
DQ_ROWS += [("228-6-6-long", "2-2-8 6-6, distillation-aware, longer")]
DQ_PAIRS += [("228-6-6-long", "228-6-6")]


def _loss_windows(log: Path, term: str = "loss", width: int = 50, count: int = 4) -> list[tuple[int, int, float]]:
    """(first step, last step, mean of `term`) of the last `count` windows of `width` steps of a train_log.jsonl."""
    if not log.is_file():
        return []
    losses = [(row["step"], row[term]) for row in map(json.loads, log.read_text().splitlines()) if term in row]
    if not losses:
        return []
    last = losses[-1][0]
    windows = []
    for end in range(last, 0, -width)[:count][::-1]:
        inside = [loss for step, loss in losses if end - width < step <= end]
        if inside:
            windows.append((end - width + 1, end, statistics.mean(inside)))
    return windows


def _validation_curves(logs: list[tuple[str, Path]], metric: str, label: str) -> None:
    """Each model's held-out score at every validation of its training (the `validation` events of its
    train_log.jsonl; training keeps the best checkpoint): a curve still rising at its last point has not converged."""
    curves = []
    for name, log in logs:
        if log.is_file():
            points = [(row["step"], row[metric]) for row in map(json.loads, log.read_text().splitlines())
                      if row.get("event") == "validation" and metric in row]
            if points:
                curves.append((name, points))
    if not curves:
        return
    print(f"\nHeld-out {label} at each validation during training (step: score), and the best, whose checkpoint "
          f"is the one kept:\n\n| model | {label} by step | best |\n|---|---|---|")
    for name, points in curves:
        step, score = max(points, key=lambda point: point[1])
        print(f"| {name} | " + ", ".join(f"{s}: {v:.2f}" for s, v in points) + f" | {score:.2f} at step {step} |")


def _float_eval(folder: Path, recipe: str) -> dict:
    """The float teacher's evaluation that every DQ-BART row is measured against, or exit naming the recipe."""
    float_eval = _json(folder / "eval-float" / "metrics.json")
    if float_eval is None:
        sys.exit(f"no {folder / 'eval-float'}: run recipes/{recipe} first")
    return float_eval


def _pairs_table(folder: Path, pairs: list[tuple[str, str]], rows: list[tuple[str, str]],
                 keys: dict[str, str]) -> None:
    """Rows tested against rows (the recipes' eval-A-vs-B): Δ and p per metric, for the pairs that were run."""
    found = [(a, b, _json(folder / f"eval-{a}-vs-{b}" / "metrics.json")) for a, b in pairs]
    if not any(m for _, _, m in found):
        return
    names = dict(rows)
    print("\n| compared | " + " | ".join(f"Δ {label} (p)" for label in keys.values()) + " |\n|---|"
          + "---|" * len(keys))
    for a, b, m in found:
        if m is not None:
            print(f"| {names[a]} against {names[b]} | " + " | ".join(_delta_p(m, k) for k in keys) + " |")


def dqbart(runs: Path, figures: Path) -> None:
    folder = runs / "dq-bart"
    float_eval = _float_eval(folder, "dq-bart-debian.sh")
    float_bytes = float_eval["efficiency"]["bytes_on_disk"]
    print("| W-E-A E-D | MB on disk | compression | MB at 2 bits/weight (paper's count) | compression | "
          "ROUGE-1 | ROUGE-2 | ROUGE-L | Δ R-1 vs float (p) | Δ R-2 (p) | Δ R-L (p) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    points = []
    for key, name in DQ_ROWS:
        m = float_eval if key == "float" else _json(folder / f"eval-{key}" / "metrics.json")
        if m is None:
            continue
        model = None if key == "float" else _json(folder / key / "modelshrink.json")["metrics"]
        stored = m["efficiency"]["bytes_on_disk"] if "efficiency" in m else model["bytes_on_disk"]
        nominal = stored if key == "float" else model["bytes_at_nominal_bits"]
        ps = " | ".join(_delta_p(m, k) for k in ("rouge1", "rouge2", "rougeL"))
        print(f"| {name} | {stored / 1e6:.1f} | {float_bytes / stored:.1f}× | {nominal / 1e6:.1f} | "
              f"{float_bytes / nominal:.1f}× | {_rouge(m, 'rouge1')} | {_rouge(m, 'rouge2')} | "
              f"{_rouge(m, 'rougeL')} | {ps} |")
        near = next((i for i, (_, b, r) in enumerate(points) if b == stored and abs(r - m["rougeL"]) < 1), None)
        if near is None:
            points.append((key, stored, m["rougeL"]))
        else:  # the same size and nearly the same score: one point with both names, not two labels on top
            points[near] = (f"{points[near][0]} / {key}", stored, points[near][2])
    _pairs_table(folder, DQ_PAIRS, DQ_ROWS, {"rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L"})
    _validation_curves([(name, folder / key / "train_log.jsonl") for key, name in DQ_ROWS[1:]], "rougeL", "ROUGE-L")
    trends = [(f"{name}, {what}", _loss_windows(folder / key / "train_log.jsonl", term)) for key, name in DQ_ROWS
              for term, what in (("loss", "total"), ("kd_hidden", "hidden-state term"))]
    trends = [(name, windows) for name, windows in trends if windows]
    groups: dict[tuple, list] = {}  # models trained for other step counts get a table of their own windows
    for name, windows in trends:
        groups.setdefault(tuple((a, b) for a, b, _ in windows), []).append((name, windows))
    for spans, rows in groups.items():
        print("\nTraining loss (logged, mean over each window of 50 steps; still falling = not converged):"
              "\n\n| model | " + " | ".join(f"steps {a}-{b}" for a, b in spans) + " |\n|---|" + "---|" * len(spans))
        for name, windows in rows:
            print(f"| {name} | " + " | ".join(f"{mean:.2f}" for _, _, mean in windows) + " |")
    try:
        from modelshrink.figures import quality_vs_footprint

        print(f"\n![DQ-BART Fig. 1]({quality_vs_footprint(points, figures / 'dq-bart-fig1.png', 'ROUGE-L')})")
    except Exception as e:
        print(f"(no figure: {e})")


DQ_MT_ROWS = [("float", "32-32-32 6-6 (the teacher)"), ("888-direct", "8-8-8 6-6, direct"),
              ("888-direct-clip", "8-8-8 6-6, direct, clamp ±2.5"), ("228-direct", "2-2-8 6-6, direct"), ("888-6-6", "8-8-8 6-6, distillation-aware"),
              ("228-6-6", "2-2-8 6-6, distillation-aware"), ("888-6-3", "8-8-8 6-3, distillation-aware"),
              ("228-6-3", "2-2-8 6-3, distillation-aware")]
DQ_MT_PAIRS = [("888-6-6", "888-direct"), ("228-6-6", "228-direct"), ("888-6-3", "888-6-6"), ("228-6-3", "228-6-6")]
# DQ-BART Table 2 (mBART-large 12-12 on WMT16 En-Ro): BLEU, and the size ratio it gives
DQ_MT_PAPER = {"float": ("12-12", "1x", 26.82), "888-direct": ("12-12", "4.0x", 0.01),
               "888-direct-clip": ("12-12", "4.0x", 0.01),  # the authors' quantizer clamps activations
               "888-6-6": ("12-12", "4.0x", 25.91), "228-6-6": ("12-12", "15.2x", 23.48),
               "888-6-3": ("12-6", "4.7x", 25.61), "228-6-3": ("12-6", "18.0x", 17.66)}


def dqbart_mt(runs: Path, figures: Path) -> None:
    """DQ-BART Table 2 small (recipes/dq-bart-translation.sh): BLEU and chrF with intervals, each row against the
    float teacher, beside the paper's mBART rows."""
    folder = runs / "dq-bart"
    float_eval = _float_eval(folder, "dq-bart-translation.sh")
    float_bytes = float_eval["efficiency"]["bytes_on_disk"]
    print("| W-E-A E-D | MB on disk | compression | BLEU | chrF | Δ BLEU vs float (p) | Δ chrF (p) | paper (E-D, size, "
          "BLEU) |")
    print("|---|---|---|---|---|---|---|---|")
    points = []
    for key, name in DQ_MT_ROWS:
        m = float_eval if key == "float" else _json(folder / f"eval-{key}" / "metrics.json")
        if m is None:
            continue
        stored = m["efficiency"]["bytes_on_disk"] if "efficiency" in m else \
            _json(folder / key / "modelshrink.json")["metrics"]["bytes_on_disk"]
        paper = DQ_MT_PAPER.get(key)
        print(f"| {name} | {stored / 1e6:.1f} | {float_bytes / stored:.1f}× | {_rouge(m, 'bleu')} | "
              f"{_rouge(m, 'chrf')} | {_delta_p(m, 'bleu')} | {_delta_p(m, 'chrf')} | "
              f"{' / '.join(map(str, paper)) if paper else '–'} |")
        points.append((key, stored, m["bleu"]))
    _pairs_table(folder, DQ_MT_PAIRS, DQ_MT_ROWS, {"bleu": "BLEU", "chrf": "chrF"})
    # the teacher is trained by the same recipe (RUNS/teacher), so its curve is here too
    _validation_curves([(name, (runs / "teacher" if key == "float" else folder / key) / "train_log.jsonl")
                        for key, name in DQ_MT_ROWS], "bleu", "BLEU")
    try:
        from modelshrink.figures import quality_vs_footprint

        print(f"\n![DQ-BART Table 2 small]({quality_vs_footprint(points, figures / 'dq-bart-mt.png', 'BLEU')})")
    except Exception as e:
        print(f"(no figure: {e})")


ACKD_ROWS = [("ce", "CE only"), ("kd", "KD (CE + KD)"), ("kd-pt", "KD + PT (PKD)"), ("ackd", "ACKD"),
             ("ackd-no-sar", "ACKD w/o SAR"), ("ackd-no-storage", "ACKD w/o storage"),
             ("ackd-no-kd", "ACKD w/o KD"), ("ackd-no-pt", "ACKD w/o PT"),
             # follow-ups (recipes/ackd-rt-polarity.sh, STUDENTS=...): what moves PT and A-CDL
             ("kd-pt-mean", "KD + PT, mean-pooled features"), ("ackd-mean", "ACKD, mean-pooled features"),
             ("ackd-mean-tau01", "ACKD, mean-pooled, τ 0.1, γ 5e-2"), ("kd-first", "KD, first layers (0, 1, 2)"),
             ("ackd-first", "ACKD, first layers (0, 1, 2)")]
# each follow-up ACKD student against the KD + PT student of the same features and layers: what A-CDL (and SAR) add
ACKD_CONTROLS = {"ackd-mean": "kd-pt-mean", "ackd-mean-tau01": "kd-pt-mean", "ackd-first": "kd-first"}


def ackd(runs: Path, figures: Path, data: Path, teacher: Path, record: Path | None = None) -> None:
    """With `record`, each model's validation predictions (and a student's SAR weights) are kept in
    RECORD/teacher.json and RECORD/seed-S/student-NAME.json as well, and the table covers every model recorded
    there: seeds trained in another session add to the same table without their weights."""
    from modelshrink.training import classify
    from modelshrink.metrics.stats import paired_test
    from modelshrink.models.loading import load_classifier

    rows = classify.read_labeled(str(data / "validation.jsonl"))
    gold = [r["label"] for r in rows]

    def predictions(folder: Path, record_as: Path | None, w: list | None = None) -> list[int]:
        model, tokenizer = load_classifier(str(folder))
        predicted = [int(p) for p in classify.predict(model, tokenizer, rows, 64, "cpu", 128)]
        if record_as is not None:
            record_as.parent.mkdir(parents=True, exist_ok=True)
            record_as.write_text(json.dumps({"model": str(folder), "predicted": predicted, "sar_w": w or []}) + "\n")
        return predicted

    found: dict[str, dict[str, list[int]]] = {}  # student -> seed -> predicted class per validation sentence
    sar: dict[tuple[str, str], list[list[float]]] = {}
    for key, _ in ACKD_ROWS:
        for seed in sorted(runs.glob("seed-*")):
            folder = seed / f"student-{key}"
            if (folder / "modelshrink.json").is_file():
                log = folder / "train_log.jsonl"  # SAR's batch-mean w, logged every 10 steps
                lines = log.read_text().splitlines() if log.is_file() else []
                sar[(key, seed.name)] = [[r["step"], r["sar_w"]] for r in map(json.loads, lines) if "sar_w" in r]
                found.setdefault(key, {})[seed.name] = predictions(
                    folder, record / seed.name / f"student-{key}.json" if record else None, sar[(key, seed.name)])
    teacher_pred = (predictions(teacher, record / "teacher.json" if record else None)
                    if (teacher / "modelshrink.json").is_file() else None)
    if record is not None:  # what other sessions recorded
        for path in sorted(record.glob("seed-*/student-*.json")):
            key, seed = path.stem.removeprefix("student-"), path.parent.name
            if seed not in found.get(key, {}):
                kept = json.loads(path.read_text())
                found.setdefault(key, {})[seed] = kept["predicted"]
                sar[(key, seed)] = kept["sar_w"]
        if teacher_pred is None and (record / "teacher.json").is_file():
            teacher_pred = json.loads((record / "teacher.json").read_text())["predicted"]
    seed_order = sorted({s for by_seed in found.values() for s in by_seed}, key=lambda s: int(s.split("-")[1]))
    results = {key: {s: [float(p == g) for p, g in zip(by_seed[s], gold)] for s in seed_order if s in by_seed}
               for key, by_seed in found.items()}
    teacher_acc = (100 * statistics.mean(float(p == g) for p, g in zip(teacher_pred, gold))
                   if teacher_pred is not None else None)
    if teacher_acc is not None:
        kept = (_json(teacher / "modelshrink.json") or {}).get("metrics", {})  # its training's own validation
        chosen = kept.get("validation") or {}
        extra = (f" (best checkpoint: step {chosen['step']} of {kept['steps']}, F1 {chosen['f1']:.2f}, "
                 f"MCC {chosen['mcc']:.2f})" if {"step", "f1", "mcc"} <= chosen.keys() and "steps" in kept else "")
        print(f"Teacher (MiniLM-L6 fine-tuned): {teacher_acc:.2f}% on {len(gold)} validation sentences{extra}.\n")
    if (data / "train.jsonl").is_file():  # how balanced the task is (the five-class bins are not)
        labels = [r["label"] for r in classify.read_labeled(str(data / "train.jsonl"))]
        print("Training sentences by class: " + ", ".join(
            f"{c}: {100 * labels.count(c) / len(labels):.1f}%" for c in sorted(set(labels))) + "\n")
    print("| student | seeds | accuracy mean ± std | per seed | p vs CE | p vs KD | p vs KD + PT | p vs ACKD | "
          "sentences classified unlike KD |")
    print("|---|---|---|---|---|---|---|---|---|")
    bars, errors = [], []
    for key, name in ACKD_ROWS:
        if key not in results:
            continue
        per_seed = {s: 100 * statistics.mean(v) for s, v in results[key].items()}
        values = list(per_seed.values())
        std = statistics.stdev(values) if len(values) > 1 else 0.0

        def pooled(ref: str) -> str:
            common = [s for s in results[key] if s in results.get(ref, {})]
            if ref == key or not common:
                return "–"
            a = [x for s in common for x in results[key][s]]
            b = [x for s in common for x in results[ref][s]]
            return _p_text(paired_test(a, b), star=False)

        flips = [sum(a != b for a, b in zip(found[key][s], found["kd"][s])) for s in results[key]
                 if s in found.get("kd", {})]
        same_text = "–" if key == "kd" or not flips else ", ".join(map(str, flips))
        print(f"| {name} | {len(values)} | {statistics.mean(values):.2f} ± {std:.2f} | "
              f"{', '.join(f'{v:.2f}' for v in values)} | {pooled('ce')} | {pooled('kd')} | {pooled('kd-pt')} | "
              f"{pooled('ackd')} | {same_text} |")
        if (key, name) in ACKD_ROWS[:8]:  # Fig. 3: the paper's ablation; the follow-ups stay in the table
            bars.append((f"{name} ({len(values)})", statistics.mean(values)))
            errors.append(std)
    print("\np: paired permutation test (10,000 resamples) on per-sentence correctness, pooled over the seeds both "
          "students have (pairs matched by seed and sentence); p vs ACKD is Fig. 3's comparison of each ablation. Last column: validation sentences the student "
          "classifies unlike the KD student of the same seed, per seed.")
    for key, control in ACKD_CONTROLS.items():
        common = [s for s in results.get(key, {}) if s in results.get(control, {})]
        if common:
            names = dict(ACKD_ROWS)
            p = paired_test([x for s in common for x in results[key][s]],
                            [x for s in common for x in results[control][s]])
            differ = [sum(a != b for a, b in zip(found[key][s], found[control][s])) for s in common]
            print(f"\n{names[key]} against {names[control]} (the same features without A-CDL), {len(common)} seed(s): "
                  f"{100 * statistics.mean(x for s in common for x in results[key][s]):.2f} against "
                  f"{100 * statistics.mean(x for s in common for x in results[control][s]):.2f}, "
                  f"p = {'< 0.001' if p < 0.001 else f'{p:.3f}'}, sentences classified differently "
                  f"{', '.join(map(str, differ))}.")
    drift = []
    for key, name in ACKD_ROWS:
        for seed in seed_order:
            w = sar.get((key, seed), [])
            if w:
                quarter = [v for s, v in w if s <= w[-1][0] // 4]
                drift.append(f"| {name} | {seed} | {w[0][1]:.3f} | {statistics.mean(quarter):.3f} | "
                             f"{w[-1][1]:.3f} |")
    if drift:
        print("\nSAR: the batch-mean weight w (logged every 10 steps) at the first log, over the first quarter of "
              "training, and at the last step.\n")
        print("| student | seed | w at step 10 | mean over the first quarter | w at the end |")
        print("|---|---|---|---|---|")
        print("\n".join(drift))
    if bars:
        try:
            from modelshrink.figures import accuracy_bars

            path = accuracy_bars(bars, figures / "ackd-fig3.png", "3-layer students on rt-polarity "
                                 "(mean ± std over the seeds in brackets)", teacher_acc, errors)
            print(f"\n![ACKD Fig. 3]({path})")
        except Exception as e:
            print(f"(no figure: {e})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["teacher", "plate", "dqbart", "dqbart-mt", "ackd"])
    parser.add_argument("runs", nargs="?", default=None, type=Path,
                        help="the recipe's OUT_DIR (default runs/repro; runs/repro/ackd for ackd)")
    parser.add_argument("--figures", type=Path, default=None, help="where PNGs go (default RUNS)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/rt-polarity"), help="ackd: rt-polarity")
    parser.add_argument("--teacher", type=Path, default=None, help="ackd: the teacher (default RUNS/teacher)")
    parser.add_argument("--long", action="store_true", help="plate: the LONG=1 run (RUNS/plate-long)")
    parser.add_argument("--record", type=Path, default=None,
                        help="ackd: keep each model's validation predictions here too, and table every model "
                             "recorded there (seeds of other sessions)")
    args = parser.parse_args(argv)
    runs = args.runs or Path("runs/repro/ackd" if args.table == "ackd" else "runs/repro")
    figures = args.figures or runs
    figures.mkdir(parents=True, exist_ok=True)
    if args.table == "ackd":
        ackd(runs, figures, args.data, args.teacher or runs / "teacher", args.record)
    elif args.table == "plate":
        plate(runs, figures, args.long)
    else:
        {"teacher": teacher, "dqbart": dqbart, "dqbart-mt": dqbart_mt}[args.table](runs, figures)


if __name__ == "__main__":
    main()
