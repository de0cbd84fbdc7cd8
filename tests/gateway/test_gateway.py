"""The gateway on the real scheduler driver, HTTP server and `openai` client, with a scripted engine
in place of vLLM (the engine writes the calculator's calls from the context it is given, so every
run is deterministic): token-exact sessions against the Environment path, branches, bad calls, a
client that goes away, streaming. Real instances and the KV pool: tests/kvpool/test_gateway_run.py."""

from __future__ import annotations

import dataclasses

import asyncio
import re
import time

import pytest

from seer.model.chat import ChatFormatError, EmbeddedChat, max_token_chars
from seer.model.tokenizer import build_tokenizer
from seer.rollout.agents import AgentConfig, AgentRunner, AgentSpec
from seer.rollout.base import RolloutContext, RolloutRequest
from seer.rollout.gateway import Gateway, GatewayLimits, GatewayServer, gateway_rollout
from seer.rollout.multi_turn import multi_turn_rollout
from seer.scheduler import SchedulerConfig
from seer.tasks.calculator import PROMPT_TEMPLATE
from seer.tasks.env import EnvConfig, EnvRunner
from seer.tasks.reward import RewardRunner
from seer.types import GenerateRequest, GenerateResult, PromptSpec, SamplingParams, Telemetry
from tests.gateway import agents_for_tests as agents

pytestmark = pytest.mark.timeout(120)
TOK = build_tokenizer(4096)
EOS = TOK.eos_token_id
AGENTS = "tests.gateway.agents_for_tests"


def encode(text: str) -> list[int]:
    return list(TOK(text, add_special_tokens=False)["input_ids"])


def lp_at(pos: int) -> float:
    """The scripted engine's log-prob of the token at context position `pos`: where a token was generated."""
    return -pos / 1000


class CalcEngine:
    """Writes `<calc>LEFT-D</calc>` after every line that ends in a number, EOS once it reaches 0."""

    def __init__(self, name: str, delay_s: float = 0.0):
        self.name, self.delay_s = name, delay_s
        self.running, self.aborted, self.prompts = 0, [], []

    def intended(self, text: str) -> str | None:
        last = re.findall(r"=(\d+)\n", text)
        left = int(last[-1]) if last else int(re.findall(r"start=(\d+)", text)[-1])
        if left == 0:
            return None  # EOS
        return f"<calc>{left:04d}-{1 + left % min(left, 7) if left > 1 else 1}</calc>"

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        self.running += 1
        self.prompts.append(list(req.prompt_ids))
        try:
            text = TOK.decode(req.prompt_ids, skip_special_tokens=False)
            if self.delay_s and "</calc>" not in text:  # slow on a session's first turn only
                await asyncio.sleep(self.delay_s)
            line = text[text.rfind("\n") + 1:]
            want = self.intended(text)
            n = len(req.prompt_ids)
            if want is None:
                out, reason = [EOS], "stop"
            else:
                rest = encode(want[len(line):] if want.startswith(line) else want)
                out = rest[:req.max_tokens]
                reason = "stop" if out == rest and any(want.endswith(s) for s in req.stop) else "length"
            now = time.time()
            return GenerateResult(req.request_id, out, [lp_at(n + i) for i in range(len(out))], reason, 0, n,
                                  self.name, now, now)
        finally:
            self.running -= 1

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def telemetry(self) -> Telemetry:
        return Telemetry(self.name, time.monotonic(), 0.0, 100_000, self.running, 0, 0, block_size=1)


def calc_prompts(totals: list[int]) -> list[PromptSpec]:
    out = []
    for i, t in enumerate(totals):
        text = PROMPT_TEMPLATE.format(total=f"{t:04d}")
        out.append(PromptSpec(i, text, encode(text), {"total": t, "steps": 3, "width": 4}))
    return out


def scheduler(chunk: int = 5) -> SchedulerConfig:
    return SchedulerConfig(policy="context", chunk_size=chunk, kv_pool=False, telemetry_interval_s=0.05)


async def run_gateway(agent: str, prompts, *, group_size=2, engines=None, limits=None, iterations=1, tokenize=encode):
    """`agent`'s sessions of `prompts` through the gateway as seer-run serves it (its limits from the
    tokenizer; `tokenize`: the gateway's encode)."""
    engines = engines or [CalcEngine("e0"), CalcEngine("e1")]
    gw = Gateway(EmbeddedChat(TOK.eos_token), tokenize, lambda ids: TOK.decode(ids, skip_special_tokens=False),
                 lambda ids: TOK.decode(ids, skip_special_tokens=True), TOK.eos_token, agents.MODEL,
                 limits or GatewayLimits(max_call_tokens=64, max_context_tokens=4096, max_token_chars=max_token_chars(TOK)))
    server = GatewayServer(gw, "127.0.0.1")
    await server.start()
    # loop mode: bad_calls_agent records into this module, which a forked session process could not
    runner = AgentRunner(AgentSpec.parse(f"{AGENTS}:{agent}", 60.0, cfg=AgentConfig(mode="loop")), 8)
    batches = []
    try:
        for it in range(iterations):
            ctx = RolloutContext(engines, scheduler(), RewardRunner("seer.tasks.calculator:score"),
                                 decode=lambda ids: TOK.decode(ids, skip_special_tokens=True), encode=encode,
                                 gateway=gw, agents=runner)
            batches.append(await gateway_rollout(ctx, RolloutRequest(it, prompts, group_size, SamplingParams(
                temperature=1.0, max_tokens=64))))
        return batches, gw, engines
    finally:
        await server.close()


def test_the_calculator_through_the_gateway_gives_the_environment_paths_tokens_and_masks():
    prompts = calc_prompts([9, 13])

    async def env_path():
        env = EnvRunner("calculator", EnvConfig(mode="thread", workers=4), {"latency_median_s": 0.0})
        try:
            ctx = RolloutContext([CalcEngine("e0"), CalcEngine("e1")], scheduler(), RewardRunner("seer.tasks.env:zero_reward"),
                                 env=env, decode=lambda ids: TOK.decode(ids, skip_special_tokens=True), encode=encode)
            return await multi_turn_rollout(ctx, RolloutRequest(0, prompts, 2, SamplingParams(max_tokens=256)))
        finally:
            env.close()

    env_batch = asyncio.run(env_path())
    (gw_batch,), gw, _ = asyncio.run(run_gateway("calc_agent", prompts))
    assert len(gw_batch.samples) == len(env_batch.samples) == 4
    for e, g in zip(env_batch.samples, gw_batch.samples, strict=True):
        assert g.prompt.prompt_ids == e.prompt.prompt_ids == encode(e.prompt.text)
        assert g.response_ids == e.response_ids and g.loss_mask == e.loss_mask and g.logprobs == e.logprobs
        assert g.turns == e.turns >= 3 and g.reward == e.reward == 1.0
        assert g.branch is not None and g.branch.path == tuple(range(g.turns))
    assert gw_batch.stats.extra["gateway_branches"] == 0 and gw.counters["errors"] == 0
    # the agents ran on this loop and took the runner's http_client: every call skipped the socket
    assert gw.counters["in_process"] == gw.counters["calls"] > 0


def test_streamed_calls_give_the_same_session_as_plain_ones():
    prompts = calc_prompts([11])
    (plain,), _, _ = asyncio.run(run_gateway("calc_agent", prompts, group_size=1))
    (streamed,), _, _ = asyncio.run(run_gateway("streaming_calc_agent", prompts, group_size=1))
    assert streamed.samples[0].response_ids == plain.samples[0].response_ids
    assert streamed.samples[0].reward == 1.0


class TalkEngine(CalcEngine):
    """Says SAID and calls the calculator, then (after the tool's answer) says DONE. With `gated`, a
    turn's chunk after its first waits (up to 30 s) until the agent has received some of the turn's
    content: a turn can only finish promptly if its content streams out while it is generated."""

    SAID, CALL, DONE = "let me think about it ", "<calc>0009-4</calc>", "all done"

    def __init__(self, name: str, gated: bool):
        super().__init__(name)
        self.gated, self.waited_out = gated, 0

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        text = TOK.decode(req.prompt_ids, skip_special_tokens=False)
        want = self.DONE if "</calc>=" in text else self.SAID + self.CALL
        done = next((k for k in range(len(want), 1, -1) if text.endswith(want[:k])), 0)
        if self.gated and done and not agents.SAID_SEEN:
            for _ in range(3000):
                await asyncio.sleep(0.01)
                if agents.SAID_SEEN:
                    break
            else:
                self.waited_out += 1
        rest = encode(want[done:])
        out, reason = (rest[:req.max_tokens], "length") if rest else ([EOS], "stop")
        if rest and len(out) == len(rest) and want.endswith("</calc>"):
            reason = "stop"
        n = len(req.prompt_ids)
        now = time.time()
        return GenerateResult(req.request_id, out, [lp_at(n + i) for i in range(len(out))], reason, 0, n, self.name,
                              now, now)


def run_talking(agent: str, gated: bool):
    """One session of `agent` (tests.gateway.agents_for_tests' talking agents) over TalkEngines, chunk 2:
    its sample, what it was told per call (SAID), the engines, the gateway."""
    agents.SAID.clear()
    agents.SAID_SEEN.clear()
    agents.SAID_LOGPROBS.clear()
    engines = [TalkEngine("e0", gated), TalkEngine("e1", gated)]

    async def go():
        gw = Gateway(EmbeddedChat(TOK.eos_token), encode, lambda ids: TOK.decode(ids, skip_special_tokens=False),
                     lambda ids: TOK.decode(ids, skip_special_tokens=True), TOK.eos_token, agents.MODEL,
                     GatewayLimits(max_call_tokens=64, max_context_tokens=4096))
        server = GatewayServer(gw, "127.0.0.1")
        await server.start()
        runner = AgentRunner(AgentSpec.parse(f"{AGENTS}:{agent}", 60.0, cfg=AgentConfig(mode="loop")), 2)
        try:
            ctx = RolloutContext(engines, scheduler(chunk=2), RewardRunner("seer.tasks.calculator:score"),
                                 decode=lambda ids: TOK.decode(ids, skip_special_tokens=True), encode=encode,
                                 gateway=gw, agents=runner)
            return await gateway_rollout(ctx, RolloutRequest(0, calc_prompts([9]), 1,
                                                             SamplingParams(max_tokens=64))), gw
        finally:
            await server.close()

    batch, gw = asyncio.run(go())
    (said,) = agents.SAID.values()
    return batch.samples[0], said, engines, gw


@pytest.mark.parametrize("door", ["in_process", "socket"])
def test_a_streamed_call_sends_its_content_as_the_turns_chunks_return_and_ends_as_the_plain_call(door):
    plain, plain_said, _, _ = run_talking("talking_agent_plain", gated=False)
    sample, said, engines, gw = run_talking(f"talking_agent_{door}", gated=True)
    assert (gw.counters["in_process"] > 0) == (door == "in_process")
    # the content came in several deltas, the first while the turn was still being generated
    assert len(said[0][0]) > 1 and sum(e.waited_out for e in engines) == 0, said
    assert len(said[1][0]) > 1
    for (deltas, calls, finish), (p_deltas, p_calls, p_finish) in zip(said, plain_said, strict=True):
        assert "".join(deltas) == "".join(p_deltas) and finish == p_finish
        assert [c[1:] for c in calls] == [c[1:] for c in p_calls] and all(c[0] for c in calls)
    assert "".join(said[0][0]) == TalkEngine.SAID and said[0][1][0][1:] == ("calc", '{"expression": "0009-4"}')
    assert said[0][2] == "tool_calls" and "".join(said[1][0]) == TalkEngine.DONE and said[1][2] == "stop"
    # the streamed text is the turn's tokens' text, and the session's tokens are the plain call's
    assert TOK.decode(sample.response_ids).startswith(TalkEngine.SAID + TalkEngine.CALL)
    assert sample.response_ids == plain.response_ids and sample.loss_mask == plain.loss_mask


def test_a_streamed_call_with_logprobs_sends_each_delta_with_its_tokens_logprobs_while_the_turn_is_generated():
    """`logprobs` with `stream`: the content still streams per chunk (the gated engine finishes a turn
    only once some of its content arrived), each delta is whole tokens carrying their log-probs, and
    the stream's log-probs are every token of the turn as the plain call's."""
    _, plain_said, _, _ = run_talking("talking_agent_plain_logprobs", gated=False)
    plain_lp = list(agents.SAID_LOGPROBS.values())[0]
    sample, said, engines, _ = run_talking("talking_agent_logprobs", gated=True)
    (streamed_lp,) = agents.SAID_LOGPROBS.values()
    assert sum(e.waited_out for e in engines) == 0 and len(said[0][0]) > 1, said
    for call, (deltas, _, _), plain_call in zip(streamed_lp, said, plain_lp, strict=True):
        # every delta before the last is exactly its tokens' text; the last adds the tool call's tokens or EOS
        assert len([c for c in call[:-1] if c[0]]) > 1
        assert all("".join(t for t, _ in toks) == text for text, toks in call[:-1])
        assert "".join(text for text, _ in call) == "".join(deltas)
        (_, plain_toks), = plain_call
        assert [x for _, toks in call for x in toks] == plain_toks
    # and they are the model's: the session's trained log-probs, call after call
    assert [lp for call in streamed_lp for _, toks in call for _, lp in toks] == sample.logprobs


def test_a_session_that_rewrites_its_history_is_trained_as_its_branches_without_retokenized_model_tokens():
    (batch,), gw, _ = asyncio.run(run_gateway("rewriting_agent", calc_prompts([40]), group_size=2))
    assert len(batch.samples) == 4 and batch.stats.extra["gateway_branches"] == 2  # one branch per session
    for sid in {s.branch.session for s in batch.samples}:
        leaf, final = [s for s in batch.samples if s.branch.session == sid]
        # the final path holds calls 0 and 3 as the model wrote them; call 2's reply, re-sent by the
        # agent after its edit, is template text there (it lies on the leaf as generated)
        assert leaf.branch.path == (0, 1, 2) and final.branch.path == (0, 3)
        for s in (leaf, final):
            full = s.prompt.prompt_ids + s.response_ids
            mask = [0] * len(s.prompt.prompt_ids) + s.loss_mask
            model_pos = [p for p, m in enumerate(mask) if m]
            # every trained token is one the engine generated at exactly that position of this path
            assert s.logprobs == [lp_at(p) for p in model_pos]
            assert len(s.logprobs) == sum(s.loss_mask) and s.reward == 0.5
        text = TOK.decode(final.prompt.prompt_ids + final.response_ids)
        # the final path: the first call's reply as generated, then (the edit) the third call's exchange
        # as the agent re-sent it: template tokens (mask 0) that happen to spell a call, never trained
        first_call = text.index("</calc>") + len("</calc>")
        assert final.loss_mask[:first_call - len(final.prompt.prompt_ids)].count(1) == len(
            encode(text[len(final.prompt.text):first_call]))
        shared = len(encode(text[len(final.prompt.text):text.index("\n", first_call) + 1]))
        assert final.response_ids[:shared] == leaf.response_ids[:shared]  # the branch point: after call 0's result
        assert final.loss_mask[shared:-len(encode("<calc>0000-0</calc>"))].count(1) == 0  # the edited history
        assert final.loss_mask[-1] == 1 and leaf.loss_mask[-1] == 1
        assert leaf.finish_reason == "branch" and final.finish_reason == "stop"  # a leaf's own, not the final's
    from seer.metrics_log import iteration_record
    from tests.test_metrics_fields import undocumented

    rec = iteration_record(batch)  # per session and per sample, each named (docs/watching.md)
    assert (rec["num_samples"], rec["num_sessions"], rec["num_trained_samples"], rec["gateway_sessions"]) == (4, 2, 4, 2)
    assert rec["reward_mean_sessions"] == rec["reward_mean"] == 0.5 and undocumented(rec) == []
    assert rec["gateway_totals"] == gw.counters and "gateway_counters" not in rec
    # every leaf takes its session's advantage; the group's baseline is over its sessions, one each
    from seer.trainer.algorithms import Algorithms
    from seer.trainer.config import TrainerConfig
    from seer.types import Branch

    def leaf(session: str, reward: float, i: int):
        return dataclasses.replace(final, request_id=f"r{i}", reward=reward, branch=Branch(session, (i,)))

    group = [leaf("a", 1.0, 0), leaf("a", 1.0, 1), leaf("b", 0.0, 2), leaf("b", 0.0, 3), leaf("c", 1.0, 4)]
    (adv,) = Algorithms.from_config(TrainerConfig()).advantages([group])
    assert adv[0] == adv[1] and adv[2] == adv[3] and adv[0] > 0 > adv[2]
    # sessions' rewards 1, 0, 1: mean 2/3, unbiased std 0.5774 -> 0.5774, -1.1547, 0.5774
    assert [round(adv[i], 3) for i in (0, 2, 4)] == [0.577, -1.155, 0.577]

def test_bad_calls_get_openai_errors_and_cost_nothing_but_themselves():
    agents.BAD.clear()
    (batch,), gw, _ = asyncio.run(run_gateway("bad_calls_agent", calc_prompts([9]), group_size=1))
    (got,) = agents.BAD.values()
    status = {what: (code, (err or {}).get("code") if isinstance(err, dict) else None) for what, code, err in got}
    assert status["no key"] == (401, "invalid_api_key") and status["forged key"] == (401, "invalid_api_key")
    assert status["bad json"] == (400, "invalid_json") and status["wrong model"] == (404, "model_not_found")
    assert status["temperature"][0] == 400 and status["n"][0] == 400 and status["tool schema"][0] == 400
    assert status["over-long"] == (400, "context_length_exceeded") and status["too large"] == (413, "request_too_large")
    assert status["no messages"][0] == 400 and status["models"][0] == 200
    for what, _, err in got[:-1]:
        assert set(err) == {"message", "type", "param", "code"}, what
    # a field of the wrong type is a 400 naming it, a key that is not ASCII a 401, JSON nested past
    # what the parser takes a 400: none is a 500 (an error of ours), none took the session's turn
    params = {what: (err or {}).get("param") for what, _, err in got[:-1]}
    for what in ("stream_options", "stream", "logprobs", "tools"):
        assert status[what] == (400, None) and params[what] == what, (what, status[what], params[what])
    assert status["message content"][0] == status["message role"][0] == 400
    assert params["message content"] == "messages[0].content" and params["message role"] == "messages[0].role"
    assert status["non-ascii key"] == (401, "invalid_api_key") and status["deep json"] == (400, "invalid_json")
    s = batch.samples[0]  # the session itself went on: all its bad calls were refused before any turn
    assert s.reward == 1.0 and s.turns >= 2 and not s.reward_error
    assert s.prompt.prompt_ids == encode(s.prompt.text)
    # no refused call was submitted: no orphan turn, no branch, one sample, every call but the bad ones trained
    assert len(batch.samples) == 1 and batch.stats.extra["gateway_branches"] == 0
    # (the over-long call is the one submitted: its context is counted in tokens when its turn comes)
    assert gw.counters["calls"] == s.turns + 1 and gw.counters["cancelled"] == 0


def test_a_call_too_large_for_the_context_is_refused_before_tokenizing_and_a_long_one_is_tokenized_off_the_loop():
    """Group 0's agent sends 3 MB (under gateway.max_request_bytes): refused at once, its text never
    tokenized. Then a long call of group 0 is tokenized while group 1's session runs: the tokenizer
    (gated here) holds group 0's call until group 1's second call is tokenized, which cannot happen
    if the tokenizing blocked the event loop (the gate would wait out its 15 s instead)."""
    agents.Gate.started.clear()
    agents.Gate.release.clear()
    agents.Gate.BIG.clear()
    seen, waited_out = [], []

    def gated(text: str) -> list[int]:
        seen.append(len(text))
        if agents.COUNT_DOWN in text and not agents.Gate.started.is_set():  # group 0's long call
            agents.Gate.started.set()
            if not agents.Gate.release.wait(15):
                waited_out.append(len(text))
        elif agents.Gate.started.is_set() and text.startswith("="):  # a tool result: group 1's next call
            agents.Gate.release.set()
        return encode(text)

    (batch,), gw, _ = asyncio.run(run_gateway("long_call_agent", calc_prompts([9, 13]), group_size=1, tokenize=gated))
    ((status, err),) = agents.Gate.BIG.values()
    assert (status, err["code"]) == (400, "context_length_exceeded") and "before tokenizing" in err["message"]
    assert max(seen) < 10_000  # the 3 MB text never reached the tokenizer
    assert agents.Gate.release.is_set() and not waited_out  # group 1 ran while group 0's call was tokenized
    assert [s.reward for s in batch.samples] == [1.0, 1.0] and gw.counters["errors"] == 1


def test_a_session_key_is_refused_after_its_iteration_and_another_sessions_key_names_only_its_own():
    import httpx

    agents.KEYS.clear()

    async def go():
        batches, gw, _ = await run_gateway("remembering_agent", calc_prompts([5]), group_size=2, iterations=1)
        return batches, gw

    (batch,), gw = asyncio.run(go())
    assert batch.samples[0].reward == 1.0 and len(agents.KEYS) == 2
    keys = [k for _, k in agents.KEYS.values()]
    assert keys[0] != keys[1] and all(k.startswith("seer-it0-g0-s") for k in keys)
    with pytest.raises(Exception) as e:
        gw.session_of(f"Bearer {keys[0]}")
    assert e.value.status == 409
    with pytest.raises(Exception) as e:
        gw.session_of(f"Bearer {keys[0].split('.')[0]}.{keys[1].split('.')[1]}")  # one session's mac on another's id
    assert e.value.status == 401
    del httpx


@pytest.mark.parametrize("agent", ["impatient_agent", "impatient_agent_in_process"])
def test_a_client_that_disconnects_cancels_its_turn_and_its_tokens_are_not_trained(agent):
    slow = [CalcEngine("e0", delay_s=0.5), CalcEngine("e1", delay_s=0.5)]
    (batch,), gw, engines = asyncio.run(run_gateway(agent, calc_prompts([9]), group_size=1, engines=slow))
    (plain,), _, _ = asyncio.run(run_gateway("calc_agent", calc_prompts([9]), group_size=1))
    s = batch.samples[0]
    assert gw.counters["cancelled"] == 1 and any(e.aborted for e in engines), (s.reward_error, gw.counters)
    assert s.response_ids == plain.samples[0].response_ids and s.reward == 1.0, s.reward_error


def test_the_embedded_format_renders_the_calculator_and_refuses_tools_it_cannot_render():
    fmt = EmbeddedChat("</s>")
    msgs = [{"role": "user", "content": "start=0009\n"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "calc", "arguments": '{"expression": "0009-4"}'}}]},
            {"role": "tool", "tool_call_id": "c", "content": "0005"},
            {"role": "assistant", "content": "done"}]
    assert fmt.render(msgs, [agents.CALC_TOOL]) == "start=0009\n<calc>0009-4</calc>=0005\ndone</s>"
    reply = fmt.parse("<calc>0005-5</calc>", [agents.CALC_TOOL])
    assert reply.tool_calls[0].name == "calc" and reply.tool_calls[0].arguments == '{"expression": "0005-5"}'
    assert fmt.stop([agents.CALC_TOOL]) == ("</calc>",)
    with pytest.raises(ChatFormatError):
        fmt.check_tools([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}}}}}])


def test_completions_calls_continue_the_session_token_exact():
    prompts = calc_prompts([10])
    (chat,), _, _ = asyncio.run(run_gateway("calc_agent", prompts, group_size=1))
    (plain,), gw, _ = asyncio.run(run_gateway("completions_agent", prompts, group_size=1))
    s = plain.samples[0]
    # the agent's stop string is kept in the tokens (the model wrote it), so the same trajectory
    assert s.response_ids == chat.samples[0].response_ids and s.loss_mask == chat.samples[0].loss_mask
    assert s.reward == 1.0 and plain.stats.extra["gateway_branches"] == 0
    agents.COMPLETION_LOGPROBS.clear()
    (streamed,), _, _ = asyncio.run(run_gateway("streaming_completions_agent", prompts, group_size=1))
    # streamed with log-probs (per piece, as its chunks return): the same session, every token's log-prob
    assert streamed.samples[0].response_ids == s.response_ids
    assert list(agents.COMPLETION_LOGPROBS.values()) == [streamed.samples[0].logprobs]


class TemplateEngine:
    """A model of a real checkpoint's family: the k-th turn of a path (after the path's k-th generation
    prompt) is `script[k]`, written as tokens of its own (every character apart, special tokens whole),
    never the tokenizer's encoding of its text: a gateway that re-tokenized the model's text would show."""

    def __init__(self, name: str, tok, family, script: list[str]):
        self.name, self.tok, self.family, self.script = name, tok, family, script
        self.running, self.prompts = 0, []
        self._special = re.compile("(" + "|".join(map(re.escape, family.special)) + ")")

    def turn_ids(self, k: int) -> list[int]:
        ids = []
        for piece in self._special.split(self.script[k]):
            if piece in self.family.special:
                ids.append(self.tok.convert_tokens_to_ids(piece))
            else:
                ids += [t for ch in piece for t in self.tok(ch, add_special_tokens=False)["input_ids"]]
        return ids

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        self.prompts.append(list(req.prompt_ids))
        text = self.tok.decode(req.prompt_ids, skip_special_tokens=False)
        start = self.family.turn_start
        full = self.turn_ids(text.count(start) - 1)
        written = text[text.rfind(start) + len(start):]
        j = max(j for j in range(len(full) + 1) if self.tok.decode(full[:j], skip_special_tokens=False) == written)
        out = full[j:j + req.max_tokens]
        n = len(req.prompt_ids)
        now = time.time()
        return GenerateResult(req.request_id, out, [lp_at(n + i) for i in range(len(out))],
                              "stop" if j + len(out) == len(full) else "length", 0, n, self.name, now, now)

    async def abort(self, request_id: str) -> None:
        pass

    async def telemetry(self) -> Telemetry:
        return Telemetry(self.name, time.monotonic(), 0.0, 100_000, self.running, 0, 0, block_size=1)


# The turns each family's model writes, as its checkpoints do: Qwen3 thinks, then calls a tool in
# hermes format or answers; Llama 3.1 writes a JSON call or an answer. Turn 3 follows a second user query.
QWEN3_TURNS = [
    '<think>\nThe total is 9, so subtract 4.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": '
    '{"expression": "0009-4"}}\n</tool_call><|im_end|>',
    '<think>\nNow it is 5, subtract 5.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": '
    '{"expression": "0005-5"}}\n</tool_call><|im_end|>',
    "<think>\nIt is zero.\n</think>\n\nDone: the total reached 0.<|im_end|>",
    "<think>\nCount again, from 4.\n</think>\n\nDone.<|im_end|>"]
LLAMA3_TURNS = ['{"name": "calc", "parameters": {"expression": "0009-4"}}<|eot_id|>',
                '{"name": "calc", "parameters": {"expression": "0005-5"}}<|eot_id|>',
                "Done: the total reached 0.<|eot_id|>", "Done.<|eot_id|>"]


def as_templates_take_them(messages: list[dict]) -> list[dict]:
    """Tool-call arguments as objects (vLLM passes them so; Llama 3's template writes `arguments | tojson`)."""
    import json

    return [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                                 for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


@pytest.mark.parametrize("family_name", ["qwen3", "llama3"])
def test_a_session_on_a_real_chat_template_feeds_the_model_the_templates_tokens_with_its_own_turns_verbatim(
        family_name):
    """Multi-call sessions on the official Qwen3 and Llama 3.1 templates (tests/gateway/chat_templates):
    at every call the model is given exactly the tokenizer's encoding of the call's rendered conversation
    (Qwen3's "\n" after each `<|im_end|>` included), except its own earlier turns, which are its tokens
    as it sampled them; every trained sample is the same: template tokens (mask 0) around the model's."""
    from seer.model.chat import HFChat, chat_format, max_token_chars
    from tests.gateway.chat_templates import LLAMA3, QWEN3, chat_tokenizer

    family, script = {"qwen3": (QWEN3, QWEN3_TURNS), "llama3": (LLAMA3, LLAMA3_TURNS)}[family_name]
    tok = chat_tokenizer(family)

    def enc(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def dec(ids) -> str:
        return tok.decode(ids, skip_special_tokens=False)

    engines = [TemplateEngine("e0", tok, family, script), TemplateEngine("e1", tok, family, script)]
    agents.TEMPLATE_CALLS.clear()

    async def go():
        fmt = chat_format(tok, family.model_type)
        assert isinstance(fmt, HFChat)
        gw = Gateway(fmt, enc, dec, lambda ids: tok.decode(ids, skip_special_tokens=True), tok.eos_token, agents.MODEL,
                     GatewayLimits(max_call_tokens=128, max_context_tokens=4096, max_token_chars=max_token_chars(tok)))
        server = GatewayServer(gw, "127.0.0.1")
        await server.start()
        runner = AgentRunner(AgentSpec.parse(f"{AGENTS}:template_agent", 60.0, cfg=AgentConfig(mode="loop")), 2)
        try:
            ctx = RolloutContext(engines, scheduler(chunk=8), RewardRunner("seer.tasks.env:zero_reward"), decode=dec,
                                 encode=enc, gateway=gw, agents=runner)
            text = "start=0009\n"
            return await gateway_rollout(ctx, RolloutRequest(0, [PromptSpec(0, text, enc(text), {"total": 9})], 1,
                                                             SamplingParams(max_tokens=128))), gw
        finally:
            await server.close()

    batch, gw = asyncio.run(go())
    (calls,) = agents.TEMPLATE_CALLS.values()
    assert len(calls) == 4 and gw.counters["errors"] == 0 and gw.counters["template_unaligned"] == 0
    # the tool calls were read by vLLM's parser of the family: the agent's calculator ran on them
    assert calls[2][-1] == {"role": "tool", "tool_call_id": calls[2][-2]["tool_calls"][0]["id"], "content": "0000"}
    renders = [tok.apply_chat_template(as_templates_take_them(m), tools=[agents.CALC_TOOL], tokenize=False,
                                       add_generation_prompt=True) for m in calls]
    turns = [engines[0].turn_ids(k) for k in range(len(script))]

    def expected(render: str, upto: int) -> tuple[list[int], list[int]]:
        """`render`'s tokens as the gateway must build them, with the model's turns before call `upto`
        that lie in it verbatim (where the template renders a turn as the model wrote it): the tokens
        and the mask (1 on the model's)."""
        ids, mask, at = [], [], 0
        for k in range(upto):
            s = len(renders[k])
            if render.startswith(renders[k]) and render[s:s + len(script[k])] == script[k]:
                ids += enc(render[at:s]) + turns[k]
                mask += [0] * (len(ids) - len(mask) - len(turns[k])) + [1] * len(turns[k])
                at = s + len(script[k])
        ids += enc(render[at:])
        return ids, mask + [0] * (len(ids) - len(mask))

    fed = [p for e in engines for p in e.prompts if dec(p).endswith(family.turn_start)]  # each turn's first chunk
    assert len(fed) == len(calls)
    for k, render in enumerate(renders):
        want, _ = expected(render, k)
        # what the model is given at call k: the template's text exactly (no "\n" left out) ...
        assert any(dec(p) == render for p in fed), (k, render[-200:])
        # ... and token for token the tokenizer's encoding of it, but for its own turns, kept as sampled
        assert want in fed, k
    if family is QWEN3:  # the second query dropped the earlier reasoning: calls 0-2 are a leaf, call 3 the final path
        assert renders[1].startswith(renders[0] + script[0] + "\n<|im_start|>user\n<tool_response>")
        assert [s.branch.path for s in batch.samples] == [(0, 1, 2), (3,)]
    else:
        assert [s.branch.path for s in batch.samples] == [(0, 1, 2, 3)]
    for s in batch.samples:
        last = s.branch.path[-1]
        ids, mask = expected(renders[last], last)
        ids, mask = ids + turns[last], mask + [1] * len(turns[last])
        assert s.prompt.prompt_ids + s.response_ids == ids and [0] * len(s.prompt.prompt_ids) + s.loss_mask == mask
        assert s.logprobs == [lp_at(p) for p, m in enumerate(mask) if m] and s.reward == 1.0
    # an encoding of the turns' text is not what the model sampled (the claim above is not vacuous)
    assert all(enc(script[k]) != turns[k] for k in range(len(script)))


def test_the_template_text_after_a_turn_is_found_where_the_template_ends_the_turn():
    """`template_tail` on the official templates: Qwen3 writes "\n" after `<|im_end|>` (also where it
    re-writes a tool call's JSON the model spaced otherwise); a turn cut short (no EOS) is closed by the
    template's `<|im_end|>\n`; Llama 3.1 writes nothing after `<|eot_id|>`."""
    from seer.model.chat import chat_format
    from seer.rollout.gateway.paths import template_tail
    from tests.gateway.chat_templates import LLAMA3, QWEN3, chat_tokenizer

    msgs = [{"role": "system", "content": "Count down."}, {"role": "user", "content": "start=0009\n"}]

    def tail(family, turn: str, tools=None) -> str | None:
        tok = chat_tokenizer(family)
        fmt = chat_format(tok, family.model_type)
        shown = turn.removesuffix(tok.eos_token)
        before = fmt.render(msgs, tools, True)
        after = fmt.render([*msgs, fmt.parse(shown, tools).message()], tools, False)
        return template_tail(before, turn, shown, after, tok.eos_token)

    assert tail(QWEN3, "<think>\nR\n</think>\n\nHi.<|im_end|>") == "\n"
    assert tail(QWEN3, "<think>\nR\n</think>\n\nHi th") == "<|im_end|>\n"
    assert tail(QWEN3, '<think>\nR\n</think>\n\n<tool_call>\n{"name":"calc","arguments":{"expression":"0009-4"}}\n'
                       "</tool_call><|im_end|>", [agents.CALC_TOOL]) == "\n"
    assert tail(LLAMA3, "Hi.<|eot_id|>") == "" and tail(LLAMA3, "Hi th") == "<|eot_id|>"
    assert tail(LLAMA3, '{"name": "calc", "parameters": {"expression":"0009-4"}}<|eot_id|>', [agents.CALC_TOOL]) == ""
    assert template_tail("<|im_start|>user\nA", "x<|im_end|>", "x", "<|im_start|>user\nB", "<|im_end|>") is None
