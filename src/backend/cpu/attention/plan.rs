//! How a batch's attention is cut into units of parallel work: runs of tokens of one span
//! per KV head, or the query heads dealt out when that is too coarse to spread.

use super::AttnToken;

/// A piece of attention work: some query heads of one KV head group, for a run of tokens.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Segment {
    pub tokens: std::ops::Range<usize>,
    pub kv_head: usize,
    /// Query heads within the group (`0..rep` for the whole group).
    pub heads: std::ops::Range<usize>,
}

/// Splits the batch into segments and the segments into units of parallel work.
///
/// A segment is a run of consecutive tokens of one span (up to [`QUERY_CHUNK`] in the tiled
/// path, [`ROW_CHUNK`] in the per-row path) and one KV head, so that each decoded K/V tile
/// serves the whole run. Normally one unit is one segment. When the work is too coarse to
/// spread (one decoding sequence has only `n_head_kv` groups, often fewer than twice the
/// threads), the query heads are instead dealt out in equal contiguous runs, one per thread.
pub(super) fn plan_units(
    tokens: &[AttnToken<'_>],
    n_head_kv: usize,
    rep: usize,
    threads: usize,
) -> (Vec<Segment>, Vec<std::ops::Range<usize>>) {
    let mut runs = Vec::new();
    let mut t = 0;
    while t < tokens.len() {
        let limit = if tokens[t].tiled {
            QUERY_CHUNK
        } else {
            ROW_CHUNK
        };
        let mut end = t + 1;
        while end < tokens.len()
            && end - t < limit
            && tokens[end].tiled == tokens[t].tiled
            && std::ptr::eq(tokens[end].block_table, tokens[t].block_table)
        {
            end += 1;
        }
        runs.push(t..end);
        t = end;
    }
    // Too few units to spread (one decoding sequence has only `n_head_kv` groups, often fewer
    // than twice the threads): the query heads are dealt out instead.
    let split_heads = threads > 1 && runs.len() * n_head_kv < 2 * threads;
    let mut segments = Vec::new();
    let mut units = Vec::new();
    if !split_heads {
        for run in &runs {
            for kv_head in 0..n_head_kv {
                units.push(segments.len()..segments.len() + 1);
                segments.push(Segment {
                    tokens: run.clone(),
                    kv_head,
                    heads: 0..rep,
                });
            }
        }
        return (segments, units);
    }
    // Flatten (run, query head) and give each thread one contiguous part of it.
    let total = runs.len() * n_head_kv * rep;
    let parts = threads.min(total);
    for part in 0..parts {
        let (lo, hi) = (part * total / parts, (part + 1) * total / parts);
        let first = segments.len();
        let mut f = lo;
        while f < hi {
            let (run, head) = (f / (n_head_kv * rep), f % (n_head_kv * rep));
            let (kv_head, h0) = (head / rep, head % rep);
            let h1 = rep.min(h0 + hi - f);
            segments.push(Segment {
                tokens: runs[run].clone(),
                kv_head,
                heads: h0..h1,
            });
            f += h1 - h0;
        }
        units.push(first..segments.len());
    }
    (segments, units)
}

/// Tokens of one span that share each decoded K/V block in the per-row path (a decoding
/// token and its draft tokens).
const ROW_CHUNK: usize = 16;

/// Queries of one span that share each decoded K/V tile in the tiled path.
const QUERY_CHUNK: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_decoding_token_splits_its_heads_evenly_across_threads() {
        let table = [0u32];
        let tok = [AttnToken {
            block_table: &table,
            pos: 3,
            first: 0,
            tiled: false,
        }];
        let (segs, units) = plan_units(&tok, 3, 3, 2);
        assert_eq!(units.len(), 2);
        let heads = |u: &std::ops::Range<usize>| -> usize {
            segs[u.clone()].iter().map(|s| s.heads.len()).sum()
        };
        assert_eq!((heads(&units[0]), heads(&units[1])), (4, 5));
        // Every (KV head, query head) exactly once.
        let mut seen: Vec<(usize, usize)> = segs
            .iter()
            .flat_map(|s| s.heads.clone().map(move |h| (s.kv_head, h)))
            .collect();
        seen.sort();
        let want: Vec<(usize, usize)> = (0..3).flat_map(|g| (0..3).map(move |h| (g, h))).collect();
        assert_eq!(seen, want);
        // Plenty of groups (four sequences): one unit per (token, KV head), whole groups.
        let tables = [[0u32], [1], [2], [3]];
        let many: Vec<AttnToken> = tables
            .iter()
            .map(|t| AttnToken {
                block_table: t,
                pos: 3,
                first: 0,
                tiled: false,
            })
            .collect();
        let (segs, units) = plan_units(&many, 3, 3, 2);
        assert_eq!(units.len(), 12);
        assert!(segs
            .iter()
            .all(|s| s.heads == (0..3) && s.tokens.len() == 1));
        // One sequence's token and its drafts: one run, whose heads are split as above.
        let span: Vec<AttnToken> = (0..4)
            .map(|p| AttnToken {
                block_table: &table,
                pos: p,
                first: 0,
                tiled: false,
            })
            .collect();
        let (segs, units) = plan_units(&span, 3, 3, 2);
        assert_eq!(units.len(), 2);
        assert!(segs.iter().all(|s| s.tokens == (0..4)));
    }
}
