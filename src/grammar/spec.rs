//! The constraint kinds requests can name, as llguidance grammars.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON schema (`response_format` `json_schema`, or llama.cpp's `json_schema` field).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax (may embed `%json {...}` schemas).
    Lark(String),
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex(String),
}

impl ConstraintSpec {
    pub fn grammar(&self) -> TopLevelGrammar {
        match self {
            ConstraintSpec::JsonObject => TopLevelGrammar::from_json_schema(json_object_schema()),
            ConstraintSpec::JsonSchema(s) => {
                TopLevelGrammar::from_json_schema(schema_as_generated(s))
            }
            ConstraintSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            ConstraintSpec::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonObject => "json_object",
            ConstraintSpec::JsonSchema(_) => "json_schema",
            ConstraintSpec::Lark(_) => "grammar",
            ConstraintSpec::Regex(_) => "regex",
        }
    }
}

impl ConstraintSpec {
    /// The same constraint on the answer after a reasoning model's `<think>…</think>` block
    /// (free text; `opened`: the prompt already opened the block). A Lark grammar keeps its
    /// own start rule, so it is left as given.
    pub fn after_reasoning(self, opened: bool) -> ConstraintSpec {
        let body = match &self {
            ConstraintSpec::JsonObject => format!("%json {}", json_object_schema()),
            ConstraintSpec::JsonSchema(s) => format!("%json {}", schema_as_generated(s)),
            ConstraintSpec::Regex(r) => format!("/{}/", r.replace('/', "\\/")),
            ConstraintSpec::Lark(_) => return self,
        };
        // THINK runs to the first `</think>` and ends there (its regex admits no other end:
        // the lexer takes the longest match, so the block must end inside the lexeme).
        let open = if opened { "" } else { "\"<think>\" " };
        ConstraintSpec::Lark(format!(
            "start: {open}THINK WS body\nbody: {body}\nTHINK: /(?s:.*)<\\/think>/ & ~/(?s:.*<\\/think>.+)/\nWS: /[ \\t\\r\\n]*/\n"
        ))
    }
}

/// The schema as edgelm generates it:
/// - objects that list `properties` and say nothing of others take no others (llama.cpp's
///   rule: a small model left free to add keys rambles on instead of closing the object);
/// - numbers stay within ±(2^53 - 1) (where a side is unbounded; the integers every JSON
///   parser reads exactly) with at most 10 fraction digits (`multipleOf` 1e-10, where the
///   schema sets none; llguidance reads no finer step exactly, and counts digits, trailing
///   zeros included): llama.cpp bounds both parts by digits too (16 each), and without a bound a
///   sampled run of digits need never end;
/// - compact JSON (`", "` and `": "`, no free whitespace), so that a sampled run of spaces or
///   newlines cannot use up the answer's tokens. A schema's own `x-guidance` options win.
pub fn schema_as_generated(schema: &Value) -> Value {
    let mut s = schema.clone();
    close_objects(&mut s, 0);
    if let Value::Object(o) = &mut s {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    s
}

/// Any JSON object, as `response_format: {"type": "json_object"}` asks, generated like a
/// schema's: `{"type": "object"}` alone leaves its values to llguidance's own JSON, whose
/// numbers have no bound (a small model once wrote 60 digits until its tokens ran out), so
/// every value is spelled out here (recursively) with numbers that `schema_as_generated`
/// bounds as it bounds any schema's.
pub fn json_object_schema() -> Value {
    let value = json!({"$ref": "#/$defs/value"});
    schema_as_generated(&json!({
        "type": "object",
        "additionalProperties": value,
        "$defs": {"value": {"anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            {"type": "number"},
            {"type": "string"},
            {"type": "array", "items": value},
            {"type": "object", "additionalProperties": value},
        ]}},
    }))
}

/// Depth bound: request bodies are small, but a schema is still user input.
const MAX_SCHEMA_DEPTH: usize = 64;

fn close_objects(v: &mut Value, depth: usize) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    let Value::Object(o) = v else { return };
    if is_numeric(o.get("type")) {
        bound_digits(o);
    }
    if o.contains_key("properties")
        && !o.contains_key("additionalProperties")
        && !o.contains_key("patternProperties")
        && !o.contains_key("unevaluatedProperties")
    {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, child) in o.iter_mut() {
        match k.as_str() {
            // allOf members combine: closing each would forbid the others' keys.
            "allOf" | "const" | "enum" | "default" | "examples" | "x-guidance" => {}
            "properties" | "$defs" | "definitions" | "patternProperties" => {
                if let Value::Object(m) = child {
                    m.values_mut().for_each(|c| close_objects(c, depth + 1));
                }
            }
            "anyOf" | "oneOf" | "prefixItems" => {
                if let Value::Array(a) = child {
                    a.iter_mut().for_each(|c| close_objects(c, depth + 1));
                }
            }
            "items" | "additionalProperties" | "not" => close_objects(child, depth + 1),
            _ => {}
        }
    }
}

/// Whether a schema's `type` is (or includes) a number.
fn is_numeric(ty: Option<&Value>) -> bool {
    let numeric = |t: &Value| t == "integer" || t == "number";
    match ty {
        Some(Value::Array(a)) => a.iter().any(numeric),
        Some(t) => numeric(t),
        None => false,
    }
}

/// Bounds a number's digits where the schema leaves them free (see [`schema_as_generated`]);
/// a bound is added only where it keeps the schema's own range satisfiable.
fn bound_digits(o: &mut serde_json::Map<String, Value>) {
    const SAFE: f64 = ((1u64 << 53) - 1) as f64;
    let bound = |o: &serde_json::Map<String, Value>, keys: [&str; 2]| {
        keys.iter().filter_map(|k| o.get(*k)?.as_f64()).next()
    };
    let lower = bound(o, ["minimum", "exclusiveMinimum"]);
    let upper = bound(o, ["maximum", "exclusiveMaximum"]);
    let has = |o: &serde_json::Map<String, Value>, keys: [&str; 2]| {
        keys.iter().any(|k| o.contains_key(*k))
    };
    if !has(o, ["minimum", "exclusiveMinimum"]) && upper.is_none_or(|u| u > -SAFE) {
        o.insert("minimum".into(), json!(-SAFE as i64));
    }
    if !has(o, ["maximum", "exclusiveMaximum"]) && lower.is_none_or(|l| l < SAFE) {
        o.insert("maximum".into(), json!(SAFE as i64));
    }
    if !o.contains_key("multipleOf") && o.get("type") != Some(&json!("integer")) {
        o.insert("multipleOf".into(), json!(1e-10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_objects_are_closed_unless_the_schema_says_otherwise() {
        let s = schema_as_generated(&json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
            "$defs": {"open": {"properties": {}, "additionalProperties": true}},
            "allOf": [{"properties": {"c": {}}}],
        }));
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(s["properties"]["a"]["additionalProperties"], json!(false));
        assert_eq!(s["$defs"]["open"]["additionalProperties"], json!(true));
        assert!(s["allOf"][0].get("additionalProperties").is_none());
        assert_eq!(s["x-guidance"]["whitespace_flexible"], json!(false));
        assert_eq!(
            s["properties"]["a"]["properties"]["b"]["maximum"],
            json!((1i64 << 53) - 1)
        );
    }
}
