//! Tests of the stream-to-answer rebuild, on engine-shaped streams (llama.cpp text, vLLM tool calls, Responses).

use serde_json::{json, Value};

use super::*;

const LIMIT: usize = 1 << 20;

fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
        "system_fingerprint": "b1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// A llama.cpp-shaped text stream: role chunk, keepalive, deltas, last chunk with timings, usage, `[DONE]`.
fn llama_text() -> String {
    let mut s = data(chunk(json!({"role": "assistant", "content": ""}), Value::Null));
    s.push_str(": keepalive\n\n");
    for t in ["Hel", "lo", " wörld"] {
        s.push_str(&data(chunk(json!({"content": t}), Value::Null)));
    }
    let mut last = chunk(json!({}), json!("stop"));
    last["timings"] = json!({"prompt_n": 3, "cache_n": 5, "predicted_n": 3});
    s.push_str(&data(last));
    let mut usage = chunk(json!({}), Value::Null);
    usage["choices"] = json!([]);
    usage["usage"] = json!({"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11});
    s.push_str(&data(usage));
    s.push_str("data: [DONE]\n\n");
    s
}

fn assemble(api: Api, stream: &str, pieces: usize) -> Result<Value, Failure> {
    let mut a = Assembler::new(api, LIMIT);
    let bytes = stream.as_bytes();
    let size = (bytes.len() / pieces).max(1);
    for c in bytes.chunks(size) {
        a.feed(c);
    }
    a.finish().map(|b| serde_json::from_slice(&b).unwrap())
}

#[test]
fn chat_text_is_one_completion_whatever_the_chunking() {
    let want = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "m", "system_fingerprint": "b1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello wörld"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11},
        "timings": {"prompt_n": 3, "cache_n": 5, "predicted_n": 3},
    });
    let stream = llama_text();
    for pieces in [1, 2, 7, stream.len()] {
        assert_eq!(assemble(Api::Chat, &stream, pieces).unwrap(), want, "{pieces} pieces");
    }
    let crlf = stream.replace('\n', "\r\n");
    assert_eq!(assemble(Api::Chat, &crlf, 5).unwrap(), want);
}

#[test]
fn the_answer_is_serialised_with_sorted_keys() {
    let mut a = Assembler::new(Api::Chat, LIMIT);
    a.feed(llama_text().as_bytes());
    let text = String::from_utf8(a.finish().unwrap()).unwrap();
    assert!(
        text.starts_with("{\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,"),
        "{text}"
    );
}

#[test]
fn usage_is_reported_for_the_metrics() {
    let mut a = Assembler::new(Api::Chat, LIMIT);
    a.feed(llama_text().as_bytes());
    assert_eq!(a.usage().prompt_tokens, Some(8));
    assert_eq!(a.usage().completion_tokens, Some(3));
}

/// vLLM streams a tool call as a first delta with id, type and name, then pieces of the arguments.
#[test]
fn tool_calls_are_merged_by_index_with_arguments_concatenated() {
    let call = |index: u64, first: bool, args: &str| {
        let mut c = json!({"index": index, "function": {"arguments": args}});
        if first {
            c["id"] = json!(format!("call_{index}"));
            c["type"] = json!("function");
            c["function"]["name"] = json!(format!("f{index}"));
        }
        chunk(json!({"tool_calls": [c]}), Value::Null)
    };
    let mut s = data(chunk(json!({"role": "assistant", "content": null}), Value::Null));
    s += &data(call(0, true, ""));
    s += &data(call(0, false, "{\"a\":"));
    s += &data(call(1, true, "{}"));
    s += &data(call(0, false, "1}"));
    s += &data(chunk(json!({}), json!("tool_calls")));
    s += "data: [DONE]\n\n";
    let v = assemble(Api::Chat, &s, 3).unwrap();
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], Value::Null);
    assert_eq!(
        msg["tool_calls"],
        json!([
            {"id": "call_0", "type": "function", "function": {"name": "f0", "arguments": "{\"a\":1}"}},
            {"id": "call_1", "type": "function", "function": {"name": "f1", "arguments": "{}"}},
        ])
    );
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert!(v.get("usage").is_none(), "no usage chunk, no usage");
}

#[test]
fn several_choices_reasoning_and_logprobs() {
    let mut s = String::new();
    for (i, t) in [(1, "b"), (0, "a"), (1, "c")] {
        let mut c = chunk(json!({"content": t, "reasoning_content": "r"}), Value::Null);
        c["choices"][0]["index"] = json!(i);
        c["choices"][0]["logprobs"] = json!({"content": [{"token": t, "logprob": -0.5}]});
        s += &data(c);
    }
    s += "data: [DONE]\n\n";
    let v = assemble(Api::Chat, &s, 1).unwrap();
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][1]["message"]["content"], "bc");
    assert_eq!(v["choices"][1]["message"]["reasoning_content"], "rr");
    assert_eq!(v["choices"][1]["logprobs"]["content"][1]["token"], "c");
    assert_eq!(v["choices"][0]["finish_reason"], Value::Null);
}

#[test]
fn a_stream_without_done_is_cut() {
    let stream = llama_text().replace("data: [DONE]\n\n", "");
    assert_eq!(assemble(Api::Chat, &stream, 3), Err(Failure::Cut));
    let half = &llama_text()[..100];
    assert_eq!(assemble(Api::Chat, half, 1), Err(Failure::Cut));
    assert_eq!(assemble(Api::Chat, "", 1), Err(Failure::Cut));
}

#[test]
fn an_error_event_is_an_upstream_error_even_if_done_follows() {
    let mut s = data(chunk(json!({"content": "x"}), Value::Null));
    s += "data: {\"error\":{\"message\":\"engine failure\",\"type\":\"server_error\"}}\n\ndata: [DONE]\n\n";
    assert_eq!(assemble(Api::Chat, &s, 2), Err(Failure::UpstreamError));
}

#[test]
fn garbage_carries_nothing_and_is_no_answer_without_done() {
    let mut s = data(chunk(json!({"content": "x"}), Value::Null));
    s += "data: {\"choices\": [{\"delta\": tok\n\n\u{1} garbage \n\nbogus-field: 42\n\n";
    assert_eq!(assemble(Api::Chat, &s, 1), Err(Failure::Cut));
}

#[test]
fn past_the_bound_the_answer_fails_and_holds_nothing() {
    let mut a = Assembler::new(Api::Chat, 4096);
    for _ in 0..100 {
        a.feed(data(chunk(json!({"content": "0123456789".repeat(5)}), Value::Null)).as_bytes());
    }
    assert_eq!(a.failed(), Some(Failure::TooLarge));
    a.feed(b"data: [DONE]\n\n");
    assert_eq!(a.finish(), Err(Failure::TooLarge));
    // One event larger than the bound is refused by the reader itself.
    let mut a = Assembler::new(Api::Chat, 4096);
    a.feed(data(chunk(json!({"content": "x".repeat(5000)}), Value::Null)).as_bytes());
    assert_eq!(a.failed(), Some(Failure::TooLarge));
}

fn responses_stream(terminal: &str) -> String {
    let response = json!({"id": "resp_1", "object": "response", "status": "completed",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}],
        "usage": {"input_tokens": 4, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 2}}});
    let ev = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n");
    let mut s = ev(
        "response.created",
        json!({"type": "response.created", "response": {"status": "in_progress"}}),
    );
    s += &ev(
        "response.output_text.delta",
        json!({"type": "response.output_text.delta", "delta": "hi"}),
    );
    s += &ev(terminal, json!({"type": terminal, "response": response}));
    s
}

#[test]
fn responses_answer_is_the_completed_response() {
    let v = assemble(Api::Responses, &responses_stream("response.completed"), 4).unwrap();
    assert_eq!(v["id"], "resp_1");
    assert_eq!(v["output"][0]["content"][0]["text"], "hi");
    let mut a = Assembler::new(Api::Responses, LIMIT);
    a.feed(responses_stream("response.completed").as_bytes());
    assert_eq!(a.usage().cached_tokens, Some(2));
    assert!(assemble(Api::Responses, &responses_stream("response.incomplete"), 1).is_ok());
}

#[test]
fn responses_failures() {
    let failed = responses_stream("response.failed");
    assert_eq!(assemble(Api::Responses, &failed, 2), Err(Failure::UpstreamError));
    let error = "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\"}\n\n";
    assert_eq!(assemble(Api::Responses, error, 1), Err(Failure::UpstreamError));
    let open = responses_stream("response.completed");
    let cut = &open[..open.find("event: response.completed").unwrap()];
    assert_eq!(assemble(Api::Responses, cut, 1), Err(Failure::Cut));
    let no_object = "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n";
    assert_eq!(assemble(Api::Responses, no_object, 1), Err(Failure::UpstreamError));
    let mut small = Assembler::new(Api::Responses, 4096);
    let big = format!(
        "event: response.completed\ndata: {}\n\n",
        json!({"type": "response.completed", "response": {"output": "x".repeat(4050)}})
    );
    small.feed(big.as_bytes());
    assert_eq!(small.finish(), Err(Failure::TooLarge));
}

#[test]
fn the_failure_body_is_an_openai_error_with_the_request_id() {
    let v: Value = serde_json::from_slice(&failure_body(Failure::Cut, Some("rid-1"))).unwrap();
    assert_eq!(v["error"]["type"], "server_error");
    assert_eq!(v["error"]["code"], "upstream_stream_cut");
    assert_eq!(v["request_id"], "rid-1");
}

#[test]
fn many_empty_choices_or_tool_calls_count_against_the_bound() {
    let mut a = Assembler::new(Api::Chat, 4096);
    for i in 0..200u64 {
        let mut c = chunk(json!({}), Value::Null);
        c["choices"][0]["index"] = json!(i);
        a.feed(data(c).as_bytes());
    }
    assert_eq!(a.failed(), Some(Failure::TooLarge));
    let mut a = Assembler::new(Api::Chat, 4096);
    for i in 0..200u64 {
        a.feed(data(chunk(json!({"tool_calls": [{"index": i}]}), Value::Null)).as_bytes());
    }
    assert_eq!(a.failed(), Some(Failure::TooLarge));
}
