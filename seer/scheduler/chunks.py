"""How one request is cut into chunks: the size of the next chunk and its seed (ids: seer.request_ids).

Divided rollout bounds every dispatch by `chunk_size`, so a request never holds more KV than
its context plus one chunk before it comes back to the scheduler; that bound is what makes
KV-budgeted admission (and migration between instances) possible.
"""

from __future__ import annotations

import hashlib


def chunk_max_tokens(
    chunk_size: int | None,
    max_tokens: int,
    generated: int,
    *,
    context_len: int | None = None,
    block_size: int | None = None,
) -> int:
    """`min(chunk_size, max_tokens - generated)`; `None` means the whole remainder (no chunking).

    With `context_len` and `block_size` (the instances' KV block), the chunk is shortened by less
    than a block so that its KV ends exactly on a block boundary: a chunk ending at context L has
    computed KV for L - 1 tokens (the last sampled token is never fed back), so it ends where
    `(L - 1) % block_size == 0`. Every block the request holds is then full, which means
    (1) its reservation (`placement.kv_reservation`) carries no rounding waste, and (2) vLLM's
    prefix cache and the Mooncake pool, which both keep only full blocks, hold the whole prefix:
    the next chunk recomputes one token instead of up to a block. Chunks smaller than a block
    are not aligned.
    """
    remaining = max_tokens - generated
    if remaining <= 0:
        raise ValueError(f"request already has {generated} of {max_tokens} tokens")
    if chunk_size is None:
        return remaining
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    n = chunk_size
    if block_size and context_len is not None and chunk_size >= block_size:
        n = chunk_size - (context_len + chunk_size - 1) % block_size
    return min(n, remaining)


def chunk_seed(base_seed: int | None, request_id: str, chunk_index: int) -> int | None:
    """A seed that depends only on (base seed, request, chunk index).

    Which instance a chunk lands on, and in which order chunks run, depend on timing; the seed
    must not, or a rerun of the same iteration would sample different tokens.
    """
    if base_seed is None:
        return None
    digest = hashlib.blake2b(
        f"{base_seed}/{request_id}/{chunk_index}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF  # engines take a signed 32-bit seed
