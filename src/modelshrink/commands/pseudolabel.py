"""`modelshrink pseudolabel`: teacher pseudo-labels with PLATE attention temperature."""

from __future__ import annotations

from modelshrink.commands._common import DocsProgress, emit, handle_errors, log
from modelshrink.commands._from_options import OUTPUT, OVERWRITE, QUIET, RESUME, from_options
from modelshrink.options.pseudolabel import PseudolabelOptions

EPILOG = """\
**Examples**

Regular pseudo labels, then PLATE with λ = 2 (the paper's best fixed value):

    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-regular
    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-lambda2 --lambda 2.0

λ ~ U[1, 2] drawn per document (recorded in each row); cross attention alone at 2.0:

    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-rnd --lambda-range 1 2
    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-cross --lambda-cross 2.0

Repeat a run from its manifest (its `options` as a TOML table), or continue an interrupted one:

    modelshrink pseudolabel --config recipe.toml -o runs/pl-again

    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-lambda2 --lambda 2.0 --resume
"""


@from_options(PseudolabelOptions, extra=[OUTPUT, RESUME, OVERWRITE, QUIET])
def pseudolabel(options: PseudolabelOptions, output, resume: bool, overwrite: bool, quiet: bool) -> None:
    """Label documents with a teacher's summaries, optionally at a higher attention temperature (PLATE).

    Writes a dataset artifact whose data.jsonl rows are id, document, summary (the pseudo summary),
    reference (the gold summary, when the input has one) and lambda, in input order; it feeds
    `modelshrink distill` directly. The temperature is folded into the query projections, so a
    fixed λ costs nothing at run time; the teacher on disk is never changed.
    """
    from modelshrink.steps.pseudolabel import pseudolabel as run

    with handle_errors(output), DocsProgress(quiet) as bars:
        path = run(options, output, overwrite=overwrite, resume=resume, progress=bars.task("pseudolabel"), log=log)
    emit(path)
