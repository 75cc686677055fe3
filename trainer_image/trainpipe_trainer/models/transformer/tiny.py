"""A tiny causal language model written without downloads: for tests and ``trainpipe demo-data``.

A byte-level BPE tokenizer trained on the given texts (``tokenizers``), a two-layer GPT-2 initialised from
``seed``, both saved with ``save_pretrained`` (safetensors) into one folder: what ``model.pretrained_uri``
names. The same arguments write the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"


def write_tiny_model(folder: Path, texts: Iterable[str], *, seed: int = 0, vocab_size: int = 512,
                     n_embd: int = 32, n_layer: int = 2, n_head: int = 2, n_positions: int = 256) -> Path:
    """Write a tokenizer trained on ``texts`` and a randomly initialised GPT-2 causal LM into ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from trainpipe_trainer.models.transformer.loading import import_transformers, quiet_transformers

    transformers = import_transformers()
    GPT2Config, GPT2LMHeadModel = transformers.GPT2Config, transformers.GPT2LMHeadModel
    PreTrainedTokenizerFast = transformers.PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD_TOKEN, EOS_TOKEN, UNK_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # Sorted: the trained merges do not depend on the order the texts came in.
    tokenizer.train_from_iterator(sorted(set(texts)), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN,
                                   unk_token=UNK_TOKEN, model_max_length=n_positions)
    config = GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=n_positions, n_embd=n_embd,
                        n_layer=n_layer, n_head=n_head, pad_token_id=fast.pad_token_id,
                        eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id)
    # The model's own generator: the caller's global one is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    with quiet_transformers():  # no progress bar in a demo's or a test's output
        model.save_pretrained(folder, safe_serialization=True)
        fast.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    """``python -m trainpipe_trainer.models.transformer.tiny --texts FILE.json --out DIR``: what ``trainpipe
    demo-data`` runs in a process of its own (the provider imports no torch)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m trainpipe_trainer.models.transformer.tiny",
                                     description="Write a tiny GPT-2 and a tokenizer trained on the given texts.")
    parser.add_argument("--texts", type=Path, required=True, help="a JSON list of the texts to train the tokenizer on")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (save_pretrained)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--n-embd", type=int, default=32)
    args = parser.parse_args(argv)
    texts = json.loads(args.texts.read_text(encoding="utf-8"))
    write_tiny_model(args.out, texts, seed=args.seed, vocab_size=args.vocab_size, n_embd=args.n_embd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
