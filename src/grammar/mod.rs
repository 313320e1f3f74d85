//! Constrained decoding on llguidance: what a request may say (a JSON schema, a Lark grammar,
//! a regex), compiled once per request against the model's vocabulary, then one matcher per
//! sequence that masks each step's logits and follows the sampled tokens.
//!
//! - `vocab`: the token trie llguidance walks, built once per model from our tokenizer.
//! - `spec`: the constraint kinds a request can name, and how each becomes a grammar.
//! - `constraint`: the per-sequence matcher (mask, accept, fork).

mod constraint;
mod spec;
mod vocab;

pub use constraint::{Constraint, Mask};
pub use spec::{json_object_schema, schema_as_generated, ConstraintSpec};
pub use vocab::Grammars;
