// transformers.js on an export folder, from local files only (tests/test_clients.py runs it):
//
//     node tests/js/generate.mjs FOLDER < request.json
//
// request: {"documents": [...], "searches": [generate() options, ...]}, optionally "session_options" (onnxruntime's)
// and "batch": true. A seq2seq folder prints {"input_ids": [ids of each document], "generated": [[ids of each
// document] for each search]}, one document at a time (greedy unless a search sets num_beams); with "batch", also "batch_generated": [[ids of each
// document] for each search], the documents generated together as one padded batch. A classifier prints
// {"logits": [logits of each document]}.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import {
    env, AutoConfig, AutoTokenizer, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification,
} from '@huggingface/transformers';

const folder = path.resolve(process.argv[2]);
const request = JSON.parse(readFileSync(0, 'utf8'));
env.allowRemoteModels = false; // the folder is the model: never the hub
env.localModelPath = path.dirname(folder);
const name = path.basename(folder);
const numbers = (tensor) => Array.from(tensor.data, Number);

const tokenizer = await AutoTokenizer.from_pretrained(name);
const config = await AutoConfig.from_pretrained(name);
const options = { device: 'cpu', session_options: request.session_options ?? {} };
const result = {};
if (config.is_encoder_decoder) {
    // no dtype: the folder's config.json names the graphs' weight type (transformers.js_config.dtype)
    const model = await AutoModelForSeq2SeqLM.from_pretrained(name, options);
    const encoded = [];
    for (const document of request.documents) encoded.push(await tokenizer(document));
    result.input_ids = encoded.map((e) => numbers(e.input_ids));
    result.generated = [];
    for (const search of request.searches) {
        const rows = [];
        for (const e of encoded) {
            const out = await model.generate({ ...e, num_beams: 1, do_sample: false, ...search });
            rows.push(out.tolist()[0].map(Number));
        }
        result.generated.push(rows);
    }
    if (request.batch) {
        const padded = await tokenizer(request.documents, { padding: true });
        result.batch_generated = [];
        for (const search of request.searches) {
            const out = await model.generate({ ...padded, num_beams: 1, do_sample: false, ...search });
            result.batch_generated.push(out.tolist().map((row) => row.map(Number)));
        }
    }
} else {
    const model = await AutoModelForSequenceClassification.from_pretrained(name, options);
    result.logits = [];
    for (const document of request.documents) {
        const { logits } = await model(await tokenizer(document));
        result.logits.push(numbers(logits));
    }
}
process.stdout.write(JSON.stringify(result) + '\n');
