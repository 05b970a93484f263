"""Optimum on export folders, in an interpreter with optimum-onnx (tests/test_clients.py runs it there: optimum-onnx
0.1 needs transformers < 4.58, which modelshrink's own environment cannot have):

    $MODELSHRINK_OPTIMUM_PYTHON tests/optimum/generate.py < requests.jsonl

One process answers every request of a test session (its imports take longer than most requests): one JSON
request a line on stdin, one line "RESULT {json}" on stdout for each ({"error": traceback} where it failed;
anything else on stdout is Optimum's own chatter).
request: {"folder": ..., "input_ids": [ids of each document], "searches": [generate() options, ...]} gives
{"generated": [[ids of each document] for each search]} (ORTModelForSeq2SeqLM), or with "classify": true,
{"logits": [...]} (ORTModelForSequenceClassification). With "texts" instead of "input_ids", the documents go
through the folder's own tokenizer in this environment (transformers 4's AutoTokenizer), and the answer adds
their "input_ids". With "export": OUT,
it writes Optimum's own export of the PyTorch model in "folder" to OUT (main_export), for the reverse check.
"""

import json
import sys
import traceback
import warnings

warnings.filterwarnings("ignore")  # transformers 4 on a transformers 5 config: deprecation notes, not results

import torch  # noqa: E402
from optimum.onnxruntime import ORTModelForSeq2SeqLM, ORTModelForSequenceClassification  # noqa: E402


def answer(request: dict) -> dict:
    if request.get("export"):
        from optimum.exporters.onnx import main_export

        main_export(request["folder"], output=request["export"], task="text2text-generation-with-past",
                    do_validation=False)
        return {"exported": request["export"]}
    result = {}
    if request.get("classify"):
        model = ORTModelForSequenceClassification.from_pretrained(request["folder"])
        result["logits"] = []
        for ids in request["input_ids"]:
            tokens = torch.tensor([ids])
            kwargs = {"token_type_ids": torch.zeros_like(tokens)} if "token_type_ids" in model.input_names else {}
            result["logits"].append(model(input_ids=tokens, attention_mask=torch.ones_like(tokens), **kwargs)
                                    .logits[0].tolist())
        return result
    if request.get("texts"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(request["folder"])
        request["input_ids"] = result["input_ids"] = [tokenizer(text)["input_ids"] for text in request["texts"]]
    model = ORTModelForSeq2SeqLM.from_pretrained(request["folder"])
    result["generated"] = []
    for search in request["searches"]:
        rows = []
        for ids in request["input_ids"]:
            tokens = torch.tensor([ids])
            rows.append(model.generate(input_ids=tokens, attention_mask=torch.ones_like(tokens), do_sample=False,
                                       **search)[0].tolist())
        result["generated"].append(rows)
    return result


for line in sys.stdin:
    try:
        out = answer(json.loads(line))
    except Exception:  # the test prints it; the process goes on to the next request
        out = {"error": traceback.format_exc()}
    print("RESULT " + json.dumps(out), flush=True)
