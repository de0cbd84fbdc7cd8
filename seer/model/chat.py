"""Chat formats: how a conversation (OpenAI messages and function tools) becomes prompt text, and how
a model turn's text becomes a reply (content and tool calls).

The embedded models have no chat template of their own in their tokenizer; `EmbeddedChat` is theirs.
It is chosen so that the calculator task run as an OpenAI chat with a function tool gives exactly the
tokens of its `Environment` (seer.tasks.calculator): a user or system message is its text, a tool
call is `<NAME>ARGUMENT</NAME>` (the function's one string argument: `<calc>0023-8</calc>`), a tool's
result is `=RESULT` and a newline, and an assistant turn without a tool call ends with the EOS token.
No role markers and no tool list in the prompt: the embedded models never saw any.

Real checkpoints use their tokenizer's own chat template and vLLM's tool parser of their family
(`HFChat`): the template renders the tools, the parser reads the calls back out of the model's text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol


class ChatFormatError(ValueError):
    """A conversation or tool list this format cannot render (the gateway answers 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI carries it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


@dataclass(frozen=True)
class Reply:
    """One model turn read back as an assistant message."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()

    def message(self) -> dict:
        """The assistant message as the agent sends it back in its next call."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        return msg


class ChatFormat(Protocol):
    """What the gateway needs of a model's chat format."""

    name: str

    def check_tools(self, tools: list[dict] | None) -> None:
        """Raise ChatFormatError for a tool list this format cannot render."""
        ...

    def render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
        ...

    def stop(self, tools: list[dict] | None) -> tuple[str, ...]:
        """Strings that end a model turn besides EOS (a tool call's end)."""
        ...

    def call_starts(self, tools: list[dict] | None) -> tuple[str, ...] | None:
        """Strings where a tool call may begin in a turn's text (the text before them is content and
        may be streamed as it is generated); None: unknown, nothing is streamed before the turn ends."""
        ...

    def parse(self, text: str, tools: list[dict] | None) -> Reply:
        """The reply in a turn's text (special tokens kept, the EOS token's text removed)."""
        ...


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, or OpenAI's list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text") \
                    or not isinstance(part.get("text"), str):
                raise ChatFormatError(f"{where}: only text content parts are supported", where)
            out.append(part["text"])
        return "".join(out)
    raise ChatFormatError(f"{where}: content must be a string or a list of text parts", where)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")


def function_tools(tools: list[dict] | None) -> list[dict]:
    """The `function` objects of an OpenAI tools list, checked for shape."""
    out = []
    for i, t in enumerate(tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise ChatFormatError(f"tools[{i}]: only {{'type': 'function', 'function': {{...}}}} tools are supported",
                                  f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not _NAME.fullmatch(fn["name"]):
            raise ChatFormatError(f"tools[{i}].function.name must match {_NAME.pattern}", f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ChatFormatError(f"tools[{i}].function.parameters must be a JSON schema object",
                                  f"tools[{i}].function.parameters")
        out.append(fn)
    return out


class EmbeddedChat:
    """The embedded models' format (module docstring): plain text, `<NAME>ARG</NAME>` tool calls."""

    name = "seer-embedded"

    def __init__(self, eos_text: str) -> None:
        self.eos_text = eos_text

    @staticmethod
    def _argument(fn: dict) -> str:
        """The one string parameter a tool of this format has (its text between the tags)."""
        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        if params.get("type", "object") != "object" or len(props) != 1 \
                or (next(iter(props.values())) or {}).get("type") != "string":
            raise ChatFormatError(
                f"tool {fn['name']!r}: the embedded models' tool-call format <{fn['name']}>TEXT</{fn['name']}> "
                "renders tools with exactly one string parameter", "tools")
        return next(iter(props))

    def check_tools(self, tools: list[dict] | None) -> None:
        for fn in function_tools(tools):
            self._argument(fn)

    def stop(self, tools: list[dict] | None) -> tuple[str, ...]:
        return tuple(f"</{fn['name']}>" for fn in function_tools(tools))

    def call_starts(self, tools: list[dict] | None) -> tuple[str, ...] | None:
        return tuple(f"<{fn['name']}>" for fn in function_tools(tools))

    def _call_text(self, call: Any, tools: dict[str, dict], where: str) -> str:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ChatFormatError(f"{where}: a tool call needs function.name", where)
        name = fn["name"]
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except (TypeError, json.JSONDecodeError, RecursionError) as e:
            raise ChatFormatError(f"{where}: arguments are not JSON ({e!r})", where) from None
        key = self._argument(tools[name]) if name in tools else None
        if not isinstance(args, dict) or len(args) != 1 or (key is not None and key not in args) \
                or not isinstance(next(iter(args.values())), str):
            raise ChatFormatError(f"{where}: {name} takes one string argument", where)
        return f"<{name}>{next(iter(args.values()))}</{name}>"

    def render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = True) -> str:
        by_name = {fn["name"]: fn for fn in function_tools(tools)}
        out = []
        for i, m in enumerate(messages):
            role, where = m.get("role"), f"messages[{i}]"
            if role in ("system", "developer", "user"):
                out.append(text_of(m.get("content"), where))
            elif role == "assistant":
                calls = m.get("tool_calls") or []
                out.append(text_of(m.get("content"), where))
                out.extend(self._call_text(c, by_name, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls))
                if not calls:
                    out.append(self.eos_text)  # the model ended that turn with EOS
            elif role == "tool":
                out.append(f"={text_of(m.get('content'), where)}\n")
            else:
                raise ChatFormatError(f"{where}: unknown role {role!r}", f"{where}.role")
        return "".join(out)

    def parse(self, text: str, tools: list[dict] | None) -> Reply:
        for fn in function_tools(tools):
            name = fn["name"]
            end = f"</{name}>"
            if text.endswith(end) and f"<{name}>" in text:
                start = text.rindex(f"<{name}>")
                arg = text[start + len(name) + 2:-len(end)]
                return Reply(text[:start], (ToolCall(name, json.dumps({self._argument(fn): arg})),))
        return Reply(text)


# vLLM's tool parser per model family (vllm/tool_parsers/), by the checkpoint's config model_type.
TOOL_PARSERS = {"qwen2": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes", "qwen2_moe": "hermes",
                "llama": "llama3_json", "mistral": "mistral", "granite": "granite"}


# Where each parser's tool calls begin in a turn's text (streaming sends the content before them early).
CALL_STARTS = {"hermes": ("<tool_call>",), "mistral": ("[TOOL_CALLS]",), "granite": ("<|tool_call|>",)}


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as chat templates take them, as vLLM passes them: an assistant tool call's
    `arguments` a dict, not OpenAI's JSON text (Llama 3's template writes `arguments | tojson`;
    text there would be rendered as a quoted string); text that is not a JSON object becomes {}."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) and m.get("role") == "assistant" else None
        if not isinstance(calls, list) or not calls:
            out.append(m)
            continue
        fixed = []
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    args = json.loads(fn["arguments"] or "{}")
                except (json.JSONDecodeError, RecursionError):
                    args = {}
                c = {**c, "function": {**fn, "arguments": args if isinstance(args, dict) else {}}}
            fixed.append(c)
        out.append({**m, "tool_calls": fixed})
    return out


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` spells (its vocabulary's longest entry: a byte-level
    entry has one symbol per byte, so at least its characters): a text longer than this many characters
    per token cannot fit in that many tokens, so the gateway refuses it before tokenizing it."""
    try:
        return max(1, max(map(len, tokenizer.get_vocab())))
    except Exception:  # a tokenizer without a vocabulary to read: no bound from it
        return 1 << 20


class HFChat:
    """A real checkpoint's own chat template, and vLLM's tool parser of its family."""

    name = "hf-template"

    def __init__(self, tokenizer: Any, model_type: str) -> None:
        self.tokenizer = tokenizer
        self.parser_name = TOOL_PARSERS.get(model_type)
        self._parser = None

    def check_tools(self, tools: list[dict] | None) -> None:
        function_tools(tools)
        if tools and self.parser_name is None:
            raise ChatFormatError("this model family has no tool parser in the gateway (seer.model.chat.TOOL_PARSERS)",
                                  "tools")

    def stop(self, tools: list[dict] | None) -> tuple[str, ...]:
        return ()

    def call_starts(self, tools: list[dict] | None) -> tuple[str, ...] | None:
        if not tools or self.parser_name is None:
            return ()
        return CALL_STARTS.get(self.parser_name)

    def render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = True) -> str:
        try:
            return self.tokenizer.apply_chat_template(template_messages(messages), tools=tools or None, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as e:  # jinja errors: the conversation or tools do not fit the template
            raise ChatFormatError(f"the model's chat template cannot render this call: {e}") from None

    def parse(self, text: str, tools: list[dict] | None) -> Reply:
        if not tools or self.parser_name is None:
            return Reply(text)
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        if self._parser is None:
            self._parser = ToolParserManager.get_tool_parser(self.parser_name)(self.tokenizer)
        req = ChatCompletionRequest(model="m", messages=[], tools=tools)
        info = self._parser.extract_tool_calls(text, req)
        if not info.tools_called:
            return Reply(text)
        return Reply(info.content or "", tuple(ToolCall(c.function.name, c.function.arguments) for c in info.tool_calls))


def chat_format(tokenizer: Any, model_type: str) -> ChatFormat:
    """The format of a model: its tokenizer's chat template if it has one, else the embedded one."""
    if getattr(tokenizer, "chat_template", None):
        return HFChat(tokenizer, model_type)
    return EmbeddedChat(tokenizer.eos_token)
