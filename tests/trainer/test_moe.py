"""Qwen3-MoE in the Megatron trainer: the HF mapping is exact, the network is transformers' (router,
experts, QK-norm, dense layers between sparse ones), the router computes in float32, the
load-balancing loss is configurable, and routing replay (R3) makes every router, the KL
reference model's included, use the rollout's experts."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from seer.trainer.batching import TrainSequence
from seer.trainer.config import TrainerConfig
from seer.trainer.hf_mapping import HFArch
from seer.trainer.model import build_gpt_model, forward_logits, load_hf_weights, megatron_weights_as_hf, read_hf_state_dict
from seer.trainer.routing import padded_routing, routing_from_tensor, routing_tensor
from tests.trainer.conftest import make_tiny_moe


def _megatron(hf_dir, dtype=torch.float32, **kw):
    from seer.trainer.distributed import init_megatron

    init_megatron(0)
    arch = HFArch.from_dir(hf_dir)
    model = build_gpt_model(arch, dtype, **kw)
    load_hf_weights(model, read_hf_state_dict(hf_dir), arch)
    return arch, model.eval()


@pytest.mark.parametrize("norm_topk_prob,mlp_only_layers", [(True, ()), (False, (1,))])
def test_qwen3_moe_round_trip_is_exact_and_logits_equal_transformers(tmp_path, norm_topk_prob, mlp_only_layers):
    import transformers

    hf_dir = make_tiny_moe(tmp_path / "ckpt", seed=5, norm_topk_prob=norm_topk_prob, mlp_only_layers=mlp_only_layers)
    arch, model = _megatron(hf_dir)
    assert arch.moe.layers == ((0,) if mlp_only_layers else (0, 1)) and arch.qk_norm
    hf = read_hf_state_dict(hf_dir)
    back = megatron_weights_as_hf(model, arch)
    assert back.keys() == hf.keys()  # router gate, every expert's gate/up/down, q/k norms
    assert all(torch.equal(back[k], hf[k]) for k in hf)
    ref = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = forward_logits(model, ids), ref(ids).logits
    assert (ours - theirs).abs().max() < 1e-5


def test_unsupported_moe_features_are_refused(tmp_path):
    import json

    hf_dir = make_tiny_moe(tmp_path / "ckpt")
    cfg = json.loads((hf_dir / "config.json").read_text())
    with pytest.raises(NotImplementedError, match="shared experts"):
        HFArch.from_config({**cfg, "shared_expert_intermediate_size": 64})
    from seer.trainer.moe import check_parallel

    with pytest.raises(NotImplementedError, match="tensor_parallel > 1 with an MoE model"):
        check_parallel(HFArch.from_config(cfg).moe, 2, 1)
    with pytest.raises(ValueError, match="must divide num_experts"):
        check_parallel(HFArch.from_config(cfg).moe, 1, 3)


def test_router_computes_in_float32_under_bf16_weights(tiny_moe):
    from seer.trainer import moe

    _, model = _megatron(tiny_moe, torch.bfloat16)
    seen = []
    hooks = [r.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o[0].dtype))) for r in moe.routers(model)]
    with torch.no_grad():
        forward_logits(model, torch.randint(0, 64, (1, 5)))
    for h in hooks:
        h.remove()
    assert seen == [(torch.bfloat16, torch.float32)] * 2  # bf16 hidden states in, float32 routing out


def test_routing_bytes_are_gathered_like_input_ids():
    """Row b, position j of the padded layout holds token j of sequence b; padding and a routing one
    token short (the last sampled token never ran through the engine) get valid filler ids."""
    a = torch.randint(0, 8, (5, 2, 2))
    b = torch.randint(0, 8, (2, 2, 2))  # a 3-token sequence whose routing stops one token short
    grid = padded_routing([routing_from_tensor(a, 8), routing_from_tensor(b, 8)], [5, 3], 6, 2, 2)
    assert torch.equal(grid[0, :5], a) and torch.equal(grid[1, :2], b)
    assert torch.equal(grid[1, 2:], torch.arange(2).expand(4, 2, 2))
    assert torch.equal(routing_tensor(routing_from_tensor(a, 300)), a)  # uint16 beyond 256 experts
    with pytest.raises(ValueError, match="covers 1 tokens of 3"):
        padded_routing([routing_from_tensor(b[:1], 8)], [3], 3, 2, 2)


# ---- the trainer: routing replay, metrics, the load-balancing loss ---------------------------------


def _seqs() -> list[TrainSequence]:
    g = torch.Generator().manual_seed(1)
    out = []
    for p, r, adv in ((4, 6, 1.0), (3, 2, -1.0), (5, 9, 0.5)):
        ids = torch.randint(1, 64, (p + r,), generator=g).tolist()
        out.append(TrainSequence(ids[:p], ids[p:], advantage=adv))
    return out


def _record(model):
    """Capture each router's routing map ([S*B, E] bool) per forward."""
    from seer.trainer import moe

    maps: list[torch.Tensor] = []
    hooks = [r.register_forward_hook(lambda m, i, o: maps.append(o[1].detach().clone())) for r in moe.routers(model)]
    return maps, hooks


def _own_routing(model, seq: TrainSequence) -> torch.Tensor:
    """[tokens, layers, top_k] experts the model's routers choose for `seq` by themselves."""
    maps, hooks = _record(model)
    with torch.no_grad():
        forward_logits(model, torch.tensor([seq.prompt_ids + seq.response_ids]))
    for h in hooks:
        h.remove()
    return torch.stack([m.float().topk(2, dim=-1).indices.sort(-1).values for m in maps], dim=1)


def _other_experts(own: torch.Tensor, num_experts: int = 8) -> torch.Tensor:
    """For every token and layer, two experts the router did not choose."""
    out = torch.empty_like(own)
    for idx in itertools.product(*map(range, own.shape[:2])):
        out[idx] = torch.tensor([e for e in range(num_experts) if e not in own[idx].tolist()][:2])
    return out


def test_routing_replay_uses_the_rollouts_experts_in_policy_and_reference(tiny_moe):
    from seer.trainer.trainer import Trainer

    # the padded layout (the packed and tree layouts are checked against it below)
    trainer = Trainer(tiny_moe, TrainerConfig(lr=1e-3, kl_coef=0.1, routing_replay=True, batch_layout="padded"))
    seqs = _seqs()
    own = [_own_routing(trainer.model, s) for s in seqs]
    other = [_other_experts(o) for o in own]
    # the engine's routing of the last sampled token is not needed (never computed there)
    given = [other[0][:-1], other[1], other[2]]
    replayed = [TrainSequence(s.prompt_ids, s.response_ids, s.advantage, routing=routing_from_tensor(r, 8))
                for s, r in zip(seqs, given)]
    same = [TrainSequence(s.prompt_ids, s.response_ids, s.advantage, routing=routing_from_tensor(r, 8))
            for s, r in zip(seqs, own)]

    (mb,) = trainer._micro_batches(replayed)  # one padded micro-batch: rows of different lengths
    for model in (trainer.model, trainer.ref_model):
        maps, hooks = _record(model)
        with torch.no_grad():
            trainer._token_logprobs(model, mb)
        for h in hooks:
            h.remove()
        width = mb.input_ids.shape[1]
        for layer, routing_map in enumerate(maps):
            chosen = routing_map.view(width, len(seqs), 8)  # Megatron's s-major token order
            for row, i in enumerate(mb.indices):
                for j in range(len(given[i])):  # every real token with a given routing
                    assert sorted(chosen[j, row].nonzero().flatten().tolist()) == sorted(given[i][j, layer].tolist())

    # replaying the router's own choice changes nothing; replaying other experts changes the log-probs
    free = [forward_logits(trainer.model.eval(), torch.tensor([s.prompt_ids + s.response_ids]))[0] for s in seqs]
    (mb_same,) = trainer._micro_batches(same)
    with torch.no_grad():
        lp_same = trainer._token_logprobs(trainer.model, mb_same)
        lp_other = trainer._token_logprobs(trainer.model, mb)
    from seer.trainer import losses

    for row, i in enumerate(mb_same.indices):
        n = seqs[i].length
        lp_free = losses.token_logprobs(free[i][None, :-1], mb_same.targets[row: row + 1, : n - 1], 1.0)[0]
        assert torch.allclose(lp_same[row, : n - 1], lp_free, atol=1e-5)
    real = mb.mask.bool()
    assert (lp_other[real] - lp_same[real]).abs().max() > 1e-2

    # a training step replays too (the gradient forward and the reference's): the expert load it
    # reports is exactly the given routing's
    metrics = trainer.train_sequences(replayed)
    counts = torch.zeros(2, 8)
    for s, g in zip(seqs, given):
        for layer in range(2):
            counts[layer] += torch.bincount(g[:, layer].flatten(), minlength=8)
        # the last token of sequence 0 has filler ids 0, 1 (not in `given`): count them as routed
    counts[:, :2] += 1
    expected = counts / counts.sum(1, keepdim=True)
    assert torch.allclose(torch.tensor(metrics.extra["moe_expert_load"]), expected, atol=1e-4)
    assert metrics.kl >= 0.0 and math.isfinite(metrics.loss)
    record = metrics.record()
    assert 0.0 < record["moe_router_entropy"] <= math.log(8) and record["moe_load_max"] >= 1.0

    with pytest.raises(ValueError, match="has no routing"):
        trainer.train_sequences(seqs)


def test_load_balancing_loss_is_off_by_default_and_configurable(tiny_moe):
    from seer.trainer.trainer import Trainer

    seqs = _seqs()
    grads = {}
    for coef in (0.0, 0.5):
        trainer = Trainer(tiny_moe, TrainerConfig(lr=0.0, moe_aux_loss_coef=coef))
        trainer.captured_grads = []
        trainer.train_sequences(seqs)
        grads[coef] = trainer.captured_grads[0]
    assert TrainerConfig().moe_aux_loss_coef == 0.0
    router = "decoder.layers.0.mlp.router.weight"
    assert (grads[0.5][router] - grads[0.0][router]).abs().max() > 1e-4  # the aux loss reaches the router
    # ... and flows back only through the routers' inputs: the last layer's experts come after it
    last = [n for n in grads[0.0] if n.startswith("decoder.layers.1.mlp.experts.")]
    assert any(grads[0.0][n].abs().max() > 0 for n in last)
    assert all(torch.allclose(grads[0.5][n], grads[0.0][n], atol=1e-7) for n in last)


# ---- the routing-difference metrics; replay in the packed and tree layouts -------------------------


def _with_routing(seqs, routings):
    return [TrainSequence(s.prompt_ids, s.response_ids, s.advantage, routing=routing_from_tensor(r, 8))
            for s, r in zip(seqs, routings)]


def _group_seqs() -> list[TrainSequence]:
    """Two samples sharing a prompt (a tree shares it) and the three of ``_seqs``."""
    prompt = [3, 9, 27, 17, 51]
    return [TrainSequence(prompt, [5, 6, 7, 8], 1.0), TrainSequence(prompt, [5, 6, 40], -1.0), *_seqs()]


@pytest.mark.parametrize("replay", [True, False])
def test_routing_differ_metrics_are_the_share_of_trained_tokens_the_trainers_router_routes_elsewhere(tiny_moe, replay):
    """``moe_routing_differ_tokens`` / ``_decisions`` compare the trainer's own top-k with the
    rollout's experts on every token whose output the trainer reads (each sequence's last token is
    not one), before replay overrides the choice, in every layout. Given the router's own routing
    they are 0; with chosen tokens' experts swapped for others, exactly the swapped share."""
    from seer.trainer.trainer import Trainer

    trainer = Trainer(tiny_moe, TrainerConfig(lr=0.0, routing_replay=replay))
    seqs = _group_seqs()
    own = [_own_routing(trainer.model, s) for s in seqs]
    # Swap the experts of every third token (and every last token, which is not counted). With
    # replay on, only the last MoE layer: the swapped experts then change no router's input, so the
    # trainer's own choices stay the free-running ones. Without replay, layer 0 on some tokens too.
    perturbed, swapped_tokens, swapped_decisions = [], 0, 0
    for r in own:
        other, p = _other_experts(r), r.clone()
        n = len(r)
        for j in range(n):
            layers = [1] if replay or j % 2 else [0, 1]
            if j % 3 == 0 or j == n - 1:
                for layer in layers:
                    p[j, layer] = other[j, layer]
                if j < n - 1:
                    swapped_tokens += 1
                    swapped_decisions += len(layers)
        perturbed.append(p)
    read = sum(s.length - 1 for s in seqs)
    for layout in ("padded", "packed", "tree"):
        trainer.config.batch_layout = layout
        same = trainer.train_sequences(_with_routing(seqs, own)).record()
        assert same["moe_routing_differ_tokens"] == 0 and same["moe_routing_differ_decisions"] == 0, layout
        rec = trainer.train_sequences(_with_routing(seqs, perturbed)).record()
        assert rec["moe_routing_differ_tokens"] == pytest.approx(swapped_tokens / read, abs=1e-12), layout
        assert rec["moe_routing_differ_decisions"] == pytest.approx(swapped_decisions / (2 * read), abs=1e-12), layout
    # Two mini-batches, a large step between them: the second is compared on the weights that
    # sampled (its pre-update forward), not on the updated ones, which route otherwise.
    trainer.config.mini_batches = 2
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.1
    rec = trainer.train_sequences(_with_routing(seqs, own)).record()
    assert rec["moe_routing_differ_tokens"] == 0 and rec["grad_norm"] > 0
    assert trainer.train_sequences(_with_routing(seqs, own)).record()["moe_routing_differ_tokens"] > 0.05  # moved
    trainer.config.mini_batches = 1
    if not replay:  # samples without routing: no such metric (with replay on they are refused)
        assert "moe_routing_differ_tokens" not in trainer.train_sequences(seqs).record()


def _prefix_routing(seq: TrainSequence, layers: int = 2, experts: int = 8) -> torch.Tensor:
    """Routing that depends on each token's prefix only (as an engine's does): equal prefixes of
    different samples get equal rows, so a tree shares them. Not the router's own choice."""
    import random

    tokens = seq.prompt_ids + seq.response_ids
    rows = []
    for j in range(len(tokens)):
        rng = random.Random(hash(tuple(tokens[: j + 1])))
        rows.append([rng.sample(range(experts), 2) for _ in range(layers)])
    return torch.tensor(rows)


def test_moe_with_routing_replay_trains_packed_and_tree_with_the_padded_gradients(tiny_moe, tmp_path):
    """An MoE model trains in the default tree layout (and packed) with routing replay and a KL
    reference model: gradients, losses and router metrics equal the padded path's; the experts its
    routers used (trainer.routing_record_dir) are the given routing's for every trained token."""
    from seer.trainer.trainer import Trainer
    from tests.trainer.test_packing import ATOL, RTOL, _step, group_seqs

    trainer = Trainer(tiny_moe, TrainerConfig(lr=1e-2, kl_coef=0.05, entropy_coef=0.01, max_tokens_per_micro_batch=48,
                                              routing_replay=True))
    assert trainer.config.batch_layout == "tree"
    plain = group_seqs(2)
    seqs = _with_routing(plain, [_prefix_routing(s) for s in plain])
    m0, g0 = _step(trainer, seqs, "padded", "token-mean")
    for layout in ("packed", "tree"):
        m, g = _step(trainer, seqs, layout, "token-mean")
        assert m.extra["batch_layout"] == layout
        for name in g0:
            diff = (g[name] - g0[name]).abs()
            assert bool((diff <= ATOL + RTOL * g0[name].abs()).all()), f"{layout} {name}: {float(diff.max()):.3g}"
        for field in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
            assert getattr(m, field) == pytest.approx(getattr(m0, field), rel=1e-5, abs=1e-6), (layout, field)
        for key in ("moe_router_entropy", "moe_load_max", "moe_routing_differ_tokens", "moe_routing_differ_decisions"):
            assert m.extra[key] == pytest.approx(m0.extra[key], rel=1e-6, abs=1e-9), (layout, key)
        torch.testing.assert_close(torch.tensor(m.extra["moe_expert_load"]), torch.tensor(m0.extra["moe_expert_load"]))
    assert m.extra["tree_token_ratio"] < m0.extra["tree_token_ratio"]  # the tree shared the prompts
    trainer.config.routing_record_dir = str(tmp_path)
    try:
        _step(trainer, seqs, "tree", "token-mean")
    finally:
        trainer.config.routing_record_dir = None
    import json

    rows = [json.loads(x) for x in (tmp_path / "routing_used_0001_0.jsonl").read_text().splitlines()]
    assert sorted((r["prompt_ids"], r["response_ids"]) for r in rows) == sorted((s.prompt_ids, s.response_ids)
                                                                              for s in seqs)
    for r in rows:
        n = len(r["prompt_ids"]) + len(r["response_ids"]) - 1
        assert r["batch_layout"] == "tree" and len(r["used"]) == n and r["used"] == r["rollout"]
    # the replay is what the gradients follow: the router's own routing gives other gradients
    m_free, g_free = _step(trainer, _with_routing(plain, [_own_routing(trainer.model, s) for s in plain]), "tree",
                           "token-mean")
    assert m0.extra["moe_routing_differ_tokens"] > 0.5 and m_free.extra["moe_routing_differ_tokens"] == 0
    assert max(float((g_free[n] - g0[n]).abs().max()) for n in g0) > 1e-3
