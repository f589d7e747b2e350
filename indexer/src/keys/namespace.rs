//! Which key namespace a block or a query belongs to. Blocks of different models (or LoRA
//! adapters) must never share keys, so the namespace roots every chain; the event path (ingest)
//! and the query path (scoring) both name it through [`namespace_of`].

/// The key namespace of a block: its LoRA name, else the model. A LoRA known only by its
/// integer id (vLLM before 0.14) gets a namespace no query can name, so it never matches the
/// base model by accident.
pub fn namespace_of<'a>(model: &'a str, lora_name: Option<&'a str>, lora_id: Option<i64>) -> std::borrow::Cow<'a, str> {
    match (lora_name, lora_id) {
        (Some(name), _) if !name.is_empty() => name.into(),
        (_, Some(id)) => format!("{model}\u{0}lora-id:{id}").into(),
        _ => model.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_name_else_integer_id_else_model() {
        assert_eq!(namespace_of("m", Some("sql-lora"), Some(3)), "sql-lora");
        assert_eq!(namespace_of("m", Some(""), None), "m");
        assert_eq!(namespace_of("m", None, None), "m");
        let by_id = namespace_of("m", None, Some(3));
        assert_ne!(by_id, "m", "a LoRA known only by id never matches the base model");
        assert_ne!(by_id, namespace_of("m", None, Some(4)));
    }
}
