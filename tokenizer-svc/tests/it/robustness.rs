//! Bad input never panics: arbitrary templates, messages, kwargs and text give `Ok` or a typed
//! error, on a tokenizer trained in the test.
use crate::common;

use std::sync::OnceLock;

use crate::common::trained;
use kvindex_tokenizer::{ChatRequest, ClientTemplates, RegistryConfig, TokenizerRegistry};
use proptest::prelude::*;
use serde_json::{json, Value as Json};

fn registry() -> &'static TokenizerRegistry {
    static REGISTRY: OnceLock<TokenizerRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let root = common::scratch_dir("robustness");
        // In process, so a panic in the template environment fails the test (a sandboxed render
        // would only report a crashed worker).
        let mut config = RegistryConfig { client_templates: ClientTemplates::Trusted, ..Default::default() };
        config.add_model("m", trained::chatml_model(&root, "m")).unwrap();
        TokenizerRegistry::new(config)
    })
}

fn json_value() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Json::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4).prop_map(|m| Json::Object(m.into_iter().collect())),
        ]
    })
}

/// Template fragments that combine into valid and invalid Jinja.
fn template() -> impl Strategy<Value = String> {
    let pieces = prop_oneof![
        Just("{% for m in messages %}".to_string()),
        Just("{% endfor %}".to_string()),
        Just("{% if add_generation_prompt %}".to_string()),
        Just("{% endif %}".to_string()),
        Just("{{ m.content }}".to_string()),
        Just("{{ m.content | tojson(indent=2) }}".to_string()),
        Just("{{ m['role'] | trim | upper }}".to_string()),
        Just("{{ tools | length }}".to_string()),
        Just("{{ raise_exception('no') }}".to_string()),
        Just("{{ strftime_now('%d %b %Y') }}".to_string()),
        Just("{% generation %}".to_string()),
        Just("{% endgeneration %}".to_string()),
        Just("{% raw %}".to_string()),
        Just("{% endraw %}".to_string()),
        Just("{{ messages[1:] | map(attribute='role') | join(', ') }}".to_string()),
        Just("{{ m.content.split('x')[0].strip() }}".to_string()),
        ".{0,6}",
    ];
    prop::collection::vec(pieces, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_chats_never_panic(
        messages in prop::collection::vec(json_value(), 0..5),
        tools in prop::option::of(prop::collection::vec(json_value(), 0..3)),
        kwargs in prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..3),
        chat_template in prop::option::of(template()),
        add_generation_prompt in any::<bool>(),
        continue_final_message in any::<bool>(),
    ) {
        let request = ChatRequest {
            messages,
            tools,
            documents: None,
            chat_template,
            add_generation_prompt,
            continue_final_message,
            template_kwargs: kwargs.into_iter().collect(),
        };
        let _ = registry().render_chat("m", &request);
    }

    #[test]
    fn arbitrary_text_tokenizes_with_consistent_offsets(text in ".{0,200}", special in any::<bool>()) {
        let encoded = registry().tokenize("m", &text, special).unwrap();
        prop_assert_eq!(encoded.ids.len(), encoded.offsets.len());
        let chars = text.chars().count() as u32;
        for (start, end) in encoded.offsets {
            prop_assert!(start <= end && end <= chars);
        }
    }
}
