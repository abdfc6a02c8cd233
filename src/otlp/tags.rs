//! Span attributes written as protobuf directly: one `Span.attributes` entry (field 9, a
//! `KeyValue`) per [`push`], byte for byte what prost would encode, without building the
//! message first — and [`SpanTags`], the attributes to append to each span of a request, all
//! in one buffer. What forwarding appends to a span's bytes.
//!
//! Core: pure protocol code; a request's tags cost no allocation per span.

use prost::encoding::{encode_varint, encoded_len_varint};

/// The value of one attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag<'a> {
    /// A string.
    Str(&'a str),
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
}

/// The attributes to append to each span of one request, in one buffer: span `i`'s are the
/// bytes of `spans[i]` (empty for a span that gets none). A span may also be *withheld*: left
/// out of the request when it is forwarded, to leave later on its own with its call's verdict
/// (DESIGN §11.5); its tags are kept for that.
#[derive(Debug, Default)]
pub struct SpanTags {
    bytes: Vec<u8>,
    /// Each span's tags as (start, length); the length's top bit says it is withheld.
    spans: Vec<(u32, u32)>,
    withheld: usize,
}

/// The bit of a span's tag length that says it is withheld (tags are never 2 GiB).
const WITHHELD: u32 = 1 << 31;

impl SpanTags {
    /// Room for `spans` spans of about `bytes_per_span` bytes of tags each, reserved at once
    /// so that filling it in does not grow it.
    pub fn with_capacity(spans: usize, bytes_per_span: usize) -> SpanTags {
        SpanTags {
            bytes: Vec::with_capacity(spans.saturating_mul(bytes_per_span)),
            spans: Vec::with_capacity(spans),
            withheld: 0,
        }
    }

    /// Adds the next span, with no tags yet; returns its index.
    pub fn push_span(&mut self) -> usize {
        self.spans.push((0, 0));
        self.spans.len() - 1
    }

    /// Sets span `i`'s tags to what `write` appends to the buffer; it is no longer withheld.
    pub fn write(&mut self, i: usize, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.bytes.len();
        write(&mut self.bytes);
        let len = self.bytes.len() - start;
        if let (Some(slot), Ok(start), Ok(len)) = (
            self.spans.get_mut(i),
            u32::try_from(start),
            u32::try_from(len).map(|l| l & !WITHHELD),
        ) {
            if slot.1 & WITHHELD != 0 {
                self.withheld -= 1;
            }
            *slot = (start, len);
        }
    }

    /// Withholds span `i` from the request's forwarding, its tags kept.
    pub fn withhold(&mut self, i: usize) {
        if let Some(slot) = self.spans.get_mut(i) {
            if slot.1 & WITHHELD == 0 {
                slot.1 |= WITHHELD;
                self.withheld += 1;
            }
        }
    }

    /// Whether span `i` is withheld.
    pub fn is_withheld(&self, i: usize) -> bool {
        self.spans.get(i).is_some_and(|s| s.1 & WITHHELD != 0)
    }

    /// How many spans are withheld.
    pub fn withheld(&self) -> usize {
        self.withheld
    }

    /// How many spans it holds.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether it holds no span.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Span `i`'s tags: empty when it has none (or there is no such span).
    pub fn get(&self, i: usize) -> &[u8] {
        self.spans.get(i).map_or(&[], |&(start, len)| {
            let len = len & !WITHHELD;
            &self.bytes[start as usize..(start + len) as usize]
        })
    }
}

/// Appends one `Span.attributes` entry holding `key` = `value` to `out`.
pub fn push(out: &mut Vec<u8>, key: &str, value: Tag<'_>) {
    let len = |n: usize| encoded_len_varint(n as u64) + n;
    // AnyValue: string_value (1), bool_value (2) or int_value (3).
    let any = match value {
        Tag::Str(s) => 1 + len(s.len()),
        Tag::Bool(_) => 2,
        Tag::Int(i) => 1 + encoded_len_varint(i as u64),
    };
    // KeyValue: key (1), value (2).
    let kv = 1 + len(key.len()) + 1 + len(any);
    out.push(9 << 3 | 2);
    encode_varint(kv as u64, out);
    out.push(1 << 3 | 2);
    encode_varint(key.len() as u64, out);
    out.extend_from_slice(key.as_bytes());
    out.push(2 << 3 | 2);
    encode_varint(any as u64, out);
    match value {
        Tag::Str(s) => {
            out.push(1 << 3 | 2);
            encode_varint(s.len() as u64, out);
            out.extend_from_slice(s.as_bytes());
        }
        Tag::Bool(b) => out.extend_from_slice(&[2 << 3, u8::from(b)]),
        Tag::Int(i) => {
            out.push(3 << 3);
            encode_varint(i as u64, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_withheld_span_keeps_its_tags_until_written_again() {
        let mut tags = SpanTags::default();
        let (a, b) = (tags.push_span(), tags.push_span());
        tags.write(a, |out| out.extend_from_slice(b"aa"));
        tags.withhold(a);
        tags.withhold(a);
        tags.withhold(b);
        assert_eq!(
            (tags.withheld(), tags.get(a)),
            (2, &b"aa"[..]),
            "counted once"
        );
        assert!(tags.is_withheld(a) && tags.is_withheld(b));
        tags.write(a, |out| out.extend_from_slice(b"ccc"));
        assert_eq!((tags.withheld(), tags.get(a)), (1, &b"ccc"[..]));
        assert!(!tags.is_withheld(a) && tags.is_withheld(b));
        tags.write(b, |_| {});
        assert_eq!((tags.withheld(), tags.get(b)), (0, &b""[..]));
        assert!(!tags.is_withheld(2), "no such span");
        tags.withhold(2);
        assert_eq!(tags.withheld(), 0);
    }
    use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};

    #[test]
    fn tags_are_encoded_as_prost_encodes_them() {
        let long = "x".repeat(300);
        let cases = [
            (
                "refusal_gate.kind",
                Tag::Str("unverified_refusal"),
                Value::StringValue("unverified_refusal".into()),
            ),
            (
                "refusal_gate.reason",
                Tag::Str(&long),
                Value::StringValue(long.clone()),
            ),
            (
                "refusal_gate.discovery_read",
                Tag::Bool(true),
                Value::BoolValue(true),
            ),
            (
                "refusal_gate.discovery_read",
                Tag::Bool(false),
                Value::BoolValue(false),
            ),
            ("refusal_gate.attempt", Tag::Int(3), Value::IntValue(3)),
            ("refusal_gate.attempt", Tag::Int(-1), Value::IntValue(-1)),
        ];
        for (key, tag, value) in cases {
            let mut ours = Vec::new();
            push(&mut ours, key, tag);
            let mut theirs = Vec::new();
            let kv = KeyValue {
                key: key.into(),
                value: Some(AnyValue { value: Some(value) }),
                ..Default::default()
            };
            prost::encoding::message::encode(9, &kv, &mut theirs);
            assert_eq!(ours, theirs, "{key}");
        }
    }
}
