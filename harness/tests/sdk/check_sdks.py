#!/usr/bin/env python3
"""The official openai and anthropic Python SDKs against llmroute, or against one emulated engine.

    check_sdks.py --base-url http://127.0.0.1:PORT [--model local-chat] [--direct]

Runs one check per API the gateway routes, each through the SDK's own call (plain, streamed, paged), and
prints `ok <name> (backend X)` or `FAIL <name>: reason` for each. The exit status is 1 if any check failed.

- Responses are validated strictly against the SDK's types (`_strict_response_validation=True`), so a field
  the SDK requires but the answer lacks is a failure, not a silent None. Two checks use a lenient client, where
  the SDK's own types are stricter than the API they describe: streamed text completions (every chunk but the
  last has `finish_reason: null`) and base64 embeddings (decoded from a string after validation); the base64
  vectors are then compared with a strictly validated `encoding_format="float"` answer.
- Every client sends credentials (`authorization`, `x-api-key`, `cookie`, `proxy-authorization`): the
  gateway must strip them; the Rust driver checks the engines' request logs.
- The backend named in each line is the `x-emu-backend` response header. An inference check fails without it:
  no engine answered.
- `--direct`: the base URL is an engine, not the gateway. The Anthropic models list is the gateway's own
  answer (engines speak only the OpenAI shape), so it is skipped.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Callable

import anthropic
import openai

SYSTEM = "You are a terse assistant."
USER = "Say hello."
TIMEOUT_S = 30.0
# Sent by every client on top of the SDKs' own `authorization: Bearer <api key>` (anthropic 2.x sends its key
# there too; `x-api-key` is what older clients and Claude Code send). None may reach an engine via the gateway.
CREDENTIAL_HEADERS = {
    "x-api-key": "sk-ant-test",
    "cookie": "session=sdk-check",
    "proxy-authorization": "Basic c2RrOmNoZWNr",
}


class Failure(Exception):
    """A check's expectation that did not hold."""


def expect(condition: Any, reason: str) -> None:
    if not condition:
        raise Failure(reason)


def engine(headers: Any) -> str:
    """The answering engine's name; a failure if no engine answered."""
    name = headers.get("x-emu-backend")
    expect(name, "no x-emu-backend header: no engine answered")
    return name


class Clients:
    """The SDK clients every check shares."""

    def __init__(self, base_url: str, model: str) -> None:
        self.model = model
        root = base_url.rstrip("/")
        common = dict(max_retries=0, timeout=TIMEOUT_S, default_headers=CREDENTIAL_HEADERS)
        self.openai = openai.OpenAI(
            base_url=f"{root}/v1", api_key="sk-test", _strict_response_validation=True, **common
        )
        self.openai_lenient = openai.OpenAI(base_url=f"{root}/v1", api_key="sk-test", **common)
        self.anthropic = anthropic.Anthropic(
            base_url=root, api_key="sk-ant-test", _strict_response_validation=True, **common
        )

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]


def chat(c: Clients) -> str:
    raw = c.openai.chat.completions.with_raw_response.create(model=c.model, messages=c.chat_messages())
    completion = raw.parse()
    choice = completion.choices[0]
    expect(choice.message.content, "empty message content")
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}")
    expect(completion.usage and completion.usage.prompt_tokens > 0, "no prompt tokens in usage")
    return engine(raw.headers)


def chat_stream(c: Clients) -> str:
    raw = c.openai.chat.completions.with_raw_response.create(
        model=c.model, messages=c.chat_messages(), stream=True
    )
    parts, finish = [], None
    with raw.parse() as stream:
        for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
    expect("".join(parts), "no content deltas")
    expect(finish == "stop", f"finish_reason {finish!r}")
    return engine(raw.headers)


def completions(c: Clients) -> str:
    raw = c.openai.completions.with_raw_response.create(model=c.model, prompt="Once upon a time", max_tokens=8)
    completion = raw.parse()
    expect(completion.choices[0].text, "empty text")
    expect(completion.usage and completion.usage.total_tokens > 0, "no usage")
    return engine(raw.headers)


def completions_stream(c: Clients) -> str:
    raw = c.openai_lenient.completions.with_raw_response.create(
        model=c.model, prompt="Once upon a time", max_tokens=8, stream=True
    )
    parts, finish = [], None
    with raw.parse() as stream:
        for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.text)
                finish = choice.finish_reason or finish
    expect("".join(parts), "no text chunks")
    expect(finish == "stop", f"finish_reason {finish!r}")
    return engine(raw.headers)


def responses(c: Clients) -> str:
    raw = c.openai.responses.with_raw_response.create(model=c.model, instructions=SYSTEM, input=USER)
    response = raw.parse()
    expect(response.status == "completed", f"status {response.status!r}")
    expect(response.output_text, "empty output_text")
    expect(response.usage and response.usage.input_tokens > 0, "no input tokens in usage")
    return engine(raw.headers)


def responses_stream(c: Clients) -> str:
    raw = c.openai.responses.with_raw_response.create(
        model=c.model, instructions=SYSTEM, input=[{"role": "user", "content": USER}], stream=True
    )
    kinds, deltas, final = [], [], None
    with raw.parse() as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.completed":
                final = event.response
    expect(kinds[:1] == ["response.created"], f"first event {kinds[:1]}")
    expect(final is not None, f"no response.completed in {kinds}")
    expect(deltas, "no output_text deltas")
    expect(final.output_text == "".join(deltas), f"output_text {final.output_text!r} != deltas {deltas}")
    return engine(raw.headers)


def embeddings(c: Clients) -> str:
    texts = ["hello", "world"]
    raw = c.openai_lenient.embeddings.with_raw_response.create(model=c.model, input=texts)
    decoded = [item.embedding for item in raw.parse().data]
    floats = c.openai.embeddings.create(model=c.model, input=texts, encoding_format="float")
    expect([len(v) for v in decoded] == [8, 8], f"vector lengths {[len(v) for v in decoded]}")
    plain = [item.embedding for item in floats.data]
    same = all(math.isclose(a, b, rel_tol=1e-6) for u, v in zip(decoded, plain) for a, b in zip(u, v))
    expect(same, f"base64 vectors {decoded} differ from float vectors {plain}")
    return engine(raw.headers)


def messages(c: Clients) -> str:
    raw = c.anthropic.messages.with_raw_response.create(
        model=c.model, max_tokens=64, system=SYSTEM, messages=[{"role": "user", "content": USER}]
    )
    message = raw.parse()
    expect(message.content and message.content[0].type == "text", f"content {message.content}")
    expect(message.content[0].text, "empty text")
    expect(message.stop_reason == "end_turn", f"stop_reason {message.stop_reason!r}")
    return engine(raw.headers)


def messages_stream(c: Clients) -> str:
    with c.anthropic.messages.stream(
        model=c.model, max_tokens=64, system=SYSTEM, messages=[{"role": "user", "content": USER}]
    ) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
        backend = engine(stream.response.headers)
    expect(texts and "".join(texts), "no text deltas")
    expect(final.content[0].text == "".join(texts), f"final text {final.content[0].text!r} != deltas {texts}")
    expect(final.stop_reason == "end_turn", f"stop_reason {final.stop_reason!r}")
    expect(final.usage.output_tokens == len(texts), f"output_tokens {final.usage.output_tokens}")
    return backend


def messages_stream_raw(c: Clients) -> str:
    raw = c.anthropic.messages.with_raw_response.create(
        model=c.model, max_tokens=64, messages=[{"role": "user", "content": USER}], stream=True
    )
    with raw.parse() as stream:
        kinds = [event.type for event in stream]
    expect(kinds[:1] == ["message_start"] and kinds[-1:] == ["message_stop"], f"events {kinds}")
    expect("content_block_delta" in kinds and "message_delta" in kinds, f"events {kinds}")
    return engine(raw.headers)


def answered_by(headers: Any) -> str:
    return headers.get("x-emu-backend") or "none: answered by the gateway"


def models_openai(c: Clients) -> str:
    raw = c.openai.models.with_raw_response.list()
    ids = [model.id for model in raw.parse().data]
    expect(c.model in ids, f"{c.model} not in {ids}")
    return answered_by(raw.headers)


def models_anthropic(c: Clients) -> str:
    raw = c.anthropic.models.with_raw_response.list()
    page = raw.parse()
    ids = [model.id for model in page.data]
    expect(c.model in ids, f"{c.model} not in {ids}")
    expect(all(model.type == "model" for model in page.data), "an entry without type 'model'")
    expect(page.first_id == ids[0] and page.last_id == ids[-1], f"first_id/last_id {page.first_id}/{page.last_id}")
    return answered_by(raw.headers)


CHECKS: list[tuple[str, Callable[[Clients], str]]] = [
    ("chat", chat),
    ("chat-stream", chat_stream),
    ("completions", completions),
    ("completions-stream", completions_stream),
    ("responses", responses),
    ("responses-stream", responses_stream),
    ("embeddings", embeddings),
    ("messages", messages),
    ("messages-stream", messages_stream),
    ("messages-stream-raw", messages_stream_raw),
    ("models-openai", models_openai),
    ("models-anthropic", models_anthropic),
]
GATEWAY_ONLY = {"models-anthropic"}


def cause(error: Exception) -> str:
    """What a strict validation failure was about: the pydantic errors behind it, on one line."""
    errors = getattr(error.__cause__, "errors", None)
    if not callable(errors):
        return ""
    found = [f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in errors()[:6]]
    return f" [{'; '.join(found)}]"


def run(name: str, check: Callable[[Clients], str], clients: Clients) -> bool:
    try:
        backend = check(clients)
    except Failure as failure:
        print(f"FAIL {name}: {failure}", flush=True)
        return False
    except Exception as error:  # an SDK error is a failed check, with its own words
        print(f"FAIL {name}: {type(error).__name__}: {error}{cause(error)}", flush=True)
        return False
    print(f"ok {name} (backend {backend})", flush=True)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="http://HOST:PORT of the gateway (or an engine)")
    parser.add_argument("--model", default="local-chat", help="the model alias to send (default local-chat)")
    parser.add_argument("--direct", action="store_true", help="the base URL is an engine, not the gateway")
    args = parser.parse_args()
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, {args.base_url}", flush=True)
    clients = Clients(args.base_url, args.model)
    passed, failed = 0, 0
    for name, check in CHECKS:
        if args.direct and name in GATEWAY_ONLY:
            print(f"skip {name}: the gateway's own answer (--direct)", flush=True)
        elif run(name, check, clients):
            passed += 1
        else:
            failed += 1
    print(f"{passed} ok, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
