#!/usr/bin/env python3
"""The official openai and anthropic Python SDKs through llmroute to real llama.cpp servers.

    check_real_sdks.py --base-url http://127.0.0.1:PORT --model ALIAS --servers llama-a-0,llama-a-1,llama-a-2

Each check streams (or not) through the SDK's own call and prints `ok <name> (backend X)` or
`FAIL <name>: reason`; the exit status is 1 if any check failed. The backend is the answer's `model`, which
llama-server sets to its `--alias` whatever the request named, so it must be one of --servers.

- chat-stream: `chat.completions.create(stream=True, stream_options={"include_usage": True})`, every chunk from
  one server, content deltas, and the usage chunk.
- chat-stream-again: the same system prompt and question again: the same server (the affinity key is the system
  prompt), and the engine reports `usage.prompt_tokens_details.cached_tokens` > 0.
- chat: the same, not streamed.
- messages-stream: `messages.stream` with the same system prompt and question: the Anthropic API gets the same
  affinity key, so the same server, and the engine reports `cache_read_input_tokens` > 0.
- messages: the same, not streamed.
- models: the gateway's own OpenAI models list names the alias.

Responses are validated strictly against the SDKs' types (`_strict_response_validation=True`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import anthropic
import openai

USER = "Name three colors."
TIMEOUT_S = 60.0
MAX_TOKENS = 8
WORDS = "cache route engine prompt token model request fleet server warm slot batch".split()


def system_prompt() -> str:
    """A system prompt of about 300 tokens, so a cache hit is plain to see."""
    return "You are a terse assistant. " + " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(260))


class Failure(Exception):
    """A check's expectation that did not hold."""


def expect(condition: Any, reason: str) -> None:
    if not condition:
        raise Failure(reason)


class Run:
    """The clients and what earlier checks saw."""

    def __init__(self, base_url: str, model: str, servers: list[str]) -> None:
        root = base_url.rstrip("/")
        common = dict(max_retries=0, timeout=TIMEOUT_S, _strict_response_validation=True)
        self.openai = openai.OpenAI(base_url=f"{root}/v1", api_key="sk-test", **common)
        self.anthropic = anthropic.Anthropic(base_url=root, api_key="sk-ant-test", **common)
        self.model = model
        self.servers = servers
        self.system = system_prompt()
        self.owner: str | None = None

    def server(self, model: str) -> str:
        expect(model in self.servers, f"model {model!r} names none of the servers {self.servers}")
        return model

    def same_owner(self, model: str) -> None:
        if self.owner is None:
            self.owner = model
        expect(model == self.owner, f"answered by {model}, but the same system prompt went to {self.owner} before")

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": USER}]


def chat_stream(r: Run, again: bool = False) -> str:
    stream = r.openai.chat.completions.create(
        model=r.model,
        messages=r.messages(),
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    models, deltas, usage = set(), 0, None
    for chunk in stream:
        models.add(chunk.model)
        deltas += sum(1 for c in chunk.choices if c.delta.content is not None)
        usage = chunk.usage or usage
    expect(len(models) == 1, f"chunks from several models: {models}")
    model = r.server(models.pop())
    expect(deltas >= 1, "no content deltas")
    expect(usage is not None and usage.prompt_tokens > 0, f"no usage chunk: {usage}")
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    if again:
        expect(cached and cached > 0, f"no cached tokens on the repeat: {usage}")
    r.same_owner(model)
    return f"{model}, prompt_tokens {usage.prompt_tokens}, cached_tokens {cached}"


def chat_stream_again(r: Run) -> str:
    return chat_stream(r, again=True)


def chat(r: Run) -> str:
    completion = r.openai.chat.completions.create(model=r.model, messages=r.messages(), max_tokens=MAX_TOKENS)
    model = r.server(completion.model)
    expect(completion.choices and completion.choices[0].message.content is not None, "no message content")
    expect(completion.usage and completion.usage.prompt_tokens > 0, "no usage")
    r.same_owner(model)
    return model


def messages_stream(r: Run) -> str:
    with r.anthropic.messages.stream(
        model=r.model, max_tokens=MAX_TOKENS, system=r.system, messages=[{"role": "user", "content": USER}]
    ) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    model = r.server(final.model)
    expect(texts, "no text deltas")
    expect(final.content and final.content[0].type == "text", f"content {final.content}")
    expect(final.stop_reason in ("max_tokens", "end_turn"), f"stop_reason {final.stop_reason!r}")
    cached = final.usage.cache_read_input_tokens or 0
    expect(cached > 0, f"no cache_read_input_tokens: {final.usage}")
    r.same_owner(model)
    return f"{model}, input_tokens {final.usage.input_tokens}, cache_read_input_tokens {cached}"


def messages(r: Run) -> str:
    message = r.anthropic.messages.create(
        model=r.model, max_tokens=MAX_TOKENS, system=r.system, messages=[{"role": "user", "content": USER}]
    )
    model = r.server(message.model)
    expect(message.content and message.content[0].type == "text", f"content {message.content}")
    r.same_owner(model)
    return model


def models(r: Run) -> str:
    ids = [m.id for m in r.openai.models.list().data]
    expect(r.model in ids, f"{r.model} not in {ids}")
    return "none: answered by the gateway"


CHECKS: list[tuple[str, Callable[[Run], str]]] = [
    ("chat-stream", chat_stream),
    ("chat-stream-again", chat_stream_again),
    ("chat", chat),
    ("messages-stream", messages_stream),
    ("messages", messages),
    ("models", models),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="http://HOST:PORT of the gateway")
    parser.add_argument("--model", required=True, help="the model alias to send")
    parser.add_argument("--servers", required=True, help="comma-separated --alias of every llama-server")
    args = parser.parse_args()
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, {args.base_url}", flush=True)
    run = Run(args.base_url, args.model, args.servers.split(","))
    failed = 0
    for name, check in CHECKS:
        try:
            print(f"ok {name} (backend {check(run)})", flush=True)
        except Failure as failure:
            print(f"FAIL {name}: {failure}", flush=True)
            failed += 1
        except Exception as error:  # an SDK error is a failed check, with its own words
            print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
            failed += 1
    print(f"{len(CHECKS) - failed} ok, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
