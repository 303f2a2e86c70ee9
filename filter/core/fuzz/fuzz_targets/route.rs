//! Request parsing and inspection per API: `route(cfg, api, body, session)` as the body plan (`request_plan::body`) calls it at
//! the end of the body, then the body edit it applies.
//!
//! Input: one selector byte (the API, and whether a session header was sent), then the body.
//! Beyond "no panic": the edited body has exactly the length the filter sets in `content-length`, is still one
//! JSON object, and is what the head edit the filter sends makes of it; the one-pass token count is the walk's;
//! and every value that becomes a header is header-safe.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmroute_core::estimate;
use llmroute_core::json::{scan_object, MAX_DEPTH};
use llmroute_core::{route, session_from_headers};
use llmroute_core_fuzz::{api, config, header_safe};

fuzz_target!(|data: &[u8]| {
    let Some(cfg) = config() else {
        panic!("the fuzz config does not load");
    };
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let api = api(selector % 5);
    let sent: Option<&[u8]> = (selector / 5 % 2 == 1).then_some(b"tenant-7");
    let session = match session_from_headers(cfg, |name| (name == "x-session-id").then_some(sent).flatten()) {
        Ok(s) => s,
        Err(_) => return,
    };
    let Ok(d) = route(cfg, api, body, session.as_ref()) else {
        return;
    };
    let sent_len = d.body_len(body.len());
    if let Some(patch) = &d.patch {
        let out = patch.apply(body);
        assert_eq!(Some(out.len()), sent_len, "content-length disagrees with the edited body");
        assert!(
            scan_object(&out, MAX_DEPTH).is_ok(),
            "the edited body is no longer a JSON object"
        );
        // What the filter sends: the head edit, applied as Envoy applies `set_buffer` at offset 0.
        let Some(calls) = patch.head_edit(body) else {
            panic!("a patch of this body does not fit it");
        };
        let mut envoy = body.to_vec();
        for call in calls {
            envoy.drain(..call.drain);
            envoy.splice(0..0, call.bytes.iter().copied());
        }
        assert_eq!(envoy, out, "the head edit and apply disagree");
    } else {
        assert_eq!(sent_len, Some(body.len()));
    }
    // The token count of the one pass is the walk's.
    assert_eq!(d.input_tokens, estimate::input_tokens(body, cfg.image_tokens));
    assert!(header_safe(d.cluster.as_bytes()));
    assert!(header_safe(d.alias.as_bytes()));
    if let Some(echo) = &d.echo_session {
        assert!(
            llmroute_core::affinity::check_explicit(echo.as_bytes()).is_ok(),
            "echoed session {echo:?}"
        );
    }
    if let Some(a) = &d.affinity {
        assert_eq!(a.header_value().len(), 16);
    }
});
