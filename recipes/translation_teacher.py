"""python recipes/translation_teacher.py OUT --data TRAIN.jsonl.gz [--vocab 8000] [--layers 6] [--d-model 256]

The untrained start of a translation teacher for recipes/dq-bart-translation.sh: no pretrained multilingual
model is installable here (../shared/data/README.md), and MiniLM's uncased English WordPiece vocabulary does
not cover German or French (it strips accents and umlauts), so the teacher is a Marian-shaped transformer
(pre-norm-free post-LayerNorm like Marian, shared embeddings, sinusoidal positions) trained from scratch with a
joint byte-level BPE tokenizer trained on the pairs' source and target sides. `modelshrink distill TRAIN
--student OUT` then trains it. Written with save_pretrained: config, generation config (beam 4), random
weights (seeded), tokenizer.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def texts(path: Path):
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        for line in f:
            row = json.loads(line)
            yield row["source"]
            yield row["target"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="training pairs (source, target)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128, help="longest generated translation, in tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]  # Marian's ids: pad 0 (also the decoder start), eos 1
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts(args.data), trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", bpe.token_to_id("</s>"))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="</s>",
                                        unk_token="<unk>", model_max_length=512)
    torch.manual_seed(args.seed)
    config = MarianConfig(vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), d_model=args.d_model,
                          encoder_layers=args.layers, decoder_layers=args.layers,
                          encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
                          encoder_ffn_dim=4 * args.d_model, decoder_ffn_dim=4 * args.d_model,
                          max_position_embeddings=512, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                          forced_eos_token_id=1, share_encoder_decoder_embeddings=True, scale_embedding=True)
    model = MarianMTModel(config)
    generation = model.generation_config
    generation.num_beams, generation.max_length, generation.bad_words_ids = 4, args.max_length, None
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"{args.out}: Marian {args.layers}+{args.layers} layers, d {args.d_model}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, vocabulary {len(tokenizer)}")


if __name__ == "__main__":
    main()
