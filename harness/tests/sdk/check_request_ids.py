"""The real anthropic SDK reports the gateway's request id on `/v1/messages`, for answers and for errors.

Run by `harness/tests/sdk.rs` (`anthropic_sdk_reports_the_gateways_request_id`) against Envoy with the filter.
Each check prints `PASS name` or `FAIL name: reason`; the exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import anthropic

TIMEOUT_S = 30.0
MESSAGES = [{"role": "user", "content": "Say hello."}]


def expect(condition: Any, reason: str) -> None:
    if not condition:
        raise AssertionError(reason)


def answer(c: anthropic.Anthropic, model: str) -> str:
    raw = c.messages.with_raw_response.create(
        model=model,
        max_tokens=16,
        messages=MESSAGES,
        extra_headers={"x-request-id": "sdk-answer-1"},
        # Put into the body by mistake; the gateway cuts it before the engine.
        extra_body={"extra_headers": {"x-emu-status": "500"}},
    )
    message = raw.parse()
    expect(raw.request_id == "sdk-answer-1", f"raw.request_id {raw.request_id!r}")
    expect(message._request_id == "sdk-answer-1", f"message._request_id {message._request_id!r}")
    return "ok"


def gateway_error(c: anthropic.Anthropic, model: str) -> str:
    try:
        c.messages.create(model="no-such-model", max_tokens=16, messages=MESSAGES)
    except anthropic.NotFoundError as e:
        sent = e.response.headers.get("x-request-id")
        expect(sent, "no x-request-id on the error")
        expect(e.request_id == sent, f"request_id {e.request_id!r} != x-request-id {sent!r}")
        expect(isinstance(e.body, dict) and e.body.get("request_id") == sent, f"body {e.body!r}")
        return "ok"
    raise AssertionError("an unknown model was not a NotFoundError")


def backend_error(c: anthropic.Anthropic, model: str) -> str:
    try:
        c.messages.create(
            model=model,
            max_tokens=16,
            messages=MESSAGES,
            extra_headers={"x-emu-status": "422", "x-emu-error-shape": "fastapi", "x-request-id": "sdk-422"},
        )
    except anthropic.UnprocessableEntityError as e:
        expect(e.request_id == "sdk-422", f"request_id {e.request_id!r}")
        body = e.body if isinstance(e.body, dict) else {}
        expect(body.get("type") == "error", f"body {e.body!r}")
        expect(body.get("request_id") == "sdk-422", f"body {e.body!r}")
        error = body.get("error") or {}
        expect(error.get("type") == "invalid_request_error", f"error {error!r}")
        expect("Field required" in str(error.get("message")), f"error {error!r}")
        expect("Field required" in e.message, f"message {e.message!r}")
        return "ok"
    raise AssertionError("a 422 from the engine was not an UnprocessableEntityError")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    client = anthropic.Anthropic(
        base_url=args.base_url.rstrip("/"),
        api_key="sk-ant-test",
        max_retries=0,
        timeout=TIMEOUT_S,
        _strict_response_validation=True,
    )
    checks: list[tuple[str, Callable[[anthropic.Anthropic, str], str]]] = [
        ("answer", answer),
        ("gateway_error", gateway_error),
        ("backend_error", backend_error),
    ]
    failed = False
    for name, check in checks:
        try:
            check(client, args.model)
            print(f"PASS {name}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, none hidden
            failed = True
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
