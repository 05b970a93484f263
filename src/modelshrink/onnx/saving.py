"""How an export writes a graph: one .onnx file, or where protobuf's 2 GB limit would stop it, the graph in the
.onnx file and every weight in one `<graph>.onnx_data` beside it (ONNX external data, under the name Optimum and
transformers.js give it; onnxruntime reads it from the graph's folder).

A real-size vocabulary passes the limit quickly: mBART-50's or NLLB's 250,000 x 1,024 embedding is 1 GB, and the
traced decoder holds it twice (the table and the output projection, transposed), beside its layers. Every rewrite
of an export (`modelshrink.onnx`) loads a graph with its data and saves it through `save_graph`.

Memory: a graph saved in one file is held twice at once (its weights in the protobuf and the serialized bytes), and
the trace held it three times beside the model. So an export keeps every graph in the data-file form while it
traces and rewrites them (`staged`): the trace writes the weights to the data file one tensor at a time
(`attach_weights`), and a rewrite's save writes each weight out and drops it from memory as it goes. At the end
`finish_graph` gives each graph under the limit its one file again, with the model long freed (issue 78: the
bart-large-cnn shape's export peaked at 3.7x its float bytes, nearly all of it in the trace).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A graph whose protobuf is larger than this keeps its weights in a data file: protobuf refuses to serialize a
# message past 2 GiB, and the graph's nodes and names need a margin under it
EXTERNAL_FROM = 2_000_000_000
DATA_SUFFIX = "_data"  # decoder_model.onnx -> decoder_model.onnx_data
_STAGED = [False]  # inside `staged`: every graph saved with its data file, whatever its size


def data_file(path: Path) -> Path:
    return path.with_name(path.name + DATA_SUFFIX)


def save_graph(model: Any, path: Path, check: bool = False) -> None:
    """Write `model` (its weights in memory) to `path`, in one file or with its data file when it is too large for
    one; a data file the graph had before is replaced (its weights were read from it). `check`: onnx's checker on
    the file written (on the model in memory, it serializes a copy of every weight, and parses it again)."""
    import onnx

    data = data_file(path)
    data.unlink(missing_ok=True)
    if not _STAGED[0] and model.ByteSize() <= EXTERNAL_FROM:
        onnx.save(model, str(path))
    else:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024, convert_attribute=False)
    if check:
        onnx.checker.check_model(str(path))


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


@contextlib.contextmanager
def staged() -> Iterator[None]:
    """Within: every graph traced or saved keeps its weights in its data file (module docstring)."""
    before = _STAGED[0]
    _STAGED[0] = True
    try:
        yield
    finally:
        _STAGED[0] = before


def finish_graph(path: Path) -> None:
    """A graph left in the data-file form by `staged` in one file again where it fits under the limit."""
    import onnx

    if not external_files(path):
        return
    model = onnx.load(str(path))
    save_graph(model, path)


def attach_weights(path: Path, weights: dict[str, Any]) -> list[str]:
    """Give the graph at `path`, traced without its weights (they are graph inputs named as in `weights`, a dict of
    torch tensors), those weights as initializers in its data file, written one tensor at a time; outside `staged`
    the graph is then finished (`finish_graph`). Returns the graph inputs that were weights."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inputs = [i for i in model.graph.input if i.name in weights]
    data = data_file(path)
    with open(data, "wb") as out:
        for value in inputs:
            model.graph.initializer.append(_external_tensor(value.name, weights[value.name], out, data.name))
    for value in inputs:
        model.graph.input.remove(value)
    onnx.save(model, str(path))
    if not _STAGED[0]:
        finish_graph(path)
    return [i.name for i in inputs]


def _external_tensor(name: str, tensor: Any, out: Any, location: str) -> Any:
    """A TensorProto naming `tensor`'s bytes, appended to the open data file `out` (offsets 64-byte aligned, as
    onnx writes them)."""
    import onnx
    import torch

    tensor = tensor.detach().cpu().contiguous()
    kind = {torch.bfloat16: onnx.TensorProto.BFLOAT16}.get(tensor.dtype)
    if kind is None:
        array = tensor.numpy()
        kind = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    else:
        array = tensor.view(torch.int16).numpy()
    offset = out.seek(0, 2)
    if offset % 64:
        offset = out.seek(offset + 64 - offset % 64)
    out.write(memoryview(array.reshape(-1)).cast("B"))
    proto = onnx.TensorProto(name=name, dims=list(array.shape), data_type=kind,
                             data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(array.nbytes))):
        entry = proto.external_data.add()
        entry.key, entry.value = key, value
    return proto
