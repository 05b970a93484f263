"""How an export writes a graph: one .onnx file, or where protobuf's 2 GB limit would stop it, the graph in the
.onnx file and every weight in one `<graph>.onnx_data` beside it (ONNX external data, under the name Optimum and
transformers.js give it; onnxruntime reads it from the graph's folder).

A real-size vocabulary passes the limit quickly: mBART-50's or NLLB's 250,000 x 1,024 embedding is 1 GB, and the
traced decoder holds it twice (the table and the output projection, transposed), beside its layers. Every rewrite
of an export (`modelshrink.onnx`) loads a graph with its data and saves it through `save_graph`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# A graph whose protobuf is larger than this keeps its weights in a data file: protobuf refuses to serialize a
# message past 2 GiB, and the graph's nodes and names need a margin under it
EXTERNAL_FROM = 2_000_000_000
DATA_SUFFIX = "_data"  # decoder_model.onnx -> decoder_model.onnx_data


def data_file(path: Path) -> Path:
    return path.with_name(path.name + DATA_SUFFIX)


def save_graph(model: Any, path: Path) -> None:
    """Write `model` (its weights in memory) to `path`, in one file or with its data file when it is too large for
    one; a data file the graph had before is replaced (its weights were read from it)."""
    import onnx

    data = data_file(path)
    data.unlink(missing_ok=True)
    if model.ByteSize() <= EXTERNAL_FROM:
        onnx.save(model, str(path))
        return
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
                    size_threshold=1024, convert_attribute=False)


def external_files(path: Path) -> list[Path]:
    """The files beside the graph at `path` that hold its weights (none for a graph in one file)."""
    data = data_file(path)
    return [data] if data.is_file() else []


def consolidate(path: Path, written: list[Path]) -> None:
    """A graph the exporter wrote with external data (`written`: a file per weight, named after it) rewritten as
    `save_graph` writes it, one data file beside the graph; the exporter's files removed."""
    import onnx

    if not written:
        return
    model = onnx.load(str(path))
    for name in written:
        name.unlink()
    save_graph(model, path)


def graph_bytes(path: Path) -> int:
    """The bytes a graph takes on disk: its file and its data file."""
    return path.stat().st_size + sum(f.stat().st_size for f in external_files(path))


def move_graph(source: Path, target: Path) -> None:
    """Move a graph and its data file, which keeps its name (the graph names it) beside the graph."""
    files = external_files(source)
    source.rename(target)
    for data in files:
        data.rename(target.parent / data.name)


def remove_graph(path: Path) -> None:
    for data in external_files(path):
        data.unlink()
    path.unlink()
