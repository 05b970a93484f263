"""Options of `modelshrink pseudolabel`."""

from __future__ import annotations

from typing import ClassVar

from modelshrink.errors import UserError
from modelshrink.options import REQUIRED, opt, options_class
from modelshrink.options.generation import GEN, GenerationOptions
from modelshrink.options.train import DATA, SPLITS

PLATE = "Attention temperature (PLATE)"
BASE = "Baselines (PLATE Table 5, Appendix C)"


@options_class
class PseudolabelOptions(GenerationOptions):
    """Every option of `modelshrink pseudolabel`."""

    STEP: ClassVar[str] = "pseudolabel"

    teacher: str = opt(REQUIRED, "Teacher: a save_pretrained folder, a modelshrink model artifact, or a hub name "
                                 "present in the local cache.", argument=True)
    data: str = opt(REQUIRED, "Documents: .jsonl[.gz], .csv, .parquet, a datasets folder, a modelshrink dataset "
                              "artifact, or a cached hub dataset.", argument=True)
    lam: float | None = opt(None, "λ for every attention module: τ = sqrt(λ·d), logits / sqrt(λ). The paper uses "
                                  "1.5 or 2.0. [default: 1.0]", panel=PLATE, flags=("--lambda",), above=0)
    lambda_enc: float | None = opt(None, "λ for encoder self-attention only (Table 4).", panel=PLATE, above=0)
    lambda_dec: float | None = opt(None, "λ for decoder self-attention only.", panel=PLATE, above=0)
    lambda_cross: float | None = opt(None, "λ for decoder cross-attention only.", panel=PLATE, above=0)
    lambda_range: tuple[float, float] | None = opt(None, "Draw λ ~ U[A, B] per document (seeded, recorded per row); "
                                                         "the paper uses 1 2.", panel=PLATE, metavar="A B", above=0)
    seed: int = opt(0, "Seed for --lambda-range draws and sampling.", panel=GEN)
    output_temperature: float | None = opt(None, "Temperature T of the final softmax instead of the attention "
                                                 "(Appendix C; the paper tries 0.5-2.0).", panel=BASE, above=0)
    do_sample: bool = opt(False, "Sample instead of beam search (one beam, full distribution unless --top-p/--top-k).",
                          panel=BASE)
    top_p: float | None = opt(None, "Nucleus sampling mass (with --do-sample).", panel=BASE, above=0, max=1)
    top_k: int | None = opt(None, "Top-k sampling (with --do-sample).", panel=BASE, min=0)
    split: str | None = opt(None, f"Split of {SPLITS}.", panel=DATA)
    text_column: str | None = opt(None, "Document column. [default: auto: document/summary, article/highlights, "
                                        "dialogue/summary, text/summary]", panel=DATA)
    summary_column: str | None = opt(None, "Gold summary column, copied to `reference`. [default: auto]", panel=DATA)
    id_column: str | None = opt(None, "Row id column. [default: id if present, else the row number]", panel=DATA)
    limit: int | None = opt(None, "Use only the first N documents.", panel=DATA, min=1)
    device: str = opt("auto", "cpu, cuda, cuda:N, or auto.")
    trust_remote_code: bool = opt(False, "Allow the teacher's own code from the hub.")
    allow_pickle: bool = opt(False, "Load pickle weights (pytorch_model.bin) with torch.load(weights_only=True); "
                                    "refused by default, since pickles can run code.")

    def check(self) -> None:
        if self.lambda_range is not None:
            a, b = self.lambda_range
            if a > b:
                raise UserError(f"--lambda-range A B needs A <= B, got {a} > {b}")
            if self.lam is not None:
                raise UserError("--lambda and --lambda-range exclude each other; give one")
            if None not in (self.lambda_enc, self.lambda_dec, self.lambda_cross):
                raise UserError("--lambda-range draws λ for the attention kinds without their own λ, but "
                                "--lambda-enc, --lambda-dec and --lambda-cross fix all three; drop one of them "
                                "or --lambda-range")
        if (self.top_p is not None or self.top_k is not None) and not self.do_sample:
            raise UserError("--top-p / --top-k apply to sampling; add --do-sample")
        if self.do_sample and self.num_beams not in (None, 1):
            raise UserError("--do-sample draws one sequence per document; leave --num-beams at 1")
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            raise UserError(f"--min-length {self.min_length} is above --max-length {self.max_length}")
