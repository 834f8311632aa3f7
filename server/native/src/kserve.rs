//! KServe v2 REST infer requests decoded outside Python, and their responses encoded.
//!
//! `decode` reads a request body, JSON or Triton's binary tensor extension (a JSON header
//! of `Inference-Header-Content-Length` bytes, then the raw little-endian tensors), into
//! contiguous typed buffers.  It takes what well-formed clients send: anything it is not
//! sure of (a malformed or unusual body, FP16 or BYTES data, numbers a datatype does not
//! hold, integers past 2^53 in float data) is left to Python (`None`), whose decoder
//! (server/runtime/tensors.py) answers it, errors and all, so every error message has one source.
//! What it decodes is what that decoder would make of the body.
//!
//! `encode` writes one response of a request's rows of the outputs, as server/runtime/tensors.py's
//! `encode_rest_response` does: JSON data, or binary data after a JSON header.

use std::borrow::Cow;
use std::fmt::Write as _;

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// KServe v2 datatypes decoded here (FP16 and BYTES are left to Python).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F32,
    F64,
}

impl Dtype {
    pub fn from_name(name: &str) -> Option<Dtype> {
        Some(match name {
            "BOOL" => Dtype::Bool,
            "UINT8" => Dtype::U8,
            "UINT16" => Dtype::U16,
            "UINT32" => Dtype::U32,
            "UINT64" => Dtype::U64,
            "INT8" => Dtype::I8,
            "INT16" => Dtype::I16,
            "INT32" => Dtype::I32,
            "INT64" => Dtype::I64,
            "FP32" => Dtype::F32,
            "FP64" => Dtype::F64,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "UINT8",
            Dtype::U16 => "UINT16",
            Dtype::U32 => "UINT32",
            Dtype::U64 => "UINT64",
            Dtype::I8 => "INT8",
            Dtype::I16 => "INT16",
            Dtype::I32 => "INT32",
            Dtype::I64 => "INT64",
            Dtype::F32 => "FP32",
            Dtype::F64 => "FP64",
        }
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// Integer range `[min, max]` (as i128), or None for BOOL and floats.
    fn range(self) -> Option<(i128, i128)> {
        Some(match self {
            Dtype::U8 => (0, u8::MAX as i128),
            Dtype::U16 => (0, u16::MAX as i128),
            Dtype::U32 => (0, u32::MAX as i128),
            Dtype::U64 => (0, u64::MAX as i128),
            Dtype::I8 => (i8::MIN as i128, i8::MAX as i128),
            Dtype::I16 => (i16::MIN as i128, i16::MAX as i128),
            Dtype::I32 => (i32::MIN as i128, i32::MAX as i128),
            Dtype::I64 => (i64::MIN as i128, i64::MAX as i128),
            _ => return None,
        })
    }
}

/// One decoded tensor: little-endian, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Bytes,
}

/// A requested output: its name and its `binary_data` parameter (None: not given).
pub type Requested = (String, Option<bool>);

/// A decoded infer request.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub id: String,
    pub inputs: Vec<Tensor>,
    pub outputs: Option<Vec<Requested>>,
    /// The request's `parameters.binary_data_output`, as Python's truth of it.
    pub binary_output: bool,
}

impl Decoded {
    /// The rows of a request whose inputs all have the same first dimension: such requests
    /// of one signature merge into one batch.
    pub fn rows(&self) -> Option<usize> {
        let first = *self.inputs.first()?.shape.first()?;
        self.inputs.iter().all(|t| t.shape.first() == Some(&first)).then_some(first)
    }
}

#[derive(Deserialize)]
struct RequestJson<'a> {
    #[serde(default)]
    id: Id,
    #[serde(borrow)]
    inputs: Vec<InputJson<'a>>,
    #[serde(default, borrow)]
    outputs: Option<Vec<OutputJson<'a>>>,
    #[serde(default)]
    parameters: Option<serde_json::Map<String, Value>>,
}

/// A request's `id`: a string (anything else, `null` included, Python turns into text).
#[derive(Default)]
struct Id(String);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Id, D::Error> {
        String::deserialize(deserializer).map(Id)
    }
}

#[derive(Deserialize)]
struct InputJson<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    datatype: Cow<'a, str>,
    shape: Vec<u64>,
    #[serde(default)]
    parameters: Option<InputParameters>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct InputParameters {
    #[serde(default)]
    binary_data_size: Option<u64>,
}

#[derive(Deserialize)]
struct OutputJson<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    parameters: Option<Value>,
}

/// Python's `bool(value)` of a JSON value.
fn truth(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Dimensions a tensor may have (as server/runtime/tensors.py's MAX_DIMS).
const MAX_DIMS: usize = 32;

/// The body decoded (see the module documentation); None: leave it to Python.
pub fn decode(body: &Bytes, header_length: Option<usize>) -> Option<Decoded> {
    let (header, binary) = match header_length {
        None => (&body[..], body.slice(0..0)),
        Some(n) if n <= body.len() => (&body[..n], body.slice(n..)),
        Some(_) => return None,
    };
    let text = std::str::from_utf8(header).ok()?;
    if text.starts_with('\u{feff}') {
        return None;
    }
    let request: RequestJson = serde_json::from_str(text).ok()?;
    if request.inputs.is_empty() {
        return None;
    }
    let mut inputs: Vec<Tensor> = Vec::with_capacity(request.inputs.len());
    let mut offset = 0usize;
    for input in &request.inputs {
        if inputs.iter().any(|t| t.name == input.name) || input.shape.len() > MAX_DIMS {
            return None;
        }
        let dtype = Dtype::from_name(&input.datatype)?;
        let shape: Vec<usize> = input.shape.iter().map(|&d| usize::try_from(d).ok()).collect::<Option<_>>()?;
        let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        let bytes = count.checked_mul(dtype.size())?;
        let size = input.parameters.as_ref().and_then(|p| p.binary_data_size);
        let data = match (size, input.data) {
            (Some(size), _) => {
                let size = usize::try_from(size).ok()?;
                if size != bytes || offset.checked_add(size)? > binary.len() {
                    return None;
                }
                offset += size;
                binary.slice(offset - size..offset)
            }
            (None, Some(raw)) => {
                let data = parse_data(raw.get(), dtype)?;
                if data.len() != bytes {
                    return None;
                }
                data
            }
            (None, None) => return None,
        };
        inputs.push(Tensor { name: input.name.to_string(), dtype, shape, data });
    }
    if offset != binary.len() {
        return None;
    }
    let outputs = match request.outputs {
        None => None,
        Some(list) => Some(
            list.into_iter()
                .map(|out| {
                    let flag = match out.parameters {
                        Some(Value::Object(map)) => map.get("binary_data").filter(|v| !v.is_null()).map(truth),
                        _ => None,
                    };
                    (out.name.into_owned(), flag)
                })
                .collect(),
        ),
    };
    let binary_output = request.parameters.as_ref().and_then(|p| p.get("binary_data_output")).is_some_and(truth);
    Some(Decoded { id: request.id.0, inputs, outputs, binary_output })
}

/// A JSON `data` list (flat or nested, rectangular) as little-endian values of `dtype`.
fn parse_data(raw: &str, dtype: Dtype) -> Option<Bytes> {
    let mut flat = Flat { dtype, out: BytesMut::new(), lengths: Vec::new(), depth: 0, leaf_depth: None };
    let mut deserializer = serde_json::Deserializer::from_str(raw);
    flat.deserialize_list(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    Some(flat.out.freeze())
}

/// Flattens nested lists into `out`, checking that they are rectangular: every list at one
/// depth has the same length, and every number is at the same depth.
struct Flat {
    dtype: Dtype,
    out: BytesMut,
    /// The length of the lists seen at each depth.
    lengths: Vec<usize>,
    depth: usize,
    leaf_depth: Option<usize>,
}

impl Flat {
    fn deserialize_list<'de, D: Deserializer<'de>>(&mut self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(ListVisitor(self))
    }

    fn leaf<E: serde::de::Error>(&mut self) -> Result<(), E> {
        match self.leaf_depth {
            None => self.leaf_depth = Some(self.depth),
            Some(depth) if depth == self.depth => {}
            Some(_) => return Err(E::custom("ragged")),
        }
        Ok(())
    }

    fn integer<E: serde::de::Error>(&mut self, value: i128) -> Result<(), E> {
        self.leaf()?;
        let out = &mut self.out;
        match self.dtype {
            Dtype::F32 | Dtype::F64 => {
                if value.unsigned_abs() > 1 << 53 {
                    return Err(E::custom("an integer float data may round twice")); // Python decides
                }
                return self.float(value as f64);
            }
            Dtype::Bool => return Err(E::custom("a number in BOOL data")),
            _ => {}
        }
        let (min, max) = self.dtype.range().expect("integer datatypes have a range");
        if value < min || value > max {
            return Err(E::custom("out of range")); // Python names the range
        }
        match self.dtype.size() {
            1 => out.put_u8(value as u8),
            2 => out.put_u16_le(value as u16),
            4 => out.put_u32_le(value as u32),
            _ => out.put_u64_le(value as u64),
        }
        Ok(())
    }

    fn float<E: serde::de::Error>(&mut self, value: f64) -> Result<(), E> {
        match self.dtype {
            Dtype::F32 => self.out.put_f32_le(value as f32),
            Dtype::F64 => self.out.put_f64_le(value),
            _ => return Err(E::custom("a fraction in integer data")),
        }
        Ok(())
    }
}

struct ListVisitor<'a>(&'a mut Flat);

impl<'de> Visitor<'de> for ListVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let flat = self.0;
        let depth = flat.depth;
        flat.depth += 1;
        let mut count = 0;
        while seq.next_element_seed(Element(flat))?.is_some() {
            count += 1;
        }
        flat.depth = depth;
        match flat.lengths.get(depth) {
            Some(&length) if length != count => return Err(A::Error::custom("ragged")),
            Some(_) => {}
            None => flat.lengths.push(count),
        }
        Ok(())
    }
}

struct Element<'a>(&'a mut Flat);

impl<'de> DeserializeSeed<'de> for Element<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Element<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a number, a boolean or a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        if self.0.leaf_depth.is_some_and(|depth| depth <= self.0.depth) {
            return Err(A::Error::custom("ragged"));
        }
        ListVisitor(self.0).visit_seq(seq)
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<(), E> {
        self.0.integer(value as i128)
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<(), E> {
        self.0.integer(value as i128)
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<(), E> {
        self.0.leaf()?;
        self.0.float(value)
    }

    fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<(), E> {
        self.0.leaf()?;
        if self.0.dtype != Dtype::Bool {
            return Err(E::custom("a boolean in numeric data")); // numpy's rules: Python decides
        }
        self.0.out.put_u8(value as u8);
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Err(A::Error::custom("an object in data"))
    }
}

// --- responses ----------------------------------------------------------------------------

/// One output of a response: values of `dtype` of `shape`, little-endian.
pub struct Output<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
    pub binary: bool,
}

/// What a response is made of besides its outputs.
pub struct Answer<'a> {
    pub model_name: &'a str,
    pub model_version: &'a str,
    pub id: &'a str,
}

/// The response body to one request, and the length of its JSON header when any output is
/// binary (as server/runtime/tensors.py's `encode_rest_response`).
pub fn encode(answer: &Answer, outputs: &[Output]) -> (Vec<u8>, Option<usize>) {
    let mut json = String::with_capacity(128);
    json.push_str("{\"model_name\":");
    json_string(&mut json, answer.model_name);
    json.push_str(",\"model_version\":");
    json_string(&mut json, answer.model_version);
    if !answer.id.is_empty() {
        json.push_str(",\"id\":");
        json_string(&mut json, answer.id);
    }
    json.push_str(",\"outputs\":[");
    let mut chunks: Vec<&[u8]> = Vec::new();
    for (i, output) in outputs.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        let data = output.data;
        json.push_str("{\"name\":");
        json_string(&mut json, output.name);
        let _ = write!(json, ",\"datatype\":\"{}\",\"shape\":[", output.dtype.name());
        for (i, d) in output.shape.iter().enumerate() {
            let _ = write!(json, "{}{d}", if i > 0 { "," } else { "" });
        }
        json.push(']');
        if output.binary {
            let _ = write!(json, ",\"parameters\":{{\"binary_data_size\":{}}}}}", data.len());
            chunks.push(data);
        } else {
            json.push_str(",\"data\":[");
            json_values(&mut json, output.dtype, data);
            json.push_str("]}");
        }
    }
    json.push_str("]}");
    if chunks.is_empty() {
        return (json.into_bytes(), None);
    }
    let header = json.len();
    let mut body = json.into_bytes();
    body.reserve(chunks.iter().map(|c| c.len()).sum());
    for chunk in chunks {
        body.extend_from_slice(chunk);
    }
    (body, Some(header))
}

fn json_string(out: &mut String, text: &str) {
    out.push_str(&serde_json::to_string(text).expect("strings always serialize"));
}

/// A float as orjson writes it (shortest round trip, `1e+22`), or null when not finite.
fn json_float(out: &mut String, value: f64) {
    if !value.is_finite() {
        out.push_str("null");
        return;
    }
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(value);
    match text.find('e') {
        Some(at) if text.as_bytes().get(at + 1) != Some(&b'-') => {
            out.push_str(&text[..=at]);
            out.push('+');
            out.push_str(&text[at + 1..]);
        }
        _ => out.push_str(text),
    }
}

fn json_values(out: &mut String, dtype: Dtype, data: &[u8]) {
    let size = dtype.size();
    for (i, value) in data.chunks_exact(size).enumerate() {
        if i > 0 {
            out.push(',');
        }
        let mut integer = itoa::Buffer::new();
        match dtype {
            Dtype::Bool => out.push_str(if value[0] != 0 { "true" } else { "false" }),
            Dtype::U8 => out.push_str(integer.format(value[0])),
            Dtype::I8 => out.push_str(integer.format(value[0] as i8)),
            Dtype::U16 => out.push_str(integer.format(u16::from_le_bytes([value[0], value[1]]))),
            Dtype::I16 => out.push_str(integer.format(i16::from_le_bytes([value[0], value[1]]))),
            Dtype::U32 => out.push_str(integer.format(u32::from_le_bytes(value.try_into().unwrap()))),
            Dtype::I32 => out.push_str(integer.format(i32::from_le_bytes(value.try_into().unwrap()))),
            Dtype::U64 => out.push_str(integer.format(u64::from_le_bytes(value.try_into().unwrap()))),
            Dtype::I64 => out.push_str(integer.format(i64::from_le_bytes(value.try_into().unwrap()))),
            Dtype::F32 => json_float(out, f32::from_le_bytes(value.try_into().unwrap()) as f64),
            Dtype::F64 => json_float(out, f64::from_le_bytes(value.try_into().unwrap())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(data: &Bytes) -> Vec<f32> {
        data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn json_data_decodes_flat_or_nested() {
        let body = Bytes::from_static(
            br#"{"id":"r1","inputs":[{"name":"DES","datatype":"FP32","shape":[2,2],"data":[[1,2.5],[0.1,-3]]},
               {"name":"CAT","datatype":"INT64","shape":[2,1],"data":[7,-9]}],
               "outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}"#,
        );
        let decoded = decode(&body, None).unwrap();
        assert_eq!(decoded.id, "r1");
        assert_eq!(decoded.rows(), Some(2));
        assert_eq!(floats(&decoded.inputs[0].data), vec![1.0, 2.5, 0.1f64 as f32, -3.0]);
        let keys: Vec<i64> = decoded.inputs[1].data.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(keys, vec![7, -9]);
        assert_eq!(decoded.outputs, Some(vec![("OUTPUT0".to_string(), Some(true))]));
        assert!(!decoded.binary_output);
    }

    #[test]
    fn binary_tensors_are_cut_from_the_body() {
        let header = br#"{"inputs":[{"name":"X","datatype":"INT32","shape":[1,2],"parameters":{"binary_data_size":8}}],"parameters":{"binary_data_output":1}}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        let decoded = decode(&Bytes::from(body.clone()), Some(header.len())).unwrap();
        assert_eq!(&decoded.inputs[0].data[..], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert!(decoded.binary_output);
        body.push(0); // a byte no input claims: Python explains
        assert!(decode(&Bytes::from(body), Some(header.len())).is_none());
    }

    #[test]
    fn what_python_must_judge_is_left_to_it() {
        for body in [
            r#"{"inputs":[{"name":"X","datatype":"INT64","shape":[1],"data":[1.5]}]}"#, // fraction
            r#"{"inputs":[{"name":"X","datatype":"INT8","shape":[1],"data":[300]}]}"#,  // range
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[2],"data":[[1],[2,3]]}]}"#, // ragged
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[2],"data":[1,[2]]}]}"#, // ragged
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[3],"data":[1,2]}]}"#, // count
            r#"{"inputs":[{"name":"X","datatype":"FP16","shape":[1],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[true]}]}"#,
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[9007199254740993]}]}"#,
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":1}]}"#, // not a list
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1.0],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1]},{"name":"X","datatype":"FP32","shape":[1],"data":[1]}]}"#,
            r#"{"id":5,"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1]}]}"#,
            r#"{"id":null,"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1]}]}"#,
            r#"{"inputs":[]}"#,
            r#"[1]"#,
            r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1]}]"#,
        ] {
            assert!(decode(&Bytes::from(body), None).is_none(), "{body}");
        }
    }

    #[test]
    fn empty_and_zero_dim_tensors_decode() {
        let body = Bytes::from_static(br#"{"inputs":[{"name":"X","datatype":"FP32","shape":[0,3],"data":[]},{"name":"S","datatype":"BOOL","shape":[],"data":[true]}]}"#);
        let decoded = decode(&body, None).unwrap();
        assert_eq!(decoded.inputs[0].data.len(), 0);
        assert_eq!(&decoded.inputs[1].data[..], &[1]);
        assert_eq!(decoded.rows(), None); // a scalar has no rows: never merged
    }

    #[test]
    fn responses_write_json_or_binary() {
        // the floats as orjson writes them: np.float32([0.1, nan, 1e22]).astype(object).tolist()
        let values: Vec<u8> = [0.5f32, 0.1, f32::NAN, 1e22].iter().flat_map(|v| v.to_le_bytes()).collect();
        let answer = Answer { model_name: "m", model_version: "1", id: "" };
        let json = Output { name: "OUTPUT0", dtype: Dtype::F32, shape: &[3, 1], data: &values[4..], binary: false };
        let (body, header) = encode(&answer, &[json]);
        assert_eq!(header, None);
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"model_name":"m","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[3,1],"data":[0.10000000149011612,null,9.999999778196308e+21]}]}"#
        );
        let answer = Answer { model_name: "m", model_version: "1", id: "x\"y" };
        let binary = Output { name: "OUTPUT0", dtype: Dtype::F32, shape: &[1, 1], data: &values[..4], binary: true };
        let (body, header) = encode(&answer, &[binary]);
        let header = header.unwrap();
        assert!(std::str::from_utf8(&body[..header]).unwrap().contains(r#""id":"x\"y""#));
        assert_eq!(&body[header..], &0.5f32.to_le_bytes());
    }
}
