//! Reading OTLP spans straight from the protobuf bytes, without materialising them: a
//! [`SpanRef`] borrows the request and reads only the fields extraction needs; attribute
//! keys are compared as bytes and only the values extraction keeps are checked as UTF-8.
//!
//! Core: pure, no allocation. The framing of each span is checked when it is read; a span
//! whose framing is broken is an error for that span alone. Fields refusal-gate does not read
//! are skipped by wire type and never validated (they are forwarded as they came).

use super::{Array, SpanView, Val};

/// Reads one base-128 varint. Hand-rolled: the hot path reads some fifty of them per span.
#[inline]
fn varint(buf: &mut &[u8]) -> Result<u64, Broken> {
    // Most are one byte: field keys, and the lengths of keys, values and attributes.
    if let Some((&byte, rest)) = buf.split_first() {
        if byte < 0x80 {
            *buf = rest;
            return Ok(u64::from(byte));
        }
    }
    let mut value = 0u64;
    for (i, &byte) in buf.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            if i == 9 && byte > 1 {
                // Past 64 bits: protobuf (and prost, which forwarding re-frames with) rejects
                // it.
                return Err(Broken);
            }
            *buf = &buf[i + 1..];
            return Ok(value);
        }
    }
    Err(Broken)
}

/// A framing error inside one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken;

/// One field: its number and its value bytes (for fixed and varint fields, the raw value).
#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32,
    Bytes(&'a [u8]),
}

/// Iterates the fields of one message; stops with `Err` at the first broken one.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Wire<'a>), Broken>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let item = self.read();
        if item.is_err() {
            self.rest = &[];
        }
        Some(item)
    }
}

impl<'a> Fields<'a> {
    #[inline]
    fn read(&mut self) -> Result<(u32, Wire<'a>), Broken> {
        // A key is at most 32 bits (field numbers below 2^29), as protobuf defines it.
        let key = u32::try_from(varint(&mut self.rest)?).map_err(|_| Broken)?;
        let number = key >> 3;
        let value = match key & 7 {
            0 => Wire::Varint(varint(&mut self.rest)?),
            1 => {
                let (v, rest) = self.rest.split_first_chunk::<8>().ok_or(Broken)?;
                self.rest = rest;
                Wire::Fixed64(u64::from_le_bytes(*v))
            }
            2 => {
                let len = usize::try_from(varint(&mut self.rest)?).map_err(|_| Broken)?;
                if len > self.rest.len() {
                    return Err(Broken);
                }
                let (v, rest) = self.rest.split_at(len);
                self.rest = rest;
                Wire::Bytes(v)
            }
            5 => {
                let (_, rest) = self.rest.split_first_chunk::<4>().ok_or(Broken)?;
                self.rest = rest;
                Wire::Fixed32
            }
            // 3 and 4 are the deprecated groups; 6 and 7 do not exist.
            _ => return Err(Broken),
        };
        if number == 0 {
            return Err(Broken);
        }
        Ok((number, value))
    }
}

fn fields(bytes: &[u8]) -> Fields<'_> {
    Fields { rest: bytes }
}

/// The latest end time (Unix nanoseconds) of the spans of an export request, 0 when it has
/// none: the tracker's clock when a recording is replayed.
pub fn latest_end(body: &[u8]) -> u64 {
    each(body, 1)
        .map_while(Result::ok)
        .flat_map(|rs| each(rs, 2).map_while(Result::ok))
        .flat_map(|ss| each(ss, 2).map_while(Result::ok))
        .filter_map(|span| SpanRef::parse(span).ok())
        .map(|span| span.end())
        .max()
        .unwrap_or(0)
}

/// One field as it stands in its message: its number, all of its bytes (key included), and
/// for a length-delimited field its payload. What re-framing copies or descends into.
#[derive(Debug, Clone, Copy)]
pub struct RawField<'a> {
    /// The field number.
    pub number: u32,
    /// The whole field, key and value.
    pub raw: &'a [u8],
    /// The payload of a length-delimited field; `None` for any other wire type.
    pub payload: Option<&'a [u8]>,
}

/// The fields of one message as they stand, stopping at broken framing: the same reader as
/// the hot path's, so what the frame check accepts, re-framing reads alike.
pub fn raw_fields(bytes: &[u8]) -> impl Iterator<Item = Result<RawField<'_>, Broken>> + '_ {
    let mut fields = fields(bytes);
    std::iter::from_fn(move || {
        let before = fields.rest;
        let item = fields.next()?;
        Some(item.map(|(number, value)| RawField {
            number,
            raw: &before[..before.len() - fields.rest.len()],
            payload: match value {
                Wire::Bytes(b) => Some(b),
                _ => None,
            },
        }))
    })
}

/// The length-delimited fields numbered `wanted`, stopping at broken framing.
pub fn each<'a>(
    bytes: &'a [u8],
    wanted: u32,
) -> impl Iterator<Item = Result<&'a [u8], Broken>> + 'a {
    fields(bytes).filter_map(move |f| match f {
        Ok((n, Wire::Bytes(b))) if n == wanted => Some(Ok(b)),
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    })
}

/// How many spans an `ExportTraceServiceRequest` holds, counted from its framing alone (no
/// span is read), up to the first broken field.
pub fn spans_in(body: &[u8]) -> usize {
    each(body, 1)
        .map_while(Result::ok)
        .flat_map(|resource| each(resource, 2).map_while(Result::ok))
        .map(|scope| each(scope, 2).map_while(Result::ok).count())
        .sum()
}

/// The key and the value (its `AnyValue` bytes, empty when it has none) of one `KeyValue`
/// message; `None` when it is broken. The key stays bytes (the caller compares it with the
/// keys it knows) and the value is read only when it is used ([`Val::decoded`]). Two slices
/// rather than a [`Val`]: returned in plain words, they are read back without a stall.
#[inline(always)]
fn key_value(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    // The fast path: every SDK writes the key (field 1) and then the value (field 2).
    key_then_value(bytes).or_else(|| key_value_fields(bytes))
}

/// [`key_value`] for any other layout, field by field.
#[cold]
#[inline(never)]
fn key_value_fields(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut key = None;
    let mut value: &[u8] = &[];
    for f in fields(bytes) {
        match f.ok()? {
            (1, Wire::Bytes(k)) => key = Some(k),
            (2, Wire::Bytes(v)) => value = v,
            _ => {}
        }
    }
    Some((key?, value))
}

/// `[0x0a len key][0x12 len value]`, exactly; `None` for any other layout.
#[inline(always)]
fn key_then_value(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut b = bytes;
    let key = length_delimited(&mut b, 0x0a)?;
    let value = length_delimited(&mut b, 0x12)?;
    if !b.is_empty() {
        return None;
    }
    Some((key, value))
}

impl<'a> Val<'a> {
    /// The value itself: an [`Val::Encoded`] one read from its `AnyValue` bytes (a string
    /// stays unchecked as UTF-8), any other as it is.
    #[inline]
    pub fn decoded(self) -> Val<'a> {
        let Val::Encoded(bytes) = self else {
            return self;
        };
        // The usual layouts: one string field, or one integer field.
        match bytes.split_first() {
            Some((0x0a, mut rest)) => {
                if let Some(s) = length_delimited_body(&mut rest).filter(|_| rest.is_empty()) {
                    return Val::Raw(s);
                }
            }
            Some((0x18, mut rest)) => {
                if let Some(i) = varint(&mut rest).ok().filter(|_| rest.is_empty()) {
                    return Val::Int(i as i64);
                }
            }
            _ => {}
        }
        any_value(bytes)
    }
}

/// The first element of an `ArrayValue` message (its field 1, an `AnyValue`), read;
/// `Other` when it has none or is broken.
pub fn first_element(bytes: &[u8]) -> Val<'_> {
    for f in fields(bytes) {
        match f {
            Ok((1, Wire::Bytes(value))) => return Val::Encoded(value).decoded(),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Val::Other
}

/// One length-delimited field with this exact key byte.
#[inline]
fn length_delimited<'a>(b: &mut &'a [u8], key: u8) -> Option<&'a [u8]> {
    let (&first, rest) = b.split_first()?;
    if first != key {
        return None;
    }
    *b = rest;
    length_delimited_body(b)
}

#[inline]
fn length_delimited_body<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::try_from(varint(b).ok()?).ok()?;
    if len > b.len() {
        return None;
    }
    let (v, rest) = b.split_at(len);
    *b = rest;
    Some(v)
}

#[inline]
fn any_value(bytes: &[u8]) -> Val<'_> {
    let mut out = Val::Other;
    for f in fields(bytes) {
        out = match f {
            Ok((1, Wire::Bytes(s))) => Val::Raw(s),
            Ok((2, Wire::Varint(b))) => Val::Bool(b != 0),
            Ok((3, Wire::Varint(i))) => Val::Int(i as i64),
            Ok((4, Wire::Fixed64(d))) => Val::Double(f64::from_bits(d)),
            Ok((5, Wire::Bytes(a))) => Val::Array(Array::Encoded(a)),
            Ok(_) => out,
            Err(_) => return Val::Other,
        };
    }
    out
}

/// Calls `f` with the first `max` attributes (field `number`, at most 15, `KeyValue`) of a
/// message; broken ones are skipped, and broken framing ends the walk.
fn attributes<'a>(bytes: &'a [u8], number: u8, max: usize, mut f: impl FnMut(&'a [u8], Val<'a>)) {
    // The attributes stand one after another, each behind this one-byte key: the walk reads
    // that byte and a length rather than decoding every field in general.
    let key = number << 3 | 2;
    let mut rest = bytes;
    let mut read = 0;
    while read < max && !rest.is_empty() {
        let kv = if rest[0] == key {
            rest = &rest[1..];
            length_delimited_body(&mut rest)
        } else {
            // Another field among them: skipped.
            let mut other = fields(rest);
            match other.read() {
                Ok((n, Wire::Bytes(kv))) if n == u32::from(number) => {
                    rest = other.rest;
                    Some(kv)
                }
                Ok(_) => {
                    rest = other.rest;
                    continue;
                }
                Err(Broken) => None,
            }
        };
        let Some(kv) = kv else { return };
        read += 1;
        if let Some((k, v)) = key_value(kv) {
            f(k, Val::Encoded(v));
        }
    }
}

/// A resource's attributes, read in place.
#[derive(Debug, Clone, Copy)]
pub struct ResourceRef<'a> {
    bytes: &'a [u8],
}

impl<'a> ResourceRef<'a> {
    /// The resource of a `ResourceSpans` message (empty when it has none).
    pub fn of(resource_spans: &'a [u8]) -> Result<ResourceRef<'a>, Broken> {
        let mut bytes: &[u8] = &[];
        for r in each(resource_spans, 1) {
            bytes = r?;
        }
        Ok(ResourceRef { bytes })
    }

    /// Calls `f` with the first `max` attributes.
    pub fn attributes(&self, max: usize, f: impl FnMut(&'a [u8], Val<'a>)) {
        attributes(self.bytes, 1, max, f);
    }
}

/// The key byte of `Span.attributes` (field 9, length-delimited).
const ATTRIBUTE: u8 = 9 << 3 | 2;
/// The key bytes of the other `Span` fields read by their key byte: the length-delimited
/// ids (fields 1, 2, 4), name (5) and events (11), and the fixed64 times (7, 8).
const TRACE_ID: u8 = 1 << 3 | 2;
const SPAN_ID: u8 = 2 << 3 | 2;
const PARENT_SPAN_ID: u8 = 4 << 3 | 2;
const NAME: u8 = 5 << 3 | 2;
const EVENT: u8 = 11 << 3 | 2;
const START: u8 = 7 << 3 | 1;
const END: u8 = 8 << 3 | 1;

/// A `Span.Link` message's trace and span ids.
fn link_ids(link: &[u8]) -> Result<(&[u8], &[u8]), Broken> {
    let (mut trace, mut id): (&[u8], &[u8]) = (&[], &[]);
    for f in fields(link) {
        match f? {
            (1, Wire::Bytes(b)) => trace = b,
            (2, Wire::Bytes(b)) => id = b,
            _ => {}
        }
    }
    Ok((trace, id))
}

/// One span, read in place.
#[derive(Debug, Clone, Copy)]
pub struct SpanRef<'a> {
    bytes: &'a [u8],
    /// Where the attributes stand: walking them skips the rest of the span.
    attributes: &'a [u8],
    has_events: bool,
    attribute_count: usize,
    trace_id: &'a [u8],
    span_id: &'a [u8],
    parent_span_id: &'a [u8],
    name: &'a str,
    kind: i32,
    start: u64,
    end: u64,
    status_error: bool,
    /// The status description as it stands on the wire (checked as UTF-8 when read).
    status_message: &'a [u8],
    /// The first link's trace and span ids, when it has one.
    link: Option<(&'a [u8], &'a [u8])>,
}

impl<'a> SpanRef<'a> {
    /// Reads a `Span` message's scalar fields and checks its framing.
    ///
    /// # Errors
    /// [`Broken`] when a field's framing is broken or the name is not UTF-8.
    pub fn parse(bytes: &'a [u8]) -> Result<SpanRef<'a>, Broken> {
        let mut span = SpanRef {
            bytes,
            attributes: &[],
            attribute_count: 0,
            has_events: false,
            trace_id: &[],
            span_id: &[],
            parent_span_id: &[],
            name: "",
            kind: 0,
            start: 0,
            end: 0,
            status_error: false,
            status_message: &[],
            link: None,
        };
        let (mut first, mut last) = (usize::MAX, 0);
        let mut walk = fields(bytes);
        loop {
            let at = bytes.len() - walk.rest.len();
            // The fields read most (every SDK writes fields 1 to 15 behind a one-byte key) are
            // read here by that byte, without decoding the key; the rest, and a key written
            // longer, take the general walk below. Most of a span's fields are attributes:
            // counted and stepped over.
            if let Some((&key, mut rest)) = walk.rest.split_first() {
                match key {
                    ATTRIBUTE => {
                        length_delimited_body(&mut rest).ok_or(Broken)?;
                        walk.rest = rest;
                        span.attribute_count += 1;
                        first = first.min(at);
                        last = bytes.len() - rest.len();
                        continue;
                    }
                    TRACE_ID | SPAN_ID | PARENT_SPAN_ID | NAME | EVENT => {
                        let value = length_delimited_body(&mut rest).ok_or(Broken)?;
                        walk.rest = rest;
                        match key {
                            TRACE_ID => span.trace_id = value,
                            SPAN_ID => span.span_id = value,
                            PARENT_SPAN_ID => span.parent_span_id = value,
                            NAME => span.name = std::str::from_utf8(value).map_err(|_| Broken)?,
                            _ => span.has_events = true,
                        }
                        continue;
                    }
                    START | END => {
                        let (t, rest) = rest.split_first_chunk::<8>().ok_or(Broken)?;
                        walk.rest = rest;
                        let t = u64::from_le_bytes(*t);
                        if key == START {
                            span.start = t;
                        } else {
                            span.end = t;
                        }
                        continue;
                    }
                    _ => {}
                }
            }
            let Some(f) = walk.next() else { break };
            match f? {
                (9, _) => {
                    span.attribute_count += 1;
                    first = first.min(at);
                    last = bytes.len() - walk.rest.len();
                }
                (11, _) => span.has_events = true,
                (1, Wire::Bytes(b)) => span.trace_id = b,
                (2, Wire::Bytes(b)) => span.span_id = b,
                (4, Wire::Bytes(b)) => span.parent_span_id = b,
                (5, Wire::Bytes(b)) => span.name = std::str::from_utf8(b).map_err(|_| Broken)?,
                (6, Wire::Varint(k)) => span.kind = k as i32,
                (7, Wire::Fixed64(t)) => span.start = t,
                (8, Wire::Fixed64(t)) => span.end = t,
                (13, Wire::Bytes(link)) if span.link.is_none() => span.link = Some(link_ids(link)?),
                (15, Wire::Bytes(status)) => {
                    for f in fields(status) {
                        match f? {
                            (2, Wire::Bytes(message)) => span.status_message = message,
                            (3, Wire::Varint(code)) => span.status_error = code == 2,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        if first < last {
            span.attributes = &bytes[first..last];
        }
        Ok(span)
    }
}

impl<'a> SpanView<'a> for SpanRef<'a> {
    fn kind(&self) -> i32 {
        self.kind
    }
    fn name(&self) -> &'a str {
        self.name
    }
    fn start(&self) -> u64 {
        self.start
    }
    fn end(&self) -> u64 {
        self.end
    }
    fn trace_id(&self) -> &'a [u8] {
        self.trace_id
    }
    fn span_id(&self) -> &'a [u8] {
        self.span_id
    }
    fn parent_span_id(&self) -> &'a [u8] {
        self.parent_span_id
    }
    fn status_error(&self) -> bool {
        self.status_error
    }
    fn attributes(&self, max: usize, f: &mut dyn FnMut(&'a [u8], Val<'a>)) {
        attributes(self.attributes, ATTRIBUTE >> 3, max, f);
    }
    fn attribute_count(&self) -> usize {
        self.attribute_count
    }
    fn link(&self) -> Option<(&'a [u8], &'a [u8])> {
        self.link
    }
    fn status_message(&self) -> &'a str {
        std::str::from_utf8(self.status_message).unwrap_or("")
    }
    fn exceptions(&self, f: &mut dyn FnMut(Option<&'a str>, Option<&'a str>) -> bool) {
        if !self.has_events {
            return;
        }
        for event in each(self.bytes, 11).map_while(Result::ok) {
            let mut exception = false;
            let (mut kind, mut message): (Option<&'a str>, Option<&'a str>) = (None, None);
            for field in fields(event).map_while(Result::ok) {
                match field {
                    (2, Wire::Bytes(name)) => exception = name == b"exception",
                    (3, Wire::Bytes(kv)) => match key_value(kv) {
                        Some((b"exception.type", v)) => kind = Val::Encoded(v).as_str(),
                        Some((b"exception.message", v)) => message = Val::Encoded(v).as_str(),
                        _ => {}
                    },
                    _ => {}
                }
            }
            if exception && f(kind, message) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::fixtures::{i, s, span};
    use opentelemetry_proto::tonic::trace::v1::span::Event;
    use opentelemetry_proto::tonic::trace::v1::{Span, Status};
    use prost::Message;

    #[test]
    fn a_span_reads_the_same_from_the_wire_as_from_prost() {
        let mut owned = span(
            "MCP send tools/call lookup",
            vec![
                s("mcp.method.name", "tools/call"),
                i("server.port", -8080),
                s("k", "v"),
            ],
        );
        owned
            .attributes
            .push(opentelemetry_proto::tonic::common::v1::KeyValue {
                key: "d".into(),
                value: Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                    value: Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::DoubleValue(2.5),
                    ),
                }),
                ..Default::default()
            });
        owned
            .attributes
            .push(crate::otlp::fixtures::strings("h", &["3", "x"]));
        owned
            .attributes
            .push(crate::otlp::fixtures::strings("empty", &[]));
        owned.events.push(Event {
            name: "exception".into(),
            attributes: vec![
                s("exception.message", "timed out"),
                s("exception.type", "ReadTimeout"),
            ],
            ..Default::default()
        });
        owned.status = Some(Status {
            code: 2,
            message: "x".into(),
        });
        let bytes = owned.encode_to_vec();
        let wire = SpanRef::parse(&bytes).expect("valid");
        assert_eq!(wire.kind(), owned.kind);
        assert_eq!(wire.name(), owned.name);
        assert_eq!(
            (wire.start(), wire.end()),
            (owned.start_time_unix_nano, owned.end_time_unix_nano)
        );
        assert_eq!(wire.trace_id(), &owned.trace_id[..]);
        assert_eq!(wire.span_id(), &owned.span_id[..]);
        assert!(wire.status_error());
        assert_eq!(shown(&wire), shown(&&owned));
        assert_eq!(shown(&wire).len(), 8);
        assert!(shown(&wire).contains(&"status \"x\"".to_owned()));
        let exception = "exception Some(\"ReadTimeout\"): Some(\"timed out\")";
        assert!(shown(&wire).contains(&exception.to_owned()));
        assert!(shown(&wire).contains(&"h=array, first Some(\"3\")".to_owned()));
    }

    /// A span's attributes, exceptions and status description, each shown as a line.
    fn shown(v: &dyn SpanView<'_>) -> Vec<String> {
        let mut out = Vec::new();
        v.attributes(usize::MAX, &mut |k, val| {
            let shown = match val.decoded() {
                Val::Array(_) => format!("array, first {:?}", val.first().as_str()),
                d => val.as_str().map_or(format!("{d:?}"), str::to_owned),
            };
            out.push(format!("{}={shown}", String::from_utf8_lossy(k)))
        });
        v.exceptions(&mut |t, m| {
            out.push(format!("exception {t:?}: {m:?}"));
            false
        });
        out.push(format!("status {:?}", v.status_message()));
        out
    }

    #[test]
    fn a_span_whose_keys_are_written_long_reads_as_the_usual_one() {
        // The one-byte keys are read directly; the same fields behind keys written in two
        // bytes (a valid, if unusual, varint) take the general path and must read alike.
        let mut owned = span("GET", vec![s("http.request.method", "GET")]);
        owned.parent_span_id = vec![7; 8];
        owned.events.push(Event {
            name: "exception".into(),
            attributes: vec![s("exception.type", "Timeout")],
            ..Default::default()
        });
        owned.status = Some(Status {
            code: 2,
            message: String::new(),
        });
        let short = owned.encode_to_vec();
        let mut long = Vec::new();
        for field in raw_fields(&short) {
            let raw = field.expect("valid").raw;
            if raw[0] < 0x80 {
                long.extend([raw[0] | 0x80, 0x00]);
                long.extend(&raw[1..]);
            } else {
                long.extend(raw);
            }
        }
        assert_eq!(Span::decode(&long[..]).expect("prost reads it"), owned);
        let (a, b) = (
            SpanRef::parse(&short).expect("valid"),
            SpanRef::parse(&long).expect("valid"),
        );
        let read = |v: &SpanRef<'_>| {
            (
                (
                    v.trace_id().to_vec(),
                    v.span_id().to_vec(),
                    v.parent_span_id().to_vec(),
                ),
                v.name().to_owned(),
                (v.kind(), v.start(), v.end(), v.status_error()),
                (v.attribute_count(), shown(v)),
            )
        };
        assert_eq!(read(&a), read(&b));
        assert_eq!(b.parent_span_id(), &[7; 8]);
        assert!(b.status_error());
    }

    #[test]
    fn framing_is_broken_exactly_where_prost_says_so() {
        use prost::encoding::{decode_key, decode_varint};
        let cases: [&[u8]; 5] = [
            // A key past 32 bits (its field number fits in a u32 once shifted).
            &[0xd0, 0xe1, 0xd9, 0x9c, 0x6c, 0x00],
            // A ten-byte varint past 64 bits, and one just within.
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
            ],
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            // The largest field number, and field 0.
            &[0xf8, 0xff, 0xff, 0xff, 0x0f, 0x00],
            &[0x00, 0x00],
        ];
        for bytes in cases {
            let ours = fields(bytes).all(|f| f.is_ok());
            let mut rest = bytes;
            let theirs = decode_key(&mut rest)
                .and_then(|_| decode_varint(&mut rest))
                .is_ok();
            assert_eq!(ours, theirs, "{bytes:02x?}");
        }
    }

    #[test]
    fn the_spans_of_a_request_are_counted_across_its_resources_and_scopes() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
        let scope = |n: usize| ScopeSpans {
            spans: vec![span("s", vec![]); n],
            ..Default::default()
        };
        let resource = |scopes: Vec<ScopeSpans>| ResourceSpans {
            scope_spans: scopes,
            ..Default::default()
        };
        let body = ExportTraceServiceRequest {
            resource_spans: vec![
                resource(vec![scope(2), scope(0), scope(3)]),
                resource(vec![]),
                resource(vec![scope(4)]),
            ],
        }
        .encode_to_vec();
        assert_eq!(spans_in(&body), 9);
        assert_eq!(spans_in(&[]), 0);
        let mut broken = body.clone();
        broken.push(0x0a);
        assert_eq!(spans_in(&broken), 9, "counted up to the broken field");
    }

    #[test]
    fn broken_framing_is_an_error() {
        assert_eq!(SpanRef::parse(&[0x0a, 0x05, 0xff]).err(), Some(Broken));
        assert_eq!(
            SpanRef::parse(&[0x2a, 0x01, 0xff]).err(),
            Some(Broken),
            "a name that is not UTF-8"
        );
    }

    #[test]
    fn a_value_in_the_usual_layouts_reads_as_in_any_other() {
        let read = |bytes: &[u8]| match Val::Encoded(bytes).decoded() {
            Val::Int(i) => format!("int {i}"),
            Val::Raw(s) => format!("str {}", String::from_utf8_lossy(s)),
            Val::Bool(b) => format!("bool {b}"),
            Val::Other => "other".to_string(),
            _ => "else".to_string(),
        };
        assert_eq!(read(&[0x18, 0xac, 0x02]), "int 300");
        assert_eq!(read(&[0x0a, 0x02, b'o', b'k']), "str ok");
        // A field after the first: the general walk, the last one read.
        assert_eq!(read(&[0x18, 0x01, 0x10, 0x01]), "bool true");
        assert_eq!(read(&[0x0a, 0x01, b'x', 0x18, 0x07]), "int 7");
        // Broken: nothing.
        assert_eq!(read(&[0x18, 0xff]), "other");
        assert_eq!(read(&[0x0a, 0x05, b'x']), "other");
    }
}
