"""The embedded model's own tokenizer: one token per character.

Why character level: the default task is digit arithmetic, which a small model learns far
more easily one digit per token; and response length in tokens then tracks the trace length
exactly. Built with `tokenizers` and saved as a fast HF tokenizer, so `AutoTokenizer` (and so
vLLM) loads it like any checkpoint's; no chat template, the prompt is plain text.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3, in this order
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"
VOCAB: dict[str, int] = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
PAD_ID, BOS_ID, EOS_ID, UNK_ID = (VOCAB[t] for t in SPECIAL_TOKENS)


def build_tokenizer(model_max_length: int) -> PreTrainedTokenizerFast:
    """A fresh character-level tokenizer; adds no special tokens when encoding (plain prompts)."""
    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters concatenate back without separators
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="right",
    )
