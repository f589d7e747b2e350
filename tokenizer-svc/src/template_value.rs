//! Request JSON as minijinja values, built directly rather than through serde, the way the
//! in-process render builds a template's globals (`chat_render::render_chat`): what
//! `Value::from_serialize` would make of the JSON, for every filter, test and printer, only
//! cheaper to build and to read. A long chat's next turn converts its whole history on every
//! request, and templates read `message['role']` several times per message.
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectExt, Value};
use serde_json::Value as Json;

/// The map type minijinja's serializer builds for JSON objects (its `ValueMap` with
/// `preserve_order`).
pub type ValueMap = indexmap::IndexMap<Value, Value>;

/// A map at most this long is searched key by key (comparing strings) rather than hashed:
/// minijinja does the same for attribute lookups (`message.role`) on its own maps.
const SCAN_KEYS: usize = 12;

/// `Value::from_serialize(json)`, without the trip through serde: strings and lists are built
/// the way minijinja's serializer builds them (`Value::from(&str)`, a `Vec<Value>` object),
/// objects as a [`JsonObject`] over the same insertion-ordered map; numbers and the rest go
/// through the serializer itself, so their representation (u64, i64 or f64) cannot differ.
pub fn json_value(json: &Json) -> Value {
    match json {
        Json::String(text) => Value::from(text.as_str()),
        Json::Array(items) => Value::from_object(items.iter().map(json_value).collect::<Vec<_>>()),
        Json::Object(map) => {
            let mut entries = ValueMap::with_capacity(map.len());
            for (key, value) in map {
                entries.insert(Value::from(key.as_str()), json_value(value));
            }
            Value::from_object(JsonObject(entries))
        }
        Json::Null | Json::Bool(_) | Json::Number(_) => Value::from_serialize(json),
    }
}

/// A JSON object as a template map: minijinja's own map object, except that a string subscript
/// (`message['role']`, which minijinja hashes) is found by comparing the few keys a message has.
/// Every other behaviour (iteration order, reversal, length, printing, `items()`, equality) is
/// the map's, through the same enumerator.
#[derive(Debug)]
pub struct JsonObject(ValueMap);

impl Object for JsonObject {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str() {
            Some(key) => self.get_value_by_str(key),
            None => self.0.get(key).cloned(),
        }
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        if self.0.len() <= SCAN_KEYS {
            self.0.iter().find_map(|(k, v)| (k.as_str() == Some(key)).then(|| v.clone()))
        } else {
            self.0.get(&Value::from(key)).cloned()
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_rev_key_value_enumerator(|this| Box::new(this.0.iter().map(|(k, v)| (k.clone(), v.clone()))))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template_env::ChatTemplate;
    use proptest::prelude::*;

    /// Any JSON: scalars of every kind (u64 past i64, negative, floats), strings short and long
    /// (minijinja stores short ones inline), nested lists and maps with repeated keys.
    fn any_json() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<u64>().prop_map(Json::from),
            any::<i64>().prop_map(Json::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Json::from),
            ".{0,40}".prop_map(Json::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
                prop::collection::vec(("[a-e]{1,2}", inner), 0..16)
                    .prop_map(|entries| Json::Object(entries.into_iter().collect())),
            ]
        })
    }

    /// Prints a value every way a template can look at it: Python's repr, `tojson`, its tests,
    /// its length, its items in order and the kind of each.
    const PROBE: &str = "{{ v }}|{{ v | tojson }}|{{ v is mapping }}{{ v is sequence }}{{ v is string }}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is none }}{{ v is boolean }}|{{ v | length if v is iterable and v is not none else '-' }}|{{ v == v }}|{% if v is mapping %}{% for k, x in v.items() %}{{ k }}={{ x }}:{{ x is integer }}{{ x is float }}{{ v[k] }}{{ v.get(k) }}{{ k in v }};{% endfor %}{{ v['a'] }}{{ v.a }}{{ v.get('b', 'none') }}{{ 'c' in v }}{{ v[0] }}{{ v.keys() | list }}{{ v.values() | list }}{{ v | reverse | list }}{{ v | dictsort }}{{ v | tojson(indent=1) }}{{ v | string }}{% for k in v %}{{ loop.index }}{{ k }}{{ loop.last }}{% endfor %}{% elif v is sequence and v is not string %}{% for x in v %}{{ loop.index }}{{ x }}{{ loop.last }};{% endfor %}{% endif %}";

    proptest! {
        #[test]
        fn json_value_is_what_from_serialize_makes(json in any_json()) {
            let template = ChatTemplate::compile("probe", PROBE).unwrap();
            let direct = template.render(Value::from_object(ValueMap::from([(Value::from("v"), json_value(&json))])));
            let serialized = template.render(Value::from_serialize(serde_json::json!({ "v": json })));
            prop_assert_eq!(direct.map_err(|e| e.to_string()), serialized.map_err(|e| e.to_string()));
        }
    }
}
