//! One pass over a request body: full JSON validation plus an index of the top-level object's members.
//!
//! Why not `serde_json::Value`? Three reasons. The gateway must keep every byte it does not own, so it needs the
//! byte span of `model`, which a tree loses. It must bound nesting at 64 levels without recursion, because a
//! 10,000-deep body must not blow the wasm stack. And it must see every top-level key, duplicates included, so
//! the gateway never reads a field differently from the engine behind it.
//!
//! The scanner is a loop over bytes with an explicit stack of open containers (one byte per level), so its cost
//! is linear in the body and its memory is bounded by the depth limit. It allocates one `Vec` for the top-level
//! members and nothing per nested value.

use std::fmt;

/// A half-open byte range `[start, end)` in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn of<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        buf.get(self.start..self.end).unwrap_or_default()
    }

    /// The span's length; an inverted span (`end < start`, which the scanner never makes) is empty, as [`Self::of`]
    /// reads it.
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// The JSON type of a value, read from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
            Kind::Null => "null",
        }
    }
}

/// One member of the top-level object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The key, quotes included.
    pub key: Span,
    /// True when the key holds a backslash escape and must be decoded before comparison.
    pub key_escaped: bool,
    /// The value, exactly as written.
    pub value: Span,
    pub kind: Kind,
}

/// Why a body is not acceptable JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonError {
    Empty,
    InvalidUtf8 { offset: usize },
    Syntax { offset: usize, expected: &'static str },
    TooDeep { limit: usize },
    NotAnObject { found: Kind },
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonError::Empty => write!(f, "the request body is empty"),
            JsonError::InvalidUtf8 { offset } => {
                write!(f, "the body is not valid UTF-8 (byte {offset})")
            }
            JsonError::Syntax { offset, expected } => {
                write!(f, "invalid JSON at byte {offset}: expected {expected}")
            }
            JsonError::TooDeep { limit } => write!(f, "JSON nesting exceeds {limit} levels"),
            JsonError::NotAnObject { found } => {
                write!(f, "the body must be a JSON object, not {}", found.name())
            }
        }
    }
}

/// What a pass over the body may learn besides validity: the structure, as events in document order. Every
/// method does nothing by default, so a plain scan pays nothing for them. The token estimate
/// ([`crate::estimate::Estimator`]) listens, so the routes count tokens in the pass that validates.
pub trait Visit {
    /// A value starts at byte `at` (before [`Visit::open`] when it is a container).
    fn value_start(&mut self, _at: usize) {}
    /// An object (`object`) or array opens at byte `at`.
    fn open(&mut self, _at: usize, _object: bool) {}
    /// The innermost open container closes; `at` is the byte just past its bracket.
    fn close(&mut self, _at: usize) {}
    /// An object key, quotes included.
    fn key(&mut self, _key: Span) {}
    /// A string value, quotes included.
    fn string_value(&mut self, _value: Span) {}
}

/// The plain scan: no listener.
impl Visit for () {}

/// Two listeners hear the same pass, `A` before `B`.
impl<A: Visit, B: Visit> Visit for (A, B) {
    #[inline]
    fn value_start(&mut self, at: usize) {
        self.0.value_start(at);
        self.1.value_start(at);
    }
    #[inline]
    fn open(&mut self, at: usize, object: bool) {
        self.0.open(at, object);
        self.1.open(at, object);
    }
    #[inline]
    fn close(&mut self, at: usize) {
        self.0.close(at);
        self.1.close(at);
    }
    #[inline]
    fn key(&mut self, key: Span) {
        self.0.key(key);
        self.1.key(key);
    }
    #[inline]
    fn string_value(&mut self, value: Span) {
        self.0.string_value(value);
        self.1.string_value(value);
    }
}

/// Validates `body` as one JSON object nested at most `max_depth` levels, and returns its top-level members in
/// document order (duplicates kept).
pub fn scan_object(body: &[u8], max_depth: usize) -> Result<Vec<Member>, JsonError> {
    scan_object_with(body, max_depth, &mut ())
}

/// [`scan_object`], telling `visit` the structure as it goes. On an error, what `visit` heard is meaningless.
pub fn scan_object_with<V: Visit>(body: &[u8], max_depth: usize, visit: &mut V) -> Result<Vec<Member>, JsonError> {
    // The UTF-8 check rides on the scan: outside strings only ASCII passes, and inside one every character from
    // 0x80 up is checked where the string skip stops at it. A body that fails either way gets std's whole check,
    // so an invalid byte anywhere is reported as such, at its offset, before any syntax error.
    scan_checked(body, max_depth, visit).map_err(|e| match std::str::from_utf8(body) {
        Err(bad) => JsonError::InvalidUtf8 {
            offset: bad.valid_up_to(),
        },
        Ok(_) => e,
    })
}

fn scan_checked<V: Visit>(body: &[u8], max_depth: usize, visit: &mut V) -> Result<Vec<Member>, JsonError> {
    let mut s = Scanner {
        buf: body,
        pos: 0,
        stack: Vec::with_capacity(max_depth.min(64)),
        max_depth,
        visit,
    };
    s.skip_ws();
    let first = s.peek().ok_or(JsonError::Empty)?;
    // The whole document is validated first, so "not json" is invalid JSON, not "not an object".
    let members = s.run()?;
    s.skip_ws();
    if s.pos != body.len() {
        return Err(s.syntax("end of input"));
    }
    match kind_of(first) {
        Some(Kind::Object) => Ok(members),
        Some(found) => Err(JsonError::NotAnObject { found }),
        None => Err(s.syntax("a JSON value")),
    }
}

/// The kind of the value starting with byte `b`.
pub fn kind_of(b: u8) -> Option<Kind> {
    Some(match b {
        b'{' => Kind::Object,
        b'[' => Kind::Array,
        b'"' => Kind::String,
        b'-' | b'0'..=b'9' => Kind::Number,
        b't' | b'f' => Kind::Bool,
        b'n' => Kind::Null,
        _ => return None,
    })
}

/// What the scanner expects next.
#[derive(Clone, Copy)]
enum Want {
    Value,
    KeyOrClose,
    Key,
    CommaOrCloseObject,
    ValueOrCloseArray,
    CommaOrCloseArray,
}

struct Scanner<'a, V> {
    buf: &'a [u8],
    pos: usize,
    /// Open containers, `{` or `[`; its length is the current depth.
    stack: Vec<u8>,
    max_depth: usize,
    visit: &'a mut V,
}

impl<V: Visit> Scanner<'_, V> {
    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// Moves `pos` forward by `n` bytes. Positions never pass the body's length (at most `isize::MAX`), so the
    /// saturation never happens; it only keeps an impossible overflow from wrapping back to the body's start.
    #[inline(always)]
    fn advance(&mut self, n: usize) {
        self.pos = self.pos.saturating_add(n);
    }

    fn syntax(&self, expected: &'static str) -> JsonError {
        JsonError::Syntax {
            offset: self.pos,
            expected,
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.advance(1);
        }
    }

    /// Scans the whole top-level object; `pos` is at its `{`.
    fn run(&mut self) -> Result<Vec<Member>, JsonError> {
        let mut members = Vec::new();
        let mut pending_key: Option<(Span, bool)> = None;
        let mut value_start = 0;
        let mut want = Want::Value;
        loop {
            self.skip_ws();
            let b = self.peek().ok_or(self.syntax("more input"))?;
            // A top-level member's value starts when we want a value at depth 1.
            if matches!(want, Want::Value) && self.stack.len() == 1 {
                value_start = self.pos;
            }
            let completed_value = match want {
                Want::Value | Want::ValueOrCloseArray => {
                    if b == b']' && matches!(want, Want::ValueOrCloseArray) {
                        self.advance(1);
                        self.stack.pop();
                        self.visit.close(self.pos);
                        true
                    } else {
                        self.value_start(b)?
                    }
                }
                Want::KeyOrClose | Want::Key => {
                    if b == b'}' && matches!(want, Want::KeyOrClose) {
                        self.advance(1);
                        self.stack.pop();
                        self.visit.close(self.pos);
                        true
                    } else if b == b'"' {
                        let start = self.pos;
                        let escaped = self.string()?;
                        let key = Span { start, end: self.pos };
                        self.visit.key(key);
                        if self.stack.len() == 1 {
                            pending_key = Some((key, escaped));
                        }
                        self.skip_ws();
                        if self.peek() != Some(b':') {
                            return Err(self.syntax("':' after an object key"));
                        }
                        self.advance(1);
                        want = Want::Value;
                        continue;
                    } else {
                        return Err(self.syntax("an object key in double quotes"));
                    }
                }
                Want::CommaOrCloseObject | Want::CommaOrCloseArray => {
                    let (close, next) = match want {
                        Want::CommaOrCloseObject => (b'}', Want::Key),
                        _ => (b']', Want::Value),
                    };
                    if b == b',' {
                        self.advance(1);
                        want = next;
                        continue;
                    } else if b == close {
                        self.advance(1);
                        self.stack.pop();
                        self.visit.close(self.pos);
                        true
                    } else {
                        return Err(self.syntax("',' or a closing bracket"));
                    }
                }
            };
            if !completed_value {
                // A container was opened.
                want = match self.stack.last() {
                    Some(b'{') => Want::KeyOrClose,
                    _ => Want::ValueOrCloseArray,
                };
                continue;
            }
            if self.stack.is_empty() {
                return Ok(members);
            }
            if self.stack.len() == 1 {
                if let Some((key, key_escaped)) = pending_key.take() {
                    let value = Span {
                        start: value_start,
                        end: self.pos,
                    };
                    let kind = self
                        .buf
                        .get(value_start)
                        .copied()
                        .and_then(kind_of)
                        .ok_or(self.syntax("a JSON value"))?;
                    members.push(Member {
                        key,
                        key_escaped,
                        value,
                        kind,
                    });
                }
            }
            want = match self.stack.last() {
                Some(b'{') => Want::CommaOrCloseObject,
                _ => Want::CommaOrCloseArray,
            };
        }
    }

    /// Consumes the start of a value. Returns true when the value is complete (a scalar), false when a
    /// container was opened.
    fn value_start(&mut self, b: u8) -> Result<bool, JsonError> {
        self.visit.value_start(self.pos);
        match b {
            b'{' | b'[' => {
                if self.stack.len() >= self.max_depth {
                    return Err(JsonError::TooDeep { limit: self.max_depth });
                }
                self.stack.push(b);
                self.visit.open(self.pos, b == b'{');
                self.advance(1);
                Ok(false)
            }
            b'"' => {
                let start = self.pos;
                self.string()?;
                self.visit.string_value(Span { start, end: self.pos });
                Ok(true)
            }
            b'-' | b'0'..=b'9' => self.number().map(|_| true),
            b't' => self.literal(b"true").map(|_| true),
            b'f' => self.literal(b"false").map(|_| true),
            b'n' => self.literal(b"null").map(|_| true),
            _ => Err(self.syntax("a JSON value")),
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), JsonError> {
        if self.buf.get(self.pos..).is_some_and(|rest| rest.starts_with(word)) {
            self.advance(word.len());
            Ok(())
        } else {
            Err(self.syntax("true, false or null"))
        }
    }

    /// Consumes a string starting at its opening quote. Returns whether it held an escape.
    fn string(&mut self) -> Result<bool, JsonError> {
        self.advance(1);
        let mut escaped = false;
        loop {
            let rest = self.buf.get(self.pos..).unwrap_or_default();
            let stop = super::skip::string_stop_utf8(rest);
            let Some(i) = stop else {
                self.pos = self.buf.len();
                return Err(self.syntax("a closing '\"'"));
            };
            self.advance(i);
            match rest.get(i) {
                Some(b'"') => {
                    self.advance(1);
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    self.escape()?;
                }
                Some(&c) if c >= 0x80 => self.non_ascii()?,
                _ => return Err(self.syntax("no raw control characters inside a string")),
            }
        }
    }

    /// Checks the run of string bytes from a byte of 0x80 or more up to the next `"`, `\` or control byte (or the
    /// end) as UTF-8, and steps over it. The run starts after an ASCII byte and ends before one, on character
    /// boundaries, so it is valid exactly when the body is valid there. Text outside ASCII is usually a run of such
    /// characters: one check per run, not per character.
    fn non_ascii(&mut self) -> Result<(), JsonError> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let run = super::skip::string_stop(rest).unwrap_or(rest.len());
        match std::str::from_utf8(rest.get(..run).unwrap_or_default()) {
            Ok(_) => {
                self.advance(run);
                Ok(())
            }
            Err(e) => Err(JsonError::InvalidUtf8 {
                offset: self.pos.saturating_add(e.valid_up_to()),
            }),
        }
    }

    /// Consumes one escape sequence starting at its backslash.
    fn escape(&mut self) -> Result<(), JsonError> {
        self.advance(1);
        match self.peek() {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.advance(1);
                Ok(())
            }
            Some(b'u') => {
                let unit = self.hex4()?;
                if (0xDC00..0xE000).contains(&unit) {
                    return Err(self.syntax("no lone low surrogate in a \\u escape"));
                }
                if (0xD800..0xDC00).contains(&unit) {
                    if !self.buf.get(self.pos..).is_some_and(|rest| rest.starts_with(b"\\u")) {
                        return Err(self.syntax("a low surrogate after a high surrogate"));
                    }
                    self.advance(1);
                    let low = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return Err(self.syntax("a low surrogate after a high surrogate"));
                    }
                }
                Ok(())
            }
            _ => Err(self.syntax("a valid escape sequence")),
        }
    }

    /// Reads `u` and four hex digits; `pos` is at the `u`.
    fn hex4(&mut self) -> Result<u32, JsonError> {
        let digits = self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.get(1..5))
            .ok_or(self.syntax("four hex digits"))?;
        let mut unit = 0u32;
        for &d in digits {
            let v = (d as char).to_digit(16).ok_or(self.syntax("four hex digits"))?;
            // Four hex digits make at most 0xFFFF: the shift cannot lose bits.
            unit = (unit << 4) | v;
        }
        self.advance(5);
        Ok(unit)
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.advance(1);
        }
        self.pos.saturating_sub(start)
    }

    fn number(&mut self) -> Result<(), JsonError> {
        if self.peek() == Some(b'-') {
            self.advance(1);
        }
        match self.peek() {
            Some(b'0') => self.advance(1),
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.syntax("a digit")),
        }
        if self.peek() == Some(b'.') {
            self.advance(1);
            if self.digits() == 0 {
                return Err(self.syntax("a digit after '.'"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.advance(1);
            if let Some(b'+' | b'-') = self.peek() {
                self.advance(1);
            }
            if self.digits() == 0 {
                return Err(self.syntax("a digit in the exponent"));
            }
        }
        Ok(())
    }
}
