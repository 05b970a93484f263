"""The static search's failures, injected on the CPU (issue 79): a capture or replay error and an empty graph end in
one line and the rows transformers' generate writes; out of memory in a shape retries the batch in two halves; every
CUDA call of the search runs under the model's device."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from conftest import read_rows
from modelshrink.artifacts import read_manifest
from modelshrink.generation.settings import resolve_generation
from modelshrink.generation.static import StaticSearch, why_not
from modelshrink.generation.static.runner import length_buckets
from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

FIXED = {"encoder_self": 1.0, "decoder_self": 1.0, "decoder_cross": 1.0}


def _options(teacher, data, **kw):
    return PseudolabelOptions(teacher=str(teacher), data=str(data), **{"batch_size": 5, "device": "cpu",
                                                                        "num_beams": 2, "max_length": 10, **kw})


def _plain(saved_models, docs_jsonl, tmp_path):
    return read_rows(pseudolabel(_options(saved_models["bart"], docs_jsonl, generator="transformers"),
                                 tmp_path / "plain"))


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore"),
                                   RuntimeError("the CUDA graph captured on cuda:1 is empty (the step ran on another "
                                                "device)")])
def test_a_failing_static_search_gives_way_to_generate_in_one_line(monkeypatch, saved_models, docs_jsonl, tmp_path,
                                                                    error):
    """The batch that failed and every later one are written by generate: the same rows, none lost or twice."""
    calls = []

    def failing(self, input_ids, *args, **kwargs):
        calls.append(input_ids.shape[0])
        raise error

    monkeypatch.setattr(StaticSearch, "generate_ids", failing)
    lines: list[str] = []
    out = pseudolabel(_options(saved_models["bart"], docs_jsonl, generator="static"), tmp_path / "static",
                      log=lines.append)
    assert len(calls) == 1  # given up after the first failure
    assert read_rows(out) == _plain(saved_models, docs_jsonl, tmp_path)
    first = str(error).splitlines()[0]
    said = [line for line in lines if "static search failed" in line]
    assert said == [f"warning: the static search failed (RuntimeError: {first}); transformers' generate writes this "
                    "batch and the rest of the run (--generator transformers skips the static search)"]
    metrics = read_manifest(out)["metrics"]
    assert metrics["generator"] == f"static, then transformers (RuntimeError: {first})"


def test_out_of_memory_in_a_shape_retries_the_batch_in_two_halves(monkeypatch, saved_models, docs_jsonl, tmp_path):
    original, seen, released = StaticSearch.generate_ids, [], []

    def tight(self, input_ids, *args, **kwargs):
        seen.append(input_ids.shape[0])
        if input_ids.shape[0] > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return original(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(StaticSearch, "generate_ids", tight)
    monkeypatch.setattr(StaticSearch, "release", lambda self: released.append(len(self.shapes)))
    lines: list[str] = []
    out = pseudolabel(_options(saved_models["bart"], docs_jsonl, generator="static"), tmp_path / "static",
                      log=lines.append)
    assert 5 in seen and seen[seen.index(5) + 1:seen.index(5) + 3] == [3, 2] and released
    assert read_rows(out) == _plain(saved_models, docs_jsonl, tmp_path)
    assert any("out of GPU memory in the static search's shape for 5 documents" in line for line in lines)
    assert read_manifest(out)["metrics"]["generator"] == "static"


def test_max_length_of_two_takes_generate():
    from transformers import BartConfig, BartForConditionalGeneration

    model = BartForConditionalGeneration(BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                                    encoder_attention_heads=2, decoder_attention_heads=2,
                                                    encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32))
    settings = resolve_generation(model.generation_config, num_beams=2, max_length=2)
    assert why_not(model, settings) == "max_length 2 is one step at most, nothing a fixed-shape search gains on"


class _Recorder:
    """torch.cuda's calls of the search, each with the device `torch.cuda.device` held when it was made."""

    def __init__(self, monkeypatch, empty: bool = False):
        self.current, self.calls, self.empty = None, [], empty
        recorder = self

        @contextlib.contextmanager
        def device(which):
            before, recorder.current = recorder.current, which
            try:
                yield
            finally:
                recorder.current = before

        class Stream:
            def __init__(self, *args, **kwargs):
                recorder.note("Stream")

            def wait_stream(self, other):
                recorder.note("wait_stream")

        class Graph:
            def replay(self):
                recorder.note("replay")

        @contextlib.contextmanager
        def graph(g, pool=None, **kwargs):
            recorder.note("graph")
            yield
            if recorder.empty:
                warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be "
                              "captured on wrong device or stream.")

        @contextlib.contextmanager
        def stream(s):
            recorder.note("stream")
            yield

        for name, value in {"device": device, "Stream": Stream, "CUDAGraph": Graph, "graph": graph, "stream": stream,
                            "current_stream": lambda *a: Stream(), "synchronize": lambda *a: self.note("synchronize"),
                            "empty_cache": lambda: self.note("empty_cache")}.items():
            monkeypatch.setattr(torch.cuda, name, value)

    def note(self, name):
        self.calls.append((name, self.current))


def _search_on_a_mocked_gpu(monkeypatch, empty=False):
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    model = BartForConditionalGeneration(BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                                    encoder_attention_heads=2, decoder_attention_heads=2,
                                                    encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32))
    model.eval()
    search = StaticSearch(model, resolve_generation(model.generation_config, num_beams=2, max_length=6), FIXED)
    recorder = _Recorder(monkeypatch, empty)
    search.cuda = True  # the CUDA calls are the recorder's; the tensors stay on the CPU
    search.buckets = length_buckets(6, smallest=2)  # a graph for each of 2, 4 and 6 cache positions
    return search, recorder


def test_every_cuda_call_of_the_search_runs_under_the_models_device(monkeypatch):
    """`--device cuda:1`: a capture on the current device (0) would hold none of the step's kernels."""
    search, recorder = _search_on_a_mocked_gpu(monkeypatch)
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 9, 2, 1]])
    search.generate_ids(ids, (ids != 1).long())
    search.generate_ids(ids, (ids != 1).long())  # the second batch replays the captured shape
    names = [name for name, _ in recorder.calls]
    assert {"graph", "replay", "Stream", "synchronize"} <= set(names) and names.count("graph") == 3  # one a bucket
    assert {device for _, device in recorder.calls} == {search.device}, recorder.calls


def test_an_empty_capture_is_an_error_not_empty_summaries(monkeypatch):
    search, _ = _search_on_a_mocked_gpu(monkeypatch, empty=True)
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    with pytest.raises(RuntimeError, match="is empty"):
        search.generate_ids(ids, torch.ones_like(ids))


def _on_a_gpu(monkeypatch, wrong_rows: int):
    """`auto` as it runs on a GPU (the search's cuda flag set), its search replaced by generate with `wrong_rows`
    of each batch's ids changed."""
    import modelshrink.generation.summarizer as summarizer
    from modelshrink.generation.settings import generate_ids

    built, calls = summarizer.static_search, []

    def on_gpu(model, settings, *args):
        search = built(model, settings, *args)
        if search is None:  # --generator transformers
            return None

        def searched(input_ids, attention_mask, row_lambdas=None):
            calls.append(input_ids.shape[0])
            ids = generate_ids(model, input_ids, attention_mask, settings, None).clone()
            ids[:wrong_rows, 1] = (ids[:wrong_rows, 1] + 1) % search.vocab
            return ids

        search.cuda, search.generate_ids = True, searched
        return search

    monkeypatch.setattr(summarizer, "static_search", on_gpu)
    return calls


@pytest.mark.parametrize("wrong_rows", [0, 1])
def test_auto_on_a_gpu_checks_its_first_batch_against_generate(monkeypatch, saved_models, docs_jsonl, tmp_path,
                                                                wrong_rows):
    """Equal ids on the first batch: the static search writes the run; one document different (float32): one line,
    and generate writes every row, the first batch's too. The manifest records the check."""
    calls = _on_a_gpu(monkeypatch, wrong_rows)
    lines: list[str] = []
    out = pseudolabel(_options(saved_models["bart"], docs_jsonl, generator="auto"), tmp_path / "auto",
                      log=lines.append)
    metrics = read_manifest(out)["metrics"]
    check = metrics["static_search_check"]
    assert check == {"documents": 5, "differing": wrong_rows, "allowed": 0, "dtype": "float32",
                     "passed": not wrong_rows}
    if wrong_rows:
        assert calls == [5] and read_rows(out) == _plain(saved_models, docs_jsonl, tmp_path)
        assert [line for line in lines if "first batch differed" in line] == [
            "warning: the static search's first batch differed from transformers' generate on 1 of 5 documents "
            "(float32; allowed: 0); generate writes the run (--generator static skips this check)"]
        assert metrics["generator"].startswith("static, then transformers (its first batch differed")
    else:
        assert len(calls) > 1 and metrics["generator"] == "static"


def test_a_new_shape_is_built_only_where_its_bytes_are_free(monkeypatch):
    """Memory by bytes: a shape's bytes are known before it is built (equal to what its buffers take, beside its
    step's activations), and on a GPU the least recently used shapes are released until the device has them free."""
    search, recorder = _search_on_a_mocked_gpu(monkeypatch)
    one = search.shape_bytes(1, 32)
    free = {"bytes": int(2.2 * one)}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 10 * one))
    shape = search.shape_for(1, 5)
    buffers = sum(t.numel() * t.element_size() for t in shape.buffers.values())
    rows = search.rules.num_beams
    assert one == buffers + 4 * rows * search.vocab * 4
    free["bytes"] -= one  # what the first shape took
    search.shape_for(1, 40)  # a second source length: 1.2 shapes free < 1.5 needed, the first is released
    assert list(search.shapes) == [(1, 64)] and search.memory["released_for_memory"] == 1
    assert search.memory["shapes_built"] == 2 and search.memory["largest_shape_bytes"] == search.shape_bytes(1, 64)
    assert ("empty_cache", None) in recorder.calls
