"""Options of `modelshrink pseudolabel`."""

from __future__ import annotations

from typing import ClassVar

from modelshrink.errors import UserError
from modelshrink.options import REQUIRED, opt, options_class
from modelshrink.options.generation import GEN, TemperatureOptions, source_lang_option, target_lang_option
from modelshrink.options.train import DATA, SPLITS

BASE = "Baselines (PLATE Table 5, Appendix C)"


@options_class
class PseudolabelOptions(TemperatureOptions):
    """Every option of `modelshrink pseudolabel`."""

    STEP: ClassVar[str] = "pseudolabel"
    GOES_WITH: ClassVar[dict[str, str]] = {"top_p": "do_sample", "top_k": "do_sample"}

    teacher: str = opt(REQUIRED, "Teacher: a save_pretrained folder, a modelshrink model artifact, or a hub name "
                                 "present in the local cache.", argument=True)
    data: str = opt(REQUIRED, "Documents: .jsonl[.gz], .csv, .parquet, a datasets folder, a modelshrink dataset "
                              "artifact, or a cached hub dataset.", argument=True)
    seed: int = opt(0, "Seed of the --lambda-range draws and of sampling.", panel=GEN)
    output_temperature: float | None = opt(None, "Temperature T of the final softmax instead of the attention "
                                                 "(Appendix C; the paper tries 0.5-2.0).", panel=BASE, above=0)
    do_sample: bool = opt(False, "Sample instead of beam search (one beam, full distribution unless --top-p/--top-k).",
                          panel=BASE)
    top_p: float | None = opt(None, "Nucleus sampling mass (with --do-sample).", panel=BASE, above=0, max=1)
    top_k: int | None = opt(None, "Top-k sampling (with --do-sample).", panel=BASE, min=0)
    target_lang: str | None = target_lang_option()
    source_lang: str | None = source_lang_option()
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
        self.check_temperature()
        if self.do_sample and self.num_beams not in (None, 1):
            raise UserError("--do-sample draws one sequence per document; leave --num-beams at 1")
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            raise UserError(f"--min-length {self.min_length} is above --max-length {self.max_length}")
