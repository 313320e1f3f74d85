//! Splitting text around special tokens before the tokenizer model runs, the way llama.cpp's
//! `tokenizer_st_partition` does: every control, user-defined and unknown token is a special
//! token; they are tried longest text first, and each one splits every text fragment left at
//! its non-overlapping occurrences, left to right. (Hugging Face's added-token matcher is
//! leftmost-longest instead, which differs where special tokens overlap: "\n\n\n" in Gemma's
//! vocabulary, where every run of newlines is a user-defined token.)

use aho_corasick::AhoCorasick;

/// A piece of the input: text still to tokenize, or a special token already recognised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

pub struct SpecialTokens {
    /// (text, id, control?), longest text first (ties by id, so the order is deterministic).
    /// Control (and unknown) tokens are recognised only when special tokens are parsed;
    /// user-defined ones always are.
    ordered: Vec<(String, u32, bool)>,
    /// All texts of `ordered`, in that order: finds which of them occur in an input at all,
    /// so that a 262K vocabulary with thousands of special tokens costs one scan, not thousands.
    finder: Option<AhoCorasick>,
}

impl SpecialTokens {
    /// `specials`: (text, id, control?) of every special token (empty texts are ignored).
    pub fn new(
        specials: impl IntoIterator<Item = (String, u32, bool)>,
    ) -> anyhow::Result<SpecialTokens> {
        let mut ordered: Vec<(String, u32, bool)> = specials
            .into_iter()
            .filter(|(t, _, _)| !t.is_empty())
            .collect();
        ordered.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let finder = if ordered.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::new(ordered.iter().map(|(t, _, _)| t.as_str()))
                    .map_err(|e| anyhow::anyhow!("cannot index the special tokens: {e}"))?,
            )
        };
        Ok(SpecialTokens { ordered, finder })
    }

    /// Splits `text` into fragments; control tokens only when `parse_control`.
    pub fn partition<'a>(&self, text: &'a str, parse_control: bool) -> Vec<Fragment<'a>> {
        let mut frags = vec![Fragment::Text(text)];
        let Some(finder) = &self.finder else {
            return frags;
        };
        // Which special tokens occur anywhere (overlapping matches included), in `ordered`'s order.
        let mut present: Vec<usize> = finder
            .find_overlapping_iter(text)
            .map(|m| m.pattern().as_usize())
            .collect();
        present.sort_unstable();
        present.dedup();
        for i in present {
            let (special, id, control) = &self.ordered[i];
            if *control && !parse_control {
                continue;
            }
            let id = *id;
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(s) = f else {
                    next.push(f);
                    continue;
                };
                let mut rest = s;
                while let Some(at) = rest.find(special.as_str()) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[at + special.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specials(list: &[(&str, u32)]) -> SpecialTokens {
        SpecialTokens::new(
            list.iter()
                .map(|(t, id)| (t.to_string(), *id, t.starts_with('<'))),
        )
        .unwrap()
    }

    #[test]
    fn longest_special_first_then_shorter_in_what_is_left() {
        let s = specials(&[("\n", 1), ("\n\n", 2), ("\n\n\n", 3), ("<eos>", 9)]);
        use Fragment::*;
        assert_eq!(
            s.partition("a\n\n\n\nb<eos>", true),
            vec![Text("a"), Token(3), Token(1), Text("b"), Token(9)]
        );
        // Five newlines: the three-newline token first, then the two left over.
        assert_eq!(s.partition("\n\n\n\n\n", true), vec![Token(3), Token(2)]);
        assert_eq!(s.partition("plain", true), vec![Text("plain")]);
        // Control tokens stay text unless asked for; user-defined ones never do.
        assert_eq!(s.partition("\n<eos>", false), vec![Token(1), Text("<eos>")]);
    }

    #[test]
    fn no_specials_leaves_text_whole() {
        let s = specials(&[]);
        assert_eq!(s.partition("x<y>", true), vec![Fragment::Text("x<y>")]);
    }
}
