//! Turning a `BlockStored`'s per-block `extra_keys` into the canonical extras of our key.
//!
//! vLLM publishes extra keys (0.17+) in two shapes: 0.17–0.30 publish the tuples that went
//! into its hash (LoRA name, multimodal `identifier` or `(identifier, offset)`, cache salt);
//! 0.31+ publish them untagged (bare LoRA name, `(identifier, offset)`, bare salt) while the
//! hash itself uses tagged tuples (`("lora", name, path)`, `("mm", id, off)`,
//! `("cache_salt", s)`). We normalise every shape to the untagged one, drop the LoRA entry
//! (the LoRA is our key's namespace instead) and encode what is left. A query's `cache_salt`
//! encodes exactly like an event whose first block carries the bare salt, so salted prompts
//! match salted blocks and nothing else.

use crate::keys::Extras;
use crate::wire::Value;

/// Appends the canonical form of one block's `extra_keys` entry to `out`.
///
/// `lora_name`/`lora_id` are the event's own fields: a leading item equal to them names the
/// LoRA, which the namespace already covers.
pub fn encode_block_extras(entry: &Value<'_>, lora_name: Option<&str>, lora_id: Option<i64>, out: &mut Extras) {
    let items = match entry {
        Value::Nil => return,
        Value::Array(items) => items.as_slice(),
        other => std::slice::from_ref(other),
    };
    let mut items = items.iter().peekable();
    if let Some(first) = items.peek() {
        if is_lora_item(first, lora_name, lora_id) {
            items.next();
        }
    }
    for item in items {
        encode_item(untag(item), out);
    }
}

fn is_lora_item(item: &Value<'_>, lora_name: Option<&str>, lora_id: Option<i64>) -> bool {
    match item {
        Value::Str(s) => lora_name == Some(*s),
        Value::Int(i) => lora_id.is_some_and(|id| i128::from(id) == *i),
        Value::Array(parts) => matches!(parts.first(), Some(Value::Str("lora"))),
        _ => false,
    }
}

/// Strips a 0.31+ hash-side tag, so tagged and untagged forms encode alike.
fn untag<'v, 'a>(item: &'v Value<'a>) -> UntaggedItem<'v, 'a> {
    if let Value::Array(parts) = item {
        match parts.as_slice() {
            [Value::Str("cache_salt"), salt] => return UntaggedItem::One(salt),
            [Value::Str("prompt_embeds"), digest] => return UntaggedItem::One(digest),
            [Value::Str("mm"), rest @ ..] => return UntaggedItem::List(rest),
            _ => {}
        }
    }
    UntaggedItem::One(item)
}

enum UntaggedItem<'v, 'a> {
    One(&'v Value<'a>),
    List(&'v [Value<'a>]),
}

fn encode_item(item: UntaggedItem<'_, '_>, out: &mut Extras) {
    match item {
        UntaggedItem::One(v) => encode_value(v, out),
        UntaggedItem::List(vs) => {
            out.push_list(vs.len());
            vs.iter().for_each(|v| encode_value(v, out));
        }
    }
}

fn encode_value(v: &Value<'_>, out: &mut Extras) {
    match v {
        Value::Str(s) => out.push_str(s),
        Value::Bin(b) => out.push_bytes(b),
        Value::Int(i) => out.push_int(*i),
        Value::Array(vs) => {
            out.push_list(vs.len());
            vs.iter().for_each(|v| encode_value(v, out));
        }
        Value::Nil => out.push_opaque(b'n'),
        Value::Bool(b) => out.push_opaque(if *b { b'T' } else { b'F' }),
        Value::Float(f) => {
            out.push_opaque(b'f');
            out.push_bytes(&f.to_le_bytes());
        }
        Value::Map(entries) => {
            out.push_opaque(b'm');
            out.push_list(entries.len());
            for (k, v) in entries {
                encode_value(k, out);
                encode_value(v, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Extras;

    fn enc(entry: Value<'_>, lora: Option<&str>) -> Extras {
        let mut e = Extras::new();
        encode_block_extras(&entry, lora, None, &mut e);
        e
    }

    fn salt_query(s: &str) -> Extras {
        let mut e = Extras::new();
        e.push_str(s);
        e
    }

    #[test]
    fn plain_and_lora_only_blocks_have_no_extras() {
        assert!(enc(Value::Nil, None).is_empty());
        assert!(enc(Value::Array(vec![Value::Str("sql-lora")]), Some("sql-lora")).is_empty());
        let tagged = Value::Array(vec![Value::Array(vec![Value::Str("lora"), Value::Str("x"), Value::Str("/p")])]);
        assert!(enc(tagged, Some("x")).is_empty());
    }

    #[test]
    fn salt_encodes_like_a_query_salt_in_every_shape() {
        let bare = Value::Array(vec![Value::Str("tenant-a-salt")]);
        assert_eq!(enc(bare, None), salt_query("tenant-a-salt"));
        let with_lora = Value::Array(vec![Value::Str("my-lora"), Value::Str("salt-1")]);
        assert_eq!(enc(with_lora, Some("my-lora")), salt_query("salt-1"));
        let tagged = Value::Array(vec![Value::Array(vec![Value::Str("cache_salt"), Value::Str("salt-1")])]);
        assert_eq!(enc(tagged, None), salt_query("salt-1"));
    }

    #[test]
    fn multimodal_items_are_never_empty_and_tagged_equals_untagged() {
        let untagged = Value::Array(vec![Value::Array(vec![Value::Str("img"), Value::Int(-11)])]);
        let tagged = Value::Array(vec![Value::Array(vec![Value::Str("mm"), Value::Str("img"), Value::Int(-11)])]);
        let a = enc(untagged, None);
        assert!(!a.is_empty());
        assert_eq!(a, enc(tagged, None));
        assert_ne!(a, salt_query("img"));
    }
}
