//! A bounded UBJSON (Universal Binary JSON, draft 12) decoder into `serde_json::Value`,
//! for XGBoost's binary model format (`Booster.save_model("*.ubj")`). XGBoost writes the
//! same document as its JSON format, with numbers big-endian, keys and strings
//! length-prefixed, and most arrays as typed, counted containers (`[$d#L<n>` followed by
//! n big-endian f32). The decoded value is handed to the JSON loader, so both formats
//! share one set of checks.
//!
//! The input is untrusted: every count is checked against the bytes left before anything
//! is allocated (an element takes at least one byte, a typed element its full width),
//! nesting is bounded by [`MAX_NESTING`], and a truncated or malformed document is an
//! error naming the offset, never a panic.

use serde_json::{Map, Number, Value};

/// Deepest nesting of arrays and objects accepted (XGBoost's models nest about 6 deep).
pub(crate) const MAX_NESTING: usize = 64;

/// Decodes a whole UBJSON document; bytes after the first value are an error.
pub(crate) fn decode(bytes: &[u8]) -> Result<Value, String> {
    let mut r = Reader { bytes, pos: 0 };
    let value = r.value(0)?;
    // Trailing no-ops are allowed by the spec; anything else is not.
    while r.pos < bytes.len() && bytes[r.pos] == b'N' {
        r.pos += 1;
    }
    if r.pos != bytes.len() {
        return Err(format!(
            "{} bytes after the document at offset {}",
            bytes.len() - r.pos,
            r.pos
        ));
    }
    Ok(value)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.left() {
            return Err(format!(
                "truncated at offset {}: {n} bytes wanted, {} left",
                self.pos,
                self.left()
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn peek(&self) -> Result<u8, String> {
        self.bytes
            .get(self.pos)
            .copied()
            .ok_or_else(|| format!("truncated at offset {}", self.pos))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// A marker, skipping no-ops (`N`).
    fn marker(&mut self) -> Result<u8, String> {
        loop {
            let m = self.byte()?;
            if m != b'N' {
                return Ok(m);
            }
        }
    }

    /// An integer of the type `marker` names (for lengths and counts).
    fn integer(&mut self, marker: u8) -> Result<i64, String> {
        Ok(match marker {
            b'i' => i8::from_be_bytes(self.array()?) as i64,
            b'U' => u8::from_be_bytes(self.array()?) as i64,
            b'I' => i16::from_be_bytes(self.array()?) as i64,
            b'l' => i32::from_be_bytes(self.array()?) as i64,
            b'L' => i64::from_be_bytes(self.array()?),
            other => {
                return Err(format!(
                    "expected an integer marker at offset {}, found {}",
                    self.pos - 1,
                    show(other)
                ))
            }
        })
    }

    /// A length or count: an integer that is not negative and fits in the bytes left,
    /// each item taking at least `width` bytes.
    fn count(&mut self, what: &str, width: usize) -> Result<usize, String> {
        let at = self.pos;
        let m = self.marker()?;
        let n = self.integer(m)?;
        if n < 0 {
            return Err(format!("negative {what} {n} at offset {at}"));
        }
        let n = n as u64;
        if n.saturating_mul(width.max(1) as u64) > self.left() as u64 {
            return Err(format!(
                "{what} {n} at offset {at} is more than the {} bytes left",
                self.left()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.count("string length", 1)?;
        let at = self.pos;
        let raw = self.take(n)?;
        String::from_utf8(raw.to_vec()).map_err(|_| format!("string at offset {at} is not UTF-8"))
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        let m = self.marker()?;
        self.typed(m, depth)
    }

    /// A value whose marker has been read (or is given by a typed container).
    fn typed(&mut self, marker: u8, depth: usize) -> Result<Value, String> {
        Ok(match marker {
            b'Z' => Value::Null,
            b'T' => Value::Bool(true),
            b'F' => Value::Bool(false),
            b'i' | b'U' | b'I' | b'l' | b'L' => Value::Number(self.integer(marker)?.into()),
            b'd' => float(f32::from_be_bytes(self.array()?) as f64, self.pos - 4)?,
            b'D' => float(f64::from_be_bytes(self.array()?), self.pos - 8)?,
            b'C' => Value::String(char::from(self.byte()?).to_string()),
            b'S' => Value::String(self.string()?),
            b'H' => {
                let at = self.pos;
                let text = self.string()?;
                let n: Number = text
                    .parse()
                    .map_err(|_| format!("high-precision number {text:?} at offset {at}"))?;
                Value::Number(n)
            }
            b'[' => self.container(false, depth + 1)?,
            b'{' => self.container(true, depth + 1)?,
            other => {
                return Err(format!(
                    "unknown marker {} at offset {}",
                    show(other),
                    self.pos - 1
                ))
            }
        })
    }

    fn container(&mut self, object: bool, depth: usize) -> Result<Value, String> {
        if depth > MAX_NESTING {
            return Err(format!(
                "nesting deeper than {MAX_NESTING} at offset {}",
                self.pos - 1
            ));
        }
        // Optional `$type` (which requires `#count`) and `#count`.
        let mut ty = None;
        if self.peek()? == b'$' {
            self.pos += 1;
            let t = self.byte()?;
            if matches!(t, b'[' | b'{' | b'N') {
                return Err(format!(
                    "container type {} at offset {} is not supported",
                    show(t),
                    self.pos - 1
                ));
            }
            ty = Some(t);
            if self.peek()? != b'#' {
                return Err(format!(
                    "typed container without a count at offset {}",
                    self.pos
                ));
            }
        }
        let count = if self.peek()? == b'#' {
            self.pos += 1;
            // Each element (an object's entry: key length and key) takes at least this much.
            let width = match ty {
                Some(b'i' | b'U' | b'C') => 1,
                Some(b'I') => 2,
                Some(b'l' | b'd') => 4,
                Some(b'L' | b'D') => 8,
                // Z, T, F take no bytes per element: bound them like any element.
                _ => 1,
            };
            Some(self.count(
                if object {
                    "entry count"
                } else {
                    "element count"
                },
                width,
            )?)
        } else {
            None
        };
        let element = |r: &mut Self| -> Result<Value, String> {
            match ty {
                Some(t) => r.typed(t, depth),
                None => r.value(depth),
            }
        };
        if object {
            let mut map = Map::new();
            while !self.at_end(count, map.len(), b'}')? {
                let key = self.string()?;
                let v = element(self)?;
                map.insert(key, v);
            }
            Ok(Value::Object(map))
        } else {
            let mut items = Vec::with_capacity(count.unwrap_or(0));
            while !self.at_end(count, items.len(), b']')? {
                items.push(element(self)?);
            }
            Ok(Value::Array(items))
        }
    }

    /// Whether a container is complete: `done` items of a counted one, or (uncounted)
    /// its closing marker next, which is then consumed.
    fn at_end(&mut self, count: Option<usize>, done: usize, close: u8) -> Result<bool, String> {
        match count {
            Some(n) => Ok(done == n),
            None if self.peek()? == close => {
                self.pos += 1;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

fn float(x: f64, at: usize) -> Result<Value, String> {
    Number::from_f64(x)
        .map(Value::Number)
        .ok_or_else(|| format!("non-finite number {x} at offset {at}"))
}

fn show(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}'", b as char)
    } else {
        format!("0x{b:02x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A key or string body: `L` + i64 length + bytes.
    fn s(text: &str) -> Vec<u8> {
        let mut v = vec![b'L'];
        v.extend((text.len() as i64).to_be_bytes());
        v.extend(text.as_bytes());
        v
    }

    #[test]
    fn decodes_the_shapes_xgboost_writes() {
        let mut doc = vec![b'{'];
        doc.extend(s("a"));
        // [$d#L 2 : 0.5, -1.25
        doc.extend(b"[$d#L");
        doc.extend(2i64.to_be_bytes());
        doc.extend(0.5f32.to_be_bytes());
        doc.extend((-1.25f32).to_be_bytes());
        doc.extend(s("b"));
        doc.extend(b"[#U\x02"); // counted, untyped
        doc.push(b'S');
        doc.extend(s("x"));
        doc.extend(b"i\xff");
        doc.extend(s("c"));
        doc.extend(b"[$U#i\x03\x00\x01\xff");
        doc.extend(s("d"));
        doc.extend(b"{}");
        doc.extend(s("e"));
        doc.extend(b"[TFZ]");
        doc.extend(s("f"));
        doc.push(b'l');
        doc.extend((-7i32).to_be_bytes());
        doc.push(b'}');
        let v = decode(&doc).expect("decode");
        assert_eq!(
            v,
            json!({"a": [0.5, -1.25], "b": ["x", -1], "c": [0, 1, 255], "d": {},
                   "e": [true, false, null], "f": -7})
        );
    }

    #[test]
    fn refuses_counts_past_the_end_before_allocating() {
        // 2^40 f32 promised, none present.
        let mut doc = b"[$d#L".to_vec();
        doc.extend((1i64 << 40).to_be_bytes());
        let e = decode(&doc).unwrap_err();
        assert!(e.contains("more than the 0 bytes left"), "{e}");
        // A string longer than the input.
        let mut doc = vec![b'S'];
        doc.extend(s("abc"));
        doc.truncate(doc.len() - 1);
        let e = decode(&doc).unwrap_err();
        assert!(e.contains("string length 3"), "{e}");
        // A negative count.
        let e = decode(b"[#i\xfe").unwrap_err();
        assert!(e.contains("negative element count -2"), "{e}");
    }

    #[test]
    fn refuses_truncation_garbage_and_depth_without_panicking() {
        let e = decode(b"{").unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        let e = decode(b"[d\x00\x00").unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        let e = decode(b"?").unwrap_err();
        assert!(e.contains("unknown marker '?'"), "{e}");
        let e = decode(b"TT").unwrap_err();
        assert!(e.contains("1 bytes after the document"), "{e}");
        let e = decode(b"[$d]").unwrap_err();
        assert!(e.contains("typed container without a count"), "{e}");
        let mut nan = vec![b'd'];
        nan.extend(f32::NAN.to_be_bytes());
        assert!(decode(&nan).unwrap_err().contains("non-finite"));
        let deep = vec![b'['; 10_000];
        let e = decode(&deep).unwrap_err();
        assert!(e.contains("nesting deeper than 64"), "{e}");
        let ok: Vec<u8> = [vec![b'['; MAX_NESTING], vec![b']'; MAX_NESTING]].concat();
        assert!(decode(&ok).is_ok());
        // Every prefix of a valid document is an error, never a panic.
        let mut doc = vec![b'{'];
        doc.extend(s("k"));
        doc.extend(b"[$l#U\x02\x00\x00\x00\x01\x00\x00\x00\x02}");
        assert_eq!(decode(&doc).unwrap(), json!({"k": [1, 2]}));
        for n in 0..doc.len() {
            assert!(decode(&doc[..n]).is_err(), "prefix {n}");
        }
    }
}
