"""The embedded model's own tokenizer: byte-level BPE with no merges, i.e. one token per byte.

Why one token per byte: the default task is digit arithmetic, which a small model learns far
more easily one digit per token, and response length in tokens then tracks the trace length
exactly. Why byte-level BPE in Qwen2's exact pipeline: transformers 5 loads any checkpoint whose
config says `qwen2` with its Qwen2Tokenizer, which rebuilds the pipeline from the vocabulary and
merges; a tokenizer of another shape (say a character WordLevel) silently loses its whitespace
there, in transformers and in vLLM alike. Every byte has a token, so nothing is ever unknown.
No chat template: the prompt is plain text.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3, in this order

# Qwen2's pre-tokenizer split (transformers' tokenization_qwen2.PRETOKENIZE_REGEX).
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode map, in byte order: printable ASCII maps to itself, ' ' to 'Ġ'."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


VOCAB: dict[str, int] = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *_byte_symbols()])}
PAD_ID, BOS_ID, EOS_ID, UNK_ID = (VOCAB[t] for t in SPECIAL_TOKENS)


def build_tokenizer(model_max_length: int) -> PreTrainedTokenizerFast:
    """A fresh byte-level tokenizer; adds no special tokens when encoding (plain prompts)."""
    tok = Tokenizer(models.BPE(vocab=VOCAB, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="right",
    )
