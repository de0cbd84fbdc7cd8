"""Tensor parallelism (issue 17): TP=2's logits, gradients and grad norm equal TP=1's.

The pure tests shard a full Megatron state and gather it back in one process (the "gather" is
``unshard`` over every rank's part). The distributed test runs 2 gloo processes at tp=2 on the
tiny checkpoints and compares with the same model at tp=1 built in the test process.

Tolerance (fp32): logits atol 1e-5, gradients atol 5e-6 (plus rtol 1e-4), grad norm rtol 1e-5.
TP only reorders sums (row-parallel all-reduce, per-rank attention heads); measured on these
models: logits <= 4e-6 off (|logits| <= 6), gradients <= 1.4e-6, grad norm <= 2e-7 relative.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from seer.trainer import tp_shard
from seer.trainer.hf_mapping import HFArch, _fuse_qkv, hf_to_megatron

TP = 2
MAX_NORM = 0.05  # small enough that clipping is active for the tiny models' grads
LOGITS_ATOL = 1e-5
GRAD_ATOL, GRAD_RTOL = 5e-6, 1e-4
NORM_RTOL = 1e-5
JOIN_TIMEOUT_S = 120.0


def _read(hf_dir: Path, vocab: int | None = None) -> tuple[HFArch, dict[str, torch.Tensor]]:
    """Arch and HF state of a tiny checkpoint, optionally cut to the first `vocab` tokens."""
    from seer.trainer.model import read_hf_state_dict

    arch, hf = HFArch.from_dir(hf_dir), read_hf_state_dict(hf_dir)
    if vocab is not None:
        arch = dataclasses.replace(arch, vocab_size=vocab)
        hf = {k: v[:vocab].clone() if k in ("model.embed_tokens.weight", "lm_head.weight") else v
              for k, v in hf.items()}
    return arch, hf


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 12), generator=g)
    return ids, torch.randint(0, vocab, (2, 12), generator=g)


def _run_case(arch: HFArch, hf: dict[str, torch.Tensor]) -> dict:
    """Forward, a cross-entropy backward, grad norm and clipping on the current parallel state."""
    from seer.trainer.model import build_gpt_model, forward_logits, load_hf_weights

    model = build_gpt_model(arch)
    load_hf_weights(model, hf, arch)
    ids, targets = _batch(arch.vocab_size)
    logits = forward_logits(model, ids)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    named = list(model.named_parameters())
    tp_shard.sum_partial_grads(named)  # QK-norm: each rank's grad covers its own heads only
    local = {n: p.detach().clone() for n, p in named}
    grads = tp_shard.gather_state({n: p.grad for n, p in named}, arch)
    norm = float(tp_shard.tp_grad_norm(named))
    clip_norm = tp_shard.clip_grad_norm_tp(named, MAX_NORM)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizer.step()
    names = tp_shard.optimizer_param_names(optimizer, model)
    return {
        "names": names, "adam_local": optimizer.state_dict(),
        "adam_full": tp_shard.gather_optimizer_state(optimizer.state_dict(), names, arch),
        "logits": logits.detach(), "loss": float(loss.detach()), "grads": grads, "norm": norm, "clip_norm": clip_norm,
        "clipped": tp_shard.gather_state({n: p.grad for n, p in named}, arch),
        "clipped_norm": float(tp_shard.tp_grad_norm(named)),
        "weights": tp_shard.gather_state(local, arch),
        "local_shapes": {n: tuple(t.shape) for n, t in local.items()},
        "marks": {n: bool(p.tensor_model_parallel) for n, p in named},
    }


CASES = ("qwen2", "llama_tied", "qwen2_vocab63", "qwen3_tied", "qwen2_pad")


def _pad_in_batch(vocab: int) -> int:
    """A pad_token_id that the batch uses and the second TP rank's vocab half holds."""
    return int(_batch(vocab)[0].max())


def _case_inputs(dirs: dict[str, Path]) -> dict[str, tuple[HFArch, dict[str, torch.Tensor]]]:
    qwen2 = _read(dirs["qwen2"])
    pad = dataclasses.replace(qwen2[0], pad_token_id=_pad_in_batch(qwen2[0].vocab_size))
    return {"qwen2": qwen2, "llama_tied": _read(dirs["llama_tied"]),
            "qwen2_vocab63": _read(dirs["qwen2"], vocab=63), "qwen3_tied": _read(dirs["qwen3_tied"]),
            "qwen2_pad": (pad, qwen2[1])}


def _tp_worker(rank: int, port: int, dirs: dict[str, Path], out_dir: Path) -> None:
    torch.set_num_threads(1)
    from seer.trainer.distributed import RankPlace, init_megatron

    init_megatron(0, RankPlace(rank, TP, f"tcp://127.0.0.5:{port}", tensor_parallel=TP, timeout_s=60.0))
    results = {}
    for case, (arch, hf) in _case_inputs(dirs).items():
        init_megatron(0, RankPlace(rank, TP, f"tcp://127.0.0.5:{port}", tensor_parallel=TP, timeout_s=60.0))
        results[case] = _run_case(arch, hf)
    torch.save(results, out_dir / f"rank{rank}.pt")


def _spawn_tp(dirs: dict[str, Path], out_dir: Path) -> list[dict]:
    """Run `_tp_worker` on TP ranks; a rank that hangs is killed and fails the test."""
    from seer.procs import free_port

    ctx = mp.spawn(_tp_worker, args=(free_port("127.0.0.5"), dirs, out_dir), nprocs=TP, join=False)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"TP ranks did not finish within {JOIN_TIMEOUT_S} s")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(TP)]


@pytest.fixture(scope="module")
def tp_results(tiny_qwen2, tiny_llama_tied, tiny_qwen3_tied, tmp_path_factory) -> tuple[dict, list[dict]]:
    """(TP=1 results in this process, [TP=2 results of each rank])."""
    from seer.trainer.distributed import init_megatron

    dirs = {"qwen2": tiny_qwen2, "llama_tied": tiny_llama_tied, "qwen3_tied": tiny_qwen3_tied}
    tp2 = _spawn_tp(dirs, tmp_path_factory.mktemp("tp2"))
    ref = {}
    for case, (arch, hf) in _case_inputs(dirs).items():
        init_megatron(0)
        ref[case] = _run_case(arch, hf)
    return ref, tp2


# ---- pure sharding ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_shard_then_gather_is_identity(case, tiny_qwen2, tiny_llama_tied, tiny_qwen3_tied):
    arch, hf = _case_inputs({"qwen2": tiny_qwen2, "llama_tied": tiny_llama_tied, "qwen3_tied": tiny_qwen3_tied})[case]
    full = hf_to_megatron(hf, arch)
    shards = [tp_shard.shard_state(full, arch, r, TP) for r in range(TP)]
    for name, t in full.items():
        parts = [s[name] for s in shards]
        assert torch.equal(tp_shard.unshard(name, parts, arch), t), name
        if tp_shard.is_tp_sharded(name):
            assert len({p.shape for p in parts}) == 1, name
            dim = tp_shard.split_dim(name)
            vocab_rows = tp_shard.split_of(name) is tp_shard.Split.VOCAB
            size = tp_shard.padded_vocab_size(arch.vocab_size, TP) if vocab_rows else t.shape[dim]
            assert parts[0].shape[dim] * TP == size, name
        else:
            assert all(p is t for p in parts), name
    # optimizer state has the parameter's shape: it reshards full -> tp=2 -> full -> tp=1 alike
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    exp_avg = torch.randn_like(full[name])
    regathered = tp_shard.unshard(name, [tp_shard.shard_like(name, exp_avg, arch, r, TP) for r in range(TP)], arch)
    assert torch.equal(tp_shard.shard_like(name, regathered, arch, 0, 1), exp_avg)


def test_vocab_padding_is_zero_rows(tiny_qwen2):
    arch, hf = _read(tiny_qwen2, vocab=63)
    full = hf_to_megatron(hf, arch)
    assert tp_shard.padded_vocab_size(63, TP) == 64 and tp_shard.padded_vocab_size(64, TP) == 64
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        last = tp_shard.shard_state(full, arch, TP - 1, TP)[name]
        assert last.shape == (32, arch.hidden_size)
        assert torch.equal(last[-1], torch.zeros(arch.hidden_size))
        assert torch.equal(last[:-1], full[name][32:])


def test_each_rank_holds_whole_kv_groups_and_gated_halves(tiny_qwen2):
    arch, hf = _read(tiny_qwen2)
    full = hf_to_megatron(hf, arch)
    g, hpg, d = arch.num_kv_heads // TP, arch.heads_per_group, arch.head_dim
    local_arch = dataclasses.replace(arch, num_heads=arch.num_heads // TP, num_kv_heads=g)
    a, m = "model.layers.1.", "decoder.layers.1."
    for r in range(TP):
        shard = tp_shard.shard_state(full, arch, r, TP)
        for kind in ("weight", "bias"):
            q, k, v = (hf[f"{a}self_attn.{p}_proj.{kind}"] for p in "qkv")
            expect = _fuse_qkv(q[r * g * hpg * d:(r + 1) * g * hpg * d], k[r * g * d:(r + 1) * g * d],
                               v[r * g * d:(r + 1) * g * d], local_arch)
            assert torch.equal(shard[f"{m}self_attention.linear_qkv.{kind}"], expect)
        ffn, heads = slice(r * arch.intermediate_size // TP, (r + 1) * arch.intermediate_size // TP), g * hpg
        gate, up = hf[f"{a}mlp.gate_proj.weight"], hf[f"{a}mlp.up_proj.weight"]
        assert torch.equal(shard[f"{m}mlp.linear_fc1.weight"], torch.cat([gate[ffn], up[ffn]]))
        assert torch.equal(shard[f"{m}mlp.linear_fc2.weight"], hf[f"{a}mlp.down_proj.weight"][:, ffn])
        assert torch.equal(shard[f"{m}self_attention.linear_proj.weight"],
                           hf[f"{a}self_attn.o_proj.weight"][:, r * heads * d:(r + 1) * heads * d])


def test_layout_errors_are_clear(tiny_qwen2):
    arch = HFArch.from_dir(tiny_qwen2)  # 2 KV heads
    full = hf_to_megatron(_read(tiny_qwen2)[1], arch)
    with pytest.raises(ValueError, match="num_kv_heads"):
        tp_shard.shard_state(full, arch, 0, 4)
    with pytest.raises(KeyError, match="no tensor-parallel layout"):
        tp_shard.split_of("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight")


# ---- 2 gloo processes at tp=2 ----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_tp2_matches_tp1(case, tp_results, tiny_qwen2, tiny_llama_tied, tiny_qwen3_tied):
    ref, tp2 = tp_results
    ref, ranks = ref[case], [r[case] for r in tp2]
    arch, hf = _case_inputs({"qwen2": tiny_qwen2, "llama_tied": tiny_llama_tied, "qwen3_tied": tiny_qwen3_tied})[case]
    full = hf_to_megatron(hf, arch)
    assert ref["logits"].shape[-1] == arch.vocab_size
    if arch.pad_token_id is not None:  # config.pad_token_id: its row gets no gradient, the rest is unchanged
        pad, emb = arch.pad_token_id, "embedding.word_embeddings.weight"
        assert pad >= arch.vocab_size // TP  # the second rank's vocab half holds it
        plain = tp_results[0]["qwen2"]["grads"]
        assert plain[emb][pad].abs().max() > 0 and ref["grads"][emb][pad].abs().max() == 0
        for rank_result in ranks:
            assert rank_result["grads"][emb][pad].abs().max() == 0
        for name, g in plain.items():
            rows = torch.arange(g.shape[0]) != pad if name == emb else slice(None)
            torch.testing.assert_close(ref["grads"][name][rows], g[rows], atol=0, rtol=0, msg=name)
    for rank, got in enumerate(ranks):
        # the model each rank built holds exactly its shard_state shapes, and Megatron's TP marks
        assert got["local_shapes"] == {n: tuple(t.shape) for n, t in tp_shard.shard_state(full, arch, rank, TP).items()}
        assert got["marks"] == {n: tp_shard.is_tp_sharded(n) for n in full}
        # the real all_gather of the loaded shards gives the full state back, exactly
        assert got["weights"].keys() == full.keys()
        for name, t in full.items():
            assert torch.equal(got["weights"][name], t), name
        assert got["logits"].shape == ref["logits"].shape
        torch.testing.assert_close(got["logits"], ref["logits"], atol=LOGITS_ATOL, rtol=0)
        assert got["grads"].keys() == ref["grads"].keys()
        for name, g in ref["grads"].items():
            torch.testing.assert_close(got["grads"][name], g, atol=GRAD_ATOL, rtol=GRAD_RTOL, msg=name)
        torch_norm = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in ref["grads"].values()])))
        assert got["norm"] == pytest.approx(ref["norm"], rel=NORM_RTOL) == pytest.approx(torch_norm, rel=NORM_RTOL)
        # clipping: the same coefficient on every rank, so the clipped grads are TP=1's clipped grads
        assert got["clip_norm"] == pytest.approx(got["norm"]) and got["norm"] > MAX_NORM
        assert got["clipped_norm"] == pytest.approx(MAX_NORM, rel=NORM_RTOL)
        for name, g in ref["clipped"].items():
            torch.testing.assert_close(got["clipped"][name], g, atol=GRAD_ATOL, rtol=GRAD_RTOL, msg=name)
        # Adam's moments gathered full equal TP=1's, and reshard exactly to what this rank holds
        assert got["names"] == ref["names"] and sorted(got["names"]) == sorted(full)
        full_adam, local_adam = got["adam_full"]["state"], got["adam_local"]["state"]
        assert full_adam.keys() == ref["adam_full"]["state"].keys() == set(range(len(full)))
        for idx, entry in ref["adam_full"]["state"].items():
            assert entry["exp_avg"].shape == full[ref["names"][idx]].shape
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(full_adam[idx][key], entry[key], atol=GRAD_ATOL, rtol=GRAD_RTOL)
        resharded = tp_shard.shard_optimizer_state(got["adam_full"], got["names"], arch, rank, TP)["state"]
        for idx, entry in local_adam.items():
            assert resharded[idx].keys() == entry.keys()
            for key, value in entry.items():
                assert torch.equal(resharded[idx][key], value), (got["names"][idx], key)


def test_tp1_clip_matches_torch(tiny_qwen2):
    """clip_grad_norm_tp at tp=1 is torch.nn.utils.clip_grad_norm_ (the Trainer's current clip)."""
    from seer.trainer.distributed import init_megatron
    from seer.trainer.model import build_gpt_model, load_hf_weights

    init_megatron(0)
    arch, hf = _read(tiny_qwen2)
    models = []
    for _ in range(2):
        model = build_gpt_model(arch)
        load_hf_weights(model, hf, arch)
        ids, targets = _batch(arch.vocab_size)
        from seer.trainer.model import forward_logits

        torch.nn.functional.cross_entropy(forward_logits(model, ids).reshape(-1, arch.vocab_size),
                                          targets.reshape(-1)).backward()
        models.append(model)
    ours = tp_shard.clip_grad_norm_tp(models[0].named_parameters(), MAX_NORM)
    theirs = float(torch.nn.utils.clip_grad_norm_(models[1].parameters(), MAX_NORM))
    assert ours == pytest.approx(theirs, rel=1e-6)
    for pa, pb in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-9, rtol=1e-6)
