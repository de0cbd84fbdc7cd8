"""Packed and prefix-tree micro-batches: every token computed once, no padding.

``packed``: a micro-batch is its sequences laid end to end in one stream, positions restarting at
each sequence, each attending to itself only. ``tree``: the micro-batch's sequences are merged into
a trie keyed by token id (and by the token's MoE routing, when the sample carries one: a node is
shared only where the routing is equal too), so the prompt a group's G samples share, or the
earlier turns of a multi-turn or agent-branch trajectory, is one run of stream tokens that every
branch attends to. The prefix structure is not stored anywhere: it is derived from the token ids.

Either way the per-token results (log-probs, entropy, the reference model's log-probs) are
gathered back into the padded per-sequence layout ``[B, S-1]`` of ``batching.collate``, so losses,
masks, advantages and rollout log-probs stay exactly what the padded path uses, per sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seer.trainer.attention import Block, StreamLayout
from seer.trainer.batching import MicroBatch, TrainSequence, collate


@dataclass
class Stream:
    """One micro-batch's tokens as computed: the packed or tree stream and where each row reads it."""

    input_ids: torch.Tensor  # [N] long
    layout: StreamLayout
    index: torch.Tensor  # [B, S-1] long: the stream token whose logits predict targets[b, j]
    last: torch.Tensor  # [B] long: the stream token of row b's last token (MoE: counted per sample token)

    @property
    def computed_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device) -> Stream:
        return Stream(self.input_ids.to(device), self.layout.to(device), self.index.to(device), self.last.to(device))

    @classmethod
    def empty(cls, device: torch.device) -> Stream:
        """No tokens and one row that reads nothing (``moe.dummy_micro_batch``'s): an EP rank with
        fewer micro-batches than its peers grows it by ``padded_to`` to forward as many tokens."""
        none = torch.zeros(0, dtype=torch.long, device=device)
        return cls(none, StreamLayout(none, []), torch.zeros(1, 1, dtype=torch.long, device=device),
                   torch.zeros(1, dtype=torch.long, device=device))

    def padded_to(self, n: int, pad_id: int) -> Stream:
        """This stream grown to `n` tokens by pad tokens in a block of their own (expert parallelism:
        every EP rank forwards as many tokens). The pad block attends only to itself, no real token
        attends to it, and no row reads it (``index`` and ``last`` stay): it trains nothing."""
        extra = n - self.computed_tokens
        if extra < 0:
            raise ValueError(f"a stream of {self.computed_tokens} tokens cannot be padded to {n}")
        if extra == 0:
            return self
        ids = torch.cat([self.input_ids, self.input_ids.new_full((extra,), pad_id)])
        positions = torch.cat([self.layout.positions, torch.arange(extra, device=self.layout.positions.device)])
        layout = StreamLayout(positions, [*self.layout.blocks, Block(self.computed_tokens, n)])
        return Stream(ids, layout, self.index, self.last)


@dataclass(frozen=True)
class CostModel:
    """Relative compute of a token (linear layers and LM head) and of one query-key pair (attention),
    in multiply-adds per layer stack: DP shards are balanced by this, so long sequences weigh more."""

    per_token: float = 1.0
    per_pair: float = 0.0

    @classmethod
    def for_arch(cls, arch) -> CostModel:
        h, q, kv = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        linear = arch.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * arch.intermediate_size)
        return cls(per_token=float(linear + h * arch.vocab_size), per_pair=float(arch.num_layers * 2 * q))

    def cost(self, new_tokens: int, context: int) -> float:
        """Tokens at positions context .. context+new_tokens-1, each attending to its whole prefix."""
        pairs = new_tokens * context + new_tokens * (new_tokens + 1) / 2
        return self.per_token * new_tokens + self.per_pair * pairs


def _keys(s: TrainSequence) -> list:
    """The trie key of each token: its id, with its MoE routing row when the sample has one (a
    routing one token short, as the engine leaves the last sampled token, keys that one by id only)."""
    tokens = list(s.prompt_ids) + list(s.response_ids)
    r = s.routing
    if r is None:
        return tokens
    width = len(r.data) // max(1, r.num_tokens)
    if r.num_tokens not in (len(tokens), len(tokens) - 1):
        raise ValueError(f"routing covers {r.num_tokens} tokens of a {len(tokens)}-token sequence")
    return [(t, r.data[i * width:(i + 1) * width]) for i, t in enumerate(tokens)]


def common_prefix(a: list, b: list) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _Node:
    __slots__ = ("token", "children", "idx")

    def __init__(self, token: int) -> None:
        self.token = token
        self.children: dict = {}
        self.idx = -1


def build_stream(seqs: list[TrainSequence], share: bool) -> tuple[torch.Tensor, StreamLayout, list[list[int]]]:
    """The stream of ``seqs`` (a trie when ``share``) -> (input_ids [N], layout, each sequence's
    stream index per token)."""
    ids: list[int] = []
    positions: list[int] = []
    blocks: list[Block] = []
    if not share:
        paths = []
        for s in seqs:
            start = len(ids)
            ids += list(s.prompt_ids) + list(s.response_ids)
            positions += range(len(ids) - start)
            blocks.append(Block(start, len(ids)))
            paths.append(list(range(start, len(ids))))
        return torch.tensor(ids, dtype=torch.long), StreamLayout(torch.tensor(positions, dtype=torch.long), blocks), paths

    root: dict = {}
    node_paths: list[list[_Node]] = []
    for s in seqs:
        children, path = root, []
        for key, token in zip(_keys(s), list(s.prompt_ids) + list(s.response_ids)):
            node = children.get(key)
            if node is None:
                node = children[key] = _Node(token)
            path.append(node)
            children = node.children
        node_paths.append(path)
    # Depth-first, a chain of single-child nodes is one block: contiguous in the stream.
    stack = [(child, [], 0) for child in reversed(list(root.values()))]
    while stack:
        node, context, depth = stack.pop()
        start = len(ids)
        while True:
            node.idx = len(ids)
            ids.append(node.token)
            positions.append(depth)
            depth += 1
            if len(node.children) != 1:
                break
            node = next(iter(node.children.values()))
        end = len(ids)
        blocks.append(Block(start, end, torch.tensor(context, dtype=torch.long) if context else None))
        if node.children:
            inner = context + list(range(start, end))
            stack.extend((child, inner, depth) for child in reversed(list(node.children.values())))
    paths = [[n.idx for n in path] for path in node_paths]
    return torch.tensor(ids, dtype=torch.long), StreamLayout(torch.tensor(positions, dtype=torch.long), blocks), paths


def collate_stream(seqs: list[TrainSequence], indices: list[int], share: bool, pad_id: int = 0) -> MicroBatch:
    """A MicroBatch whose per-sequence tensors are collate's and whose forward runs on a stream."""
    mb = collate(seqs, indices, pad_id)
    input_ids, layout, paths = build_stream(seqs, share)
    index = torch.zeros_like(mb.targets)
    for row, path in enumerate(paths):
        index[row, : len(path) - 1] = torch.tensor(path[:-1], dtype=torch.long)
    mb.stream = Stream(input_ids, layout, index, torch.tensor([path[-1] for path in paths], dtype=torch.long))
    if mb.routing is not None:
        # MoE routing replay: each stream token's experts, laid out like the forward's [1, N] input
        # (a trie node is shared only where the routing is equal, so every path writes the same rows)
        layers, k = mb.routing.shape[2:]
        routing = torch.arange(k, dtype=mb.routing.dtype).expand(input_ids.numel(), layers, k).clone()
        for row, path in enumerate(paths):
            routing[torch.tensor(path, dtype=torch.long)] = mb.routing[row, : len(path)]
        mb.routing = routing.unsqueeze(0)
    return mb


def tree_order(seqs: list[TrainSequence]) -> list[int]:
    """Indices sorted by token keys, so sequences sharing a prefix are neighbours."""
    keys = [_keys(s) for s in seqs]
    return sorted(range(len(seqs)), key=lambda i: ([k if isinstance(k, int) else k[0] for k in keys[i]], i))


def new_tokens_in_order(seqs: list[TrainSequence], order: list[int]) -> list[tuple[int, int]]:
    """(shared prefix with the previous sequence, length) for each sequence in ``order``: in a
    sorted order the trie grows by exactly length - shared for each one."""
    out, prev = [], None
    for i in order:
        k = _keys(seqs[i])
        out.append((common_prefix(prev, k) if prev is not None else 0, len(k)))
        prev = k
    return out


def split_mini_batches(seqs: list[TrainSequence], parts: int) -> list[list[int]]:
    """``parts`` mini-batches of sequence indices, each a contiguous run of the prefix-sorted order
    (so a group's samples, which share their prompt, stay together), balanced by tokens.

    Each cut goes where the two sides share the fewest tokens (between groups: a cut inside a group
    would compute its prompt in both mini-batches) among the boundaries whose running token count is
    within a quarter of a mini-batch of the even split, nearest that split among equals."""
    if parts <= 1 or len(seqs) <= 1:
        return [list(range(len(seqs)))]
    parts = min(parts, len(seqs))
    order = tree_order(seqs)
    shared = [s for s, _ in new_tokens_in_order(seqs, order)]
    cum = [0]
    for i in order:
        cum.append(cum[-1] + seqs[i].length)
    total, cuts = cum[-1], [0]
    for k in range(1, parts):
        target, slack = total * k / parts, total / parts / 4
        lo, hi = cuts[-1] + 1, len(order) - (parts - k)  # leave at least one sequence per mini-batch
        window = [j for j in range(lo, hi + 1) if abs(cum[j] - target) <= slack]
        if not window:
            window = [min(range(lo, hi + 1), key=lambda j: (abs(cum[j] - target), j))]
        cuts.append(min(window, key=lambda j: (shared[j], abs(cum[j] - target), j)))
    cuts.append(len(order))
    return [sorted(order[a:b]) for a, b in zip(cuts, cuts[1:])]


def plan_stream_micro_batches(seqs: list[TrainSequence], max_tokens: int, share: bool) -> list[list[int]]:
    """Groups of sequence indices whose stream (trie tokens, or real tokens when packed) stays within
    max_tokens; a sequence longer than that gets a micro-batch of its own."""
    if share:
        order = tree_order(seqs)
        growth = new_tokens_in_order(seqs, order)
    else:
        order = sorted(range(len(seqs)), key=lambda i: (-seqs[i].length, i))
        growth = [(0, seqs[i].length) for i in order]
    plans: list[list[int]] = []
    start = 0  # position in `order` where the current micro-batch begins
    used = 0
    for pos in range(len(order)):
        shared, length = growth[pos]
        if pos > start and used + length - shared <= max_tokens:
            used += length - shared
            continue
        if pos > start:
            # Cut where the least is shared (a group's boundary rather than inside the group, whose
            # prompt would then be computed twice); the run after the cut starts the next one.
            cut = min(range(start + 1, pos + 1), key=lambda j: (growth[j][0], -j))
            plans.append([order[j] for j in range(start, cut)])
            start = cut
            used = growth[start][1] + sum(growth[j][1] - growth[j][0] for j in range(start + 1, pos + 1))
            while used > max_tokens and pos > start:  # still too long: cut again, just before pos
                plans.append([order[j] for j in range(start, pos)])
                start, used = pos, growth[pos][1]
        else:
            used = length
    if order:
        plans.append([order[j] for j in range(start, len(order))])
    return plans


def make_stream_micro_batches(seqs: list[TrainSequence], max_tokens: int, share: bool,
                              pad_id: int = 0) -> list[MicroBatch]:
    return [collate_stream([seqs[i] for i in plan], plan, share, pad_id)
            for plan in plan_stream_micro_batches(seqs, max_tokens, share)]


def shard_streams(seqs: list[TrainSequence], parts: int, share: bool, cost: CostModel) -> list[list[int]]:
    """Split sequence indices into ``parts`` shards of about equal compute, attention included.

    Packed: longest (costliest) first onto the lightest shard. Tree: contiguous runs of the
    prefix-sorted order, cut where the running cost crosses each 1/parts, so a group's shared
    prompt stays on one rank wherever a cut does not fall inside it."""
    if parts == 1:
        return [list(range(len(seqs)))]
    if not share:
        costs = [cost.cost(s.length, 0) for s in seqs]
        loads = [0.0] * parts
        shards: list[list[int]] = [[] for _ in range(parts)]
        for i in sorted(range(len(seqs)), key=lambda i: (-costs[i], i)):
            k = min(range(parts), key=lambda k: (loads[k], k))
            shards[k].append(i)
            loads[k] += costs[i]
        return [sorted(s) for s in shards]
    order = tree_order(seqs)
    costs = [cost.cost(length - shared, shared) for shared, length in new_tokens_in_order(seqs, order)]
    total = sum(costs)
    shards = [[] for _ in range(parts)]
    run, k = 0.0, 0
    for i, c in zip(order, costs):
        # move on once this shard holds its share, leaving at least one sequence per later shard
        if k < parts - 1 and shards[k] and run + c / 2 > total * (k + 1) / parts:
            k += 1
        shards[k].append(i)
        run += c
    return [sorted(s) for s in shards]


def stream_token_stats(logits: torch.Tensor, stream: Stream, targets: torch.Tensor, temperature: float,
                       entropy: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sequence log-probs [B, S-1] (and entropy: None, "detached" or "grad") from stream logits
    [N, V]: each stream position is softmaxed once, however many branches read it."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    lse = torch.logsumexp(x, dim=-1)
    lp = x[stream.index, targets] - lse[stream.index]
    ent = None
    if entropy is not None:
        src = x if entropy == "grad" else x.detach()
        logp = torch.log_softmax(src, dim=-1)
        ent = (-(logp.exp() * logp).sum(-1))[stream.index]
    return lp, ent
