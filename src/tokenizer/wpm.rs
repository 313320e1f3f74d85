//! WordPiece as llama.cpp runs it for `tokenizer.ggml.model = "bert"` (`llm_tokenizer_wpm`):
//! the text is normalised and split into words (whitespace ends a word; punctuation, ASCII
//! symbols and CJK ideographs are words of their own), then each word, prefixed with "▁",
//! is cut greedily into the longest vocabulary pieces from its start; a word with a position
//! no piece starts at becomes one `[UNK]`. The vocabulary stores word-initial pieces with
//! "▁" and continuation pieces bare (the converter's form of BERT's "##" pieces).
//!
//! Normalisation is the peer's, not Unicode's: its "NFD" maps a code point to one base code
//! point (dropping the accent rather than decomposing), and its categories, whitespace and
//! lowercase come from its own tables, copied into `tables.rs`. `[CLS]` and `[SEP]` are added
//! around the input by the caller (`Tokenizer::encode`).

mod tables;

use std::collections::HashMap;

/// llama.cpp's `unicode_cpt_flags` bits that WPM preprocessing reads.
const ACCENT_MARK: u8 = 0x10;
const PUNCTUATION: u8 = 0x20;
const SYMBOL: u8 = 0x40;
const CONTROL: u8 = 0x80;

/// The BertNormalizer options a vocabulary may set (`tokenizer.ggml.normalizer.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Normalizer {
    pub lowercase: bool,
    pub strip_accents: bool,
}

pub struct Wpm {
    /// Each token's bytes to its id (a repeated string keeps its last id, as llama.cpp's map).
    ids: HashMap<Box<[u8]>, u32>,
    /// The longest token, in bytes (how far a match is looked for).
    max_len: usize,
    unk: u32,
    normalizer: Normalizer,
}

impl Wpm {
    /// `tokens`: the vocabulary in id order; `unk`: the id a word without pieces becomes.
    pub fn new(tokens: &[String], unk: u32, normalizer: Normalizer) -> Wpm {
        let mut ids = HashMap::with_capacity(tokens.len());
        let mut max_len = 0;
        for (i, t) in tokens.iter().enumerate() {
            // llama.cpp renames an empty token so that it can never match.
            let text = if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            max_len = max_len.max(text.len());
            ids.insert(text.into_bytes().into_boxed_slice(), i as u32);
        }
        Wpm {
            ids,
            max_len,
            unk,
            normalizer,
        }
    }

    /// Appends the ids of `text` (a fragment between special tokens) to `out`.
    pub fn tokenize(&self, text: &str, out: &mut Vec<u32>) {
        for word in preprocess(text, self.normalizer) {
            self.word(&word, out);
        }
    }

    /// One word: "▁" + word cut into the longest pieces from the left; all or nothing.
    fn word(&self, word: &str, out: &mut Vec<u32>) {
        let text = format!("\u{2581}{word}");
        let bytes = text.as_bytes();
        let n = bytes.len();
        let start = out.len();
        let mut i = 0;
        while i < n {
            let longest = (i + 1..=n.min(i + self.max_len + 1))
                .rev()
                .find_map(|j| self.ids.get(&bytes[i..j]).map(|&id| (id, j)));
            match longest {
                Some((id, j)) => {
                    out.push(id);
                    i = j;
                }
                None => {
                    out.truncate(start);
                    break;
                }
            }
        }
        if out.len() == start {
            out.push(self.unk);
        }
    }
}

/// llama.cpp's `llm_tokenizer_wpm_session::preprocess`: the words of `text`, normalised.
pub fn preprocess(text: &str, opts: Normalizer) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in text.chars() {
        let mut cpt = u32::from(c);
        if opts.strip_accents {
            cpt = nfd_base(cpt);
        }
        let f = flags(cpt);
        if is_whitespace(cpt) {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if cpt == 0 || cpt == 0xFFFD || f & CONTROL != 0 {
            continue;
        }
        if opts.strip_accents && f & ACCENT_MARK != 0 {
            continue;
        }
        let out = if opts.lowercase { lowercase(cpt) } else { cpt };
        let out = char::from_u32(out).unwrap_or('\u{FFFD}');
        let alone = f & PUNCTUATION != 0 || (cpt < 0x7F && f & SYMBOL != 0) || is_chinese(cpt);
        let last = words.last_mut().expect("words is never empty");
        if alone {
            if !last.is_empty() {
                words.push(String::new());
            }
            let last = words.last_mut().expect("words is never empty");
            last.push(out);
            words.push(String::new());
        } else {
            last.push(out);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    words
}

/// The peer's category flags of `cpt` (0 past the last code point).
fn flags(cpt: u32) -> u8 {
    let ranges = &tables::FLAG_RANGES;
    match ranges.partition_point(|&(start, _)| start <= cpt) {
        0 => 0,
        i => ranges[i - 1].1,
    }
}

fn is_whitespace(cpt: u32) -> bool {
    tables::WHITESPACE.binary_search(&cpt).is_ok()
}

fn lowercase(cpt: u32) -> u32 {
    let map = &tables::LOWERCASE;
    match map.binary_search_by_key(&cpt, |&(from, _)| from) {
        Ok(i) => map[i].1,
        Err(_) => cpt,
    }
}

/// The peer's NFD: the base code point of the range `cpt` falls in, or `cpt` itself.
fn nfd_base(cpt: u32) -> u32 {
    let ranges = &tables::NFD;
    match ranges.partition_point(|&(first, _, _)| first <= cpt) {
        0 => cpt,
        i => {
            let (first, last, base) = ranges[i - 1];
            if (first..=last).contains(&cpt) {
                base
            } else {
                cpt
            }
        }
    }
}

/// CJK ideograph blocks, each one a word (llama.cpp's `is_chinese_char`, its ranges as given,
/// one of them copied from Hugging Face's code with its start at 0x2B920).
fn is_chinese(cpt: u32) -> bool {
    const RANGES: [(u32, u32); 8] = [
        (0x4E00, 0x9FFF),
        (0x3400, 0x4DBF),
        (0x20000, 0x2A6DF),
        (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF),
        (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F),
    ];
    RANGES.iter().any(|&(a, b)| (a..=b).contains(&cpt))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BERT: Normalizer = Normalizer {
        lowercase: true,
        strip_accents: true,
    };

    #[test]
    fn words_split_at_whitespace_punctuation_symbols_and_ideographs() {
        let w = preprocess("  Hello,  WORLD!a+b 中文 x\u{7}y", BERT);
        let want = ["hello", ",", "world", "!", "a", "+", "b", "中", "文", "xy"];
        assert_eq!(w, want);
        // A non-ASCII symbol stays inside its word; an ASCII one does not.
        assert_eq!(preprocess("a€b a$b", BERT), ["a€b", "a", "$", "b"]);
    }

    #[test]
    fn accents_go_with_the_peers_nfd_and_case_as_asked() {
        // Precomposed letters map to their base; a combining accent is dropped.
        assert_eq!(
            preprocess("Élan cafe\u{301} Ñ", BERT),
            ["elan", "cafe", "n"]
        );
        let keep = Normalizer {
            lowercase: false,
            strip_accents: false,
        };
        assert_eq!(preprocess("Élan", keep), ["Élan"]);
        assert!(is_whitespace(0x3000) && !is_whitespace(u32::from('a')));
        assert_eq!(lowercase(u32::from('Σ')), u32::from('σ'));
    }

    fn vocab() -> Vec<String> {
        [
            "[UNK]",
            "▁un",
            "▁unaffable",
            "aff",
            "able",
            "▁a",
            "ff",
            "▁",
            "x",
            "",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn greedy_longest_pieces_and_unknown_words() {
        let wpm = Wpm::new(&vocab(), 0, BERT);
        let mut ids = Vec::new();
        wpm.tokenize("Unaffable unaff affx zz", &mut ids);
        // "▁unaffable" whole; "▁un"+"aff"; "▁a"+"ff"+"x"; "zz" has no piece: [UNK].
        assert_eq!(ids, [2, 1, 3, 5, 6, 8, 0]);
        // An empty token never matches.
        assert_eq!(wpm.ids.get(&b""[..]), None);
    }
}
