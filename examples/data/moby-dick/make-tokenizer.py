#!/usr/bin/env python3
"""Trains the byte-level BPE tokenizer examples/jobs/gpt-bpe.yaml uses: 1024 tokens learnt from Moby-Dick.

    pip install tokenizers
    python3 examples/data/moby-dick/make-tokenizer.py

Deterministic for a given `tokenizers` version (it was made with the version printed into README.md)."""
import gzip
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

here = os.path.dirname(os.path.abspath(__file__))
with gzip.open(os.path.join(here, "moby-dick.txt.gz"), "rt", encoding="utf-8") as f:
    text = f.read()
# Train on the first 95% only: the last 5% is the held-out split and must stay unseen.
train = text[: len(text) - int(len(text.encode("utf-8")) * 0.05)]

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=1024,
    min_frequency=2,
    show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train_from_iterator(train.splitlines(keepends=True), trainer=trainer)
tok.save(os.path.join(here, "tokenizer.json"))
print("vocabulary", tok.get_vocab_size(with_added_tokens=True))
