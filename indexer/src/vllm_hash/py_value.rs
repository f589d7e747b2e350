//! The Python values vLLM folds into a block hash as `extra_keys`, as the serializers see them.

use super::error::VllmHashError;

/// A Python value that can appear in `extra_keys` (LoRA ids/names, multimodal identifiers and
/// offsets, cache salts, prompt-embeds digests, and tuples of those).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PyValue {
    None,
    /// Python ints are unbounded; i128 covers every value vLLM puts in extra keys.
    Int(i128),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<PyValue>),
}

impl PyValue {
    /// The vectors' JSON convention: arrays are tuples, `"bytes:<hex>"` is bytes, other strings
    /// are str, integers are ints. Floats and bools never occur in vLLM extra keys.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, VllmHashError> {
        use serde_json::Value;
        Ok(match value {
            Value::Null => PyValue::None,
            Value::Number(number) => {
                if let Some(int) = number.as_i64() {
                    PyValue::Int(i128::from(int))
                } else if let Some(int) = number.as_u64() {
                    PyValue::Int(i128::from(int))
                } else {
                    return Err(VllmHashError::InvalidExtraKey(format!("non-integer number {number}")));
                }
            }
            Value::String(text) => match text.strip_prefix("bytes:") {
                Some(hex_digits) => PyValue::Bytes(
                    hex::decode(hex_digits)
                        .map_err(|err| VllmHashError::InvalidExtraKey(format!("{text:?}: {err}")))?,
                ),
                None => PyValue::Str(text.clone()),
            },
            Value::Array(items) => PyValue::Tuple(items.iter().map(PyValue::from_json).collect::<Result<_, _>>()?),
            Value::Bool(_) | Value::Object(_) => {
                return Err(VllmHashError::InvalidExtraKey(format!("unsupported JSON {value}")))
            }
        })
    }
}
