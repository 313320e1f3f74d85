//! Prompt-lookup drafts for speculative decoding: the tokens that followed an earlier
//! occurrence of the sequence's last few tokens. Output that copies its input (extracting
//! fields from a document, quoting, editing code) repeats long runs of the prompt, and a run
//! found this way costs no model at all to propose. The engine verifies every draft in one
//! batched step and keeps only what the model itself would have produced.

/// The longest suffix n-gram looked up first; shorter ones are tried when it has no match.
pub const MAX_NGRAM: usize = 3;
/// A single repeated token is too weak a hint to spend a verification on.
pub const MIN_NGRAM: usize = 2;
/// The draft length a sequence starts with (at most the server's maximum).
pub const FIRST_CAP: usize = 3;

/// The draft cap after a draft of `drafted` tokens of which the first `accepted` held, with
/// `max` the server's maximum: one more after a whole draft held (a copied run goes on), else
/// one more than what held (a wrong guess costs the step its verification). It grows by one,
/// not by doubling: on a CPU each verified token costs real arithmetic (a 5-token step about
/// twice a 1-token one on the reference model), so long drafts pay only when they hold; on
/// the extraction task, drafts of up to 8 went from 1.45× to 1.51× the plain decode rate
/// (`edgelm bench --lookup-task tests/data/lookup-extraction.txt --prompt-lookup 8`).
pub fn next_cap(drafted: usize, accepted: usize, max: usize) -> usize {
    if accepted >= drafted {
        (drafted + 1).clamp(1, max.max(1))
    } else {
        (accepted + 1).min(max.max(1))
    }
}

/// How far back a match is compared to choose among the occurrences of a suffix.
const MAX_CONTEXT: usize = 64;

/// Up to `max_draft` tokens proposed to follow `tokens`: for the longest suffix of
/// `MAX_NGRAM` down to `MIN_NGRAM` tokens that occurred before, what followed the occurrence
/// that agrees with the sequence furthest back (up to [`MAX_CONTEXT`] tokens; the latest of
/// equals). A field name asked for in a question list and given in the document above it
/// occurs twice; the occurrence preceded by what the answer has copied so far is the one in
/// the document, whose value is the right continuation. Empty when nothing matches.
pub fn draft(tokens: &[u32], max_draft: usize) -> Vec<u32> {
    if max_draft == 0 {
        return Vec::new();
    }
    let len = tokens.len();
    for n in (MIN_NGRAM..=MAX_NGRAM).rev() {
        if len <= n {
            continue;
        }
        let suffix = &tokens[len - n..];
        // Occurrences ending at `end` (exclusive), strictly before the suffix itself, so at
        // least one token follows each; the latest first, replaced only by a longer context.
        let mut best: Option<(usize, usize)> = None;
        for end in (n..len).rev() {
            if &tokens[end - n..end] != suffix {
                continue;
            }
            let context = (1..=MAX_CONTEXT)
                .take_while(|&k| end > n + k - 1 && tokens[end - n - k] == tokens[len - n - k])
                .count();
            if best.is_none_or(|(_, c)| context > c) {
                best = Some((end, context));
            }
        }
        if let Some((end, _)) = best {
            return tokens[end..len.min(end + max_draft)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_match_of_the_longest_suffix() {
        // "5 6 7" occurs twice before the end; the later one is followed by 9 8.
        let t = [1, 5, 6, 7, 2, 3, 5, 6, 7, 9, 8, 4, 5, 6, 7];
        assert_eq!(draft(&t, 2), vec![9, 8]);
        assert_eq!(draft(&t, 10), vec![9, 8, 4, 5, 6, 7]);
    }

    #[test]
    fn falls_back_to_shorter_suffixes_and_to_nothing() {
        // No earlier "3 6 7"; "6 7" occurred, followed by 1.
        assert_eq!(draft(&[6, 7, 1, 3, 6, 7], 3), vec![1, 3, 6]);
        // Only the single last token repeats: below MIN_NGRAM.
        assert!(draft(&[7, 1, 2, 7], 4).is_empty());
        assert!(draft(&[1, 2, 3], 4).is_empty());
        assert!(draft(&[], 4).is_empty());
        assert!(draft(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn the_cap_grows_on_whole_drafts_and_shrinks_to_what_held() {
        assert_eq!(next_cap(4, 4, 16), 5);
        assert_eq!(next_cap(16, 16, 16), 16);
        assert_eq!(next_cap(8, 3, 16), 4);
        assert_eq!(next_cap(8, 0, 16), 1);
        assert_eq!(next_cap(2, 2, 1), 1);
    }

    #[test]
    fn the_occurrence_with_the_longest_agreeing_context_wins() {
        // "1 7 8" occurs after "0" and, later, after "5"; the sequence ends "0 1 7 8": the
        // earlier occurrence agrees one token further back and gives its continuation.
        let t = [0, 1, 7, 8, 3, 4, 5, 1, 7, 8, 6, 9, 0, 1, 7, 8];
        assert_eq!(draft(&t, 2), vec![3, 4]);
        // Equal context: the latest.
        let t = [2, 7, 8, 3, 2, 7, 8, 5, 9, 7, 8];
        assert_eq!(draft(&t, 1), vec![5]);
    }

    #[test]
    fn a_periodic_tail_continues_its_period() {
        // The suffix matches one period back; the draft runs into the suffix itself.
        assert_eq!(draft(&[9, 1, 2, 1, 2, 1, 2], 4), vec![1, 2]);
    }
}
