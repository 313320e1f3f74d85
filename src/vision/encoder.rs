//! The ViT, as llama.cpp's `build_vit` computes it for SigLIP: each patch's pixels to a row
//! (the patch convolution as one matmul), its learned position row added, then blocks of
//! layer-normed bidirectional attention and GELU FFN, and a last layer norm. The matrices go
//! through the dense GEMM (mmproj files are mostly F16) or the quantized matmul. It runs a
//! piece at a time, so that an image can be encoded in slices between engine steps.

use super::attention::KeysValues;
use super::config::VisionConfig;
use super::preprocess::Pixels;
use super::weights::{Norm, Qkv, VisionWeights, VitLayer};
use super::workspace::Workspace;
use crate::backend::cpu::ops::{add_in_place, layernorm_in_place, rmsnorm_in_place};
use crate::backend::cpu::parallel::for_row_chunks;
use crate::gguf::GgufFile;
use std::ops::Range;

/// The most patch rows a piece of row-wise work takes: small enough that a piece of a large
/// ViT is a few milliseconds, so that an encoder run in slices between engine steps keeps them
/// short. A view's rows are cut in pieces of equal size (each matrix is read once a piece: a
/// short last piece would pay for it as much as a whole one).
const ROWS_PER_PIECE: usize = 96;

/// Piece sizes are a multiple of this: the AVX-512 GEMM tile's rows (twice the AVX2 one's).
const PIECE_ROWS_STEP: usize = 12;

/// Queries a piece of attention takes: two blocks (`attention::QUERY_BLOCK`) of every head
/// keep two threads evenly busy whatever the count of heads.
const QUERIES_PER_PIECE: usize = 2 * super::attention::QUERY_BLOCK;

/// One image's ViT, run a piece at a time ([`VitRun::piece`]): the patch embedding and each
/// block's row-wise parts by runs of rows, its attention by runs of queries. Every row's
/// arithmetic is the same however the pieces fall.
pub struct VitRun<'a> {
    file: &'a GgufFile,
    w: &'a VisionWeights,
    cfg: &'a VisionConfig,
    /// Qwen2.5-VL: the runs of patch rows that attend only to each other in a windowed
    /// block, and the merged squares in the order the rows take them (window by window),
    /// put back in the grid's order at the end. Empty without windows.
    windows: Vec<Range<usize>>,
    square_order: Vec<usize>,
    /// The rows: the patches, their positions (learned rows, resized to the view's grid
    /// where it differs; Qwen-VL's rotary turns), the residual stream and the blocks'.
    b: Workspace,
    n: usize,
    /// Rows a piece of row-wise work takes.
    piece_rows: usize,
    at: Stage,
    /// The keys and values packed for the attention under way, and the row its run starts at.
    kv: Option<(usize, KeysValues)>,
}

/// Where a run is: the next piece starts at `row`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    Embed {
        row: usize,
    },
    Block {
        layer: usize,
        part: Part,
        row: usize,
    },
    Done,
}

/// A block's parts: the rows' norm and Q, K, V; attention (once all rows have their K and V);
/// the rows' output projection, norm and FFN; and a DeepStack block's merger.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    Qkv,
    Attention,
    Ffn,
    Deepstack,
}

impl<'a> VitRun<'a> {
    pub fn new(
        file: &'a GgufFile,
        w: &'a VisionWeights,
        cfg: &'a VisionConfig,
        pixels: &Pixels,
        mut b: Workspace,
    ) -> VitRun<'a> {
        let ViewPlan {
            n,
            windows,
            square_order,
        } = plan_view(w, cfg, pixels, &mut b);
        b.fit(n, cfg, w);
        VitRun {
            file,
            w,
            cfg,
            windows,
            square_order,
            b,
            n,
            piece_rows: n
                .div_ceil(n.div_ceil(ROWS_PER_PIECE).max(1))
                .next_multiple_of(PIECE_ROWS_STEP),
            at: Stage::Embed { row: 0 },
            kv: None,
        }
    }

    /// Runs the next piece; false once the run is over (then [`VitRun::output`]).
    pub fn piece(&mut self) -> bool {
        let (e, arena) = (self.cfg.n_embd, &self.w.arena);
        let next = match self.at {
            Stage::Embed { row } => {
                let rows = row..(row + self.piece_rows).min(self.n);
                let p = 3 * self.cfg.patch_size * self.cfg.patch_size;
                let b = &mut self.b;
                let x = &mut b.x[rows.start * e..rows.end * e];
                let patches = &b.patches[rows.start * p..rows.end * p];
                self.w.patch.apply(self.file, arena, patches, x);
                if !b.positions.is_empty() {
                    add_in_place(x, &b.positions[rows.start * e..rows.end * e]);
                }
                if let Some(n) = self.w.pre_norm {
                    norm(x, arena, n, self.cfg.eps);
                }
                match rows.end == self.n {
                    true => self.block_start(0),
                    false => Stage::Embed { row: rows.end },
                }
            }
            Stage::Block { layer, part, row } => self.block_piece(layer, part, row),
            Stage::Done => return false,
        };
        self.at = next;
        if next == Stage::Done {
            let b = &mut self.b;
            if let Some(n) = self.w.post_norm {
                norm(&mut b.x, arena, n, self.cfg.eps);
            }
            if !self.square_order.is_empty() {
                // The squares back in the grid's order (the merger's rows are the grid's).
                let k = self.cfg.n_merge;
                b.h.clear();
                for i in grid_order(&self.square_order) {
                    b.h.extend_from_slice(&b.x[i * k * k * e..][..k * k * e]);
                }
                std::mem::swap(&mut b.x, &mut b.h);
            }
        }
        next != Stage::Done
    }

    /// The rows, once the run is over: `x` holds one row of `n_embd` per patch, row-major
    /// by patch row (Qwen-VL: by merged square), `deepstack` each DeepStack block's merged
    /// rows.
    pub fn finish(self) -> Workspace {
        assert_eq!(self.at, Stage::Done, "the ViT has pieces left");
        self.b
    }

    /// The rows a query row `row` of block `layer` attends over: its window's, in a block
    /// that attends within windows; all of them otherwise.
    fn attention_run(&self, layer: usize, row: usize) -> Range<usize> {
        match self.cfg.windows.is_some_and(|w| w.applies_to(layer)) {
            true => self
                .windows
                .iter()
                .find(|r| r.contains(&row))
                .expect("the windows cover every row")
                .clone(),
            false => 0..self.n,
        }
    }

    fn block_start(&self, layer: usize) -> Stage {
        match layer == self.w.layers.len() {
            true => Stage::Done,
            false => Stage::Block {
                layer,
                part: Part::Qkv,
                row: 0,
            },
        }
    }

    /// One piece of block `layer`: `x += attn(ln1(x))`, then `x += ffn(ln2(x))`, by rows.
    fn block_piece(&mut self, layer: usize, part: Part, row: usize) -> Stage {
        let (cfg, arena, file) = (self.cfg, &self.w.arena, self.file);
        let l = &self.w.layers[layer];
        // A windowed block's attention runs a window at a time.
        let run = match part {
            Part::Attention => self.attention_run(layer, row),
            _ => 0..self.n,
        };
        let (e, b) = (cfg.n_embd, &mut self.b);
        let step = match part {
            Part::Attention => QUERIES_PER_PIECE,
            // A DeepStack merger's matrices are read once a piece for a quarter as many
            // (merged) rows as the piece's: twice the rows halve what it reads.
            Part::Deepstack => 2 * self.piece_rows,
            _ => self.piece_rows,
        };
        if part == Part::Deepstack && row == 0 {
            let rows = self.n / (cfg.n_merge * cfg.n_merge);
            b.next_deepstack(rows * cfg.projection_dim);
        }
        let rows = row..(row + step).min(run.end);
        let block = BlockWeights {
            file,
            arena,
            cfg,
            l,
        };
        match part {
            Part::Qkv => block.qkv_rows(b, rows.clone()),
            Part::Attention => {
                let within = run.start * e..run.end * e;
                if self.kv.as_ref().is_none_or(|(at, _)| *at != run.start) {
                    let storage = match self.kv.take() {
                        Some((_, kv)) => kv.into_storage(),
                        None => std::mem::take(&mut b.packed),
                    };
                    let (k, v) = (&b.k[within.clone()], &b.v[within.clone()]);
                    let kv = KeysValues::pack(k, v, cfg.n_head, cfg.head_dim, storage);
                    self.kv = Some((run.start, kv));
                }
                let (_, kv) = self.kv.as_ref().expect("packed above");
                let queries = rows.start - run.start..rows.end - run.start;
                kv.attend(&b.q[within.clone()], queries, &mut b.h[within]);
            }
            Part::Ffn => block.ffn_rows(b, rows.clone()),
            Part::Deepstack => block.deepstack_rows(b, rows.clone()),
        }
        if rows.end < self.n {
            return Stage::Block {
                layer,
                part,
                row: rows.end,
            };
        }
        match part {
            Part::Qkv => Stage::Block {
                layer,
                part: Part::Attention,
                row: 0,
            },
            Part::Attention => {
                if let Some((_, kv)) = self.kv.take() {
                    self.b.packed = kv.into_storage();
                }
                Stage::Block {
                    layer,
                    part: Part::Ffn,
                    row: 0,
                }
            }
            Part::Ffn if l.deepstack.is_some() => Stage::Block {
                layer,
                part: Part::Deepstack,
                row: 0,
            },
            Part::Ffn | Part::Deepstack => self.block_start(layer + 1),
        }
    }
}

/// What a block's row-wise parts read: the file, the vectors, the config and the block's
/// weights.
struct BlockWeights<'a> {
    file: &'a GgufFile,
    arena: &'a [f32],
    cfg: &'a VisionConfig,
    l: &'a VitLayer,
}

impl BlockWeights<'_> {
    /// Rows `rows` of a block before attention: `ln1(x)` to Q, K and V (Qwen-VL: turned by
    /// their patches' rotary turns).
    fn qkv_rows(&self, b: &mut Workspace, rows: Range<usize>) {
        let (file, arena, cfg, l) = (self.file, self.arena, self.cfg, self.l);
        let e = cfg.n_embd;
        let span = rows.start * e..rows.end * e;
        let h = &mut b.h[span.clone()];
        h.copy_from_slice(&b.x[span.clone()]);
        norm(h, arena, l.ln1, cfg.eps);
        let fused = match &l.qkv {
            Qkv::Separate(qkv) => {
                let [q, k, v] = &**qkv;
                for (m, out) in [(q, &mut b.q), (k, &mut b.k), (v, &mut b.v)] {
                    m.apply(file, arena, h, &mut out[span.clone()]);
                }
                None
            }
            Qkv::Fused(qkv) => {
                let fused = &mut b.qkv[rows.start * 3 * e..rows.end * 3 * e];
                qkv.apply(file, arena, h, fused);
                Some(&*fused)
            }
        };
        // Each row's Q, K and V out of the fused row; Q and K turned (Qwen-VL).
        let half = cfg.head_dim / 2;
        let turns = &b.turns[..];
        for (i, out) in [&mut b.q, &mut b.k, &mut b.v].into_iter().enumerate() {
            let turned = i < 2 && !turns.is_empty();
            if fused.is_none() && !turned {
                continue;
            }
            for_row_chunks(&mut out[span.clone()], e, |r0, chunk| {
                if let Some(fused) = fused {
                    for (r, row) in chunk.chunks_exact_mut(e).enumerate() {
                        row.copy_from_slice(&fused[(r0 + r) * 3 * e + i * e..][..e]);
                    }
                }
                if turned {
                    let first = (rows.start + r0) * half;
                    rope_2d(
                        chunk,
                        &turns[first..first + chunk.len() / e * half],
                        cfg.head_dim,
                    );
                }
            });
        }
    }

    /// Rows `rows` of a DeepStack block's output (`x`), each merged square's side by side,
    /// through its norm and MLP into the block's merged rows (the last DeepStack rows).
    fn deepstack_rows(&self, b: &mut Workspace, rows: Range<usize>) {
        let (file, arena, cfg, l) = (self.file, self.arena, self.cfg, self.l);
        let (ln, mlp) = l.deepstack.as_ref().expect("a DeepStack block");
        let span = rows.start * cfg.n_embd..rows.end * cfg.n_embd;
        let h = &mut b.h[span.clone()];
        h.copy_from_slice(&b.x[span.clone()]);
        norm(h, arena, Norm::Layer(*ln), cfg.eps);
        let (merged, d) = (cfg.n_merge * cfg.n_merge, cfg.projection_dim);
        let out = b
            .deepstack
            .last_mut()
            .expect("made at the block's first piece");
        let out = &mut out[rows.start / merged * d..rows.end / merged * d];
        mlp.apply(file, arena, h, &mut b.proj[span], out);
    }

    /// Rows `rows` of a block after attention (`b.h` holds the attention's output):
    /// `x += out(h)`, then `x += ffn(ln2(x))`.
    fn ffn_rows(&self, b: &mut Workspace, rows: Range<usize>) {
        let (file, arena, cfg, l) = (self.file, self.arena, self.cfg, self.l);
        let (e, f) = (cfg.n_embd, cfg.n_ff);
        let span = rows.start * e..rows.end * e;
        let x = &mut b.x[span.clone()];
        let proj = &mut b.proj[span.clone()];
        l.out.apply(file, arena, &b.h[span.clone()], proj);
        add_in_place(x, proj);
        let h = &mut b.h[span.clone()];
        h.copy_from_slice(x);
        norm(h, arena, l.ln2, cfg.eps);
        let up = &mut b.up[rows.start * f..rows.end * f];
        let gate = match b.gate.is_empty() {
            true => &mut [][..],
            false => &mut b.gate[rows.start * f..rows.end * f],
        };
        l.ffn.apply(file, arena, h, (up, gate), proj);
        add_in_place(x, proj);
    }
}

fn norm(x: &mut [f32], arena: &[f32], norm: Norm, eps: f32) {
    match norm {
        Norm::Layer(n) => {
            let (w, b) = (n.weight.of(arena), n.bias.of(arena));
            for_row_chunks(x, w.len(), |_, rows| layernorm_in_place(rows, w, b, eps));
        }
        Norm::Rms(w) => {
            let w = w.of(arena);
            for_row_chunks(x, w.len(), |_, rows| rmsnorm_in_place(rows, w, eps));
        }
    }
}

/// What a view's run needs besides its rows: its patch rows, and Qwen2.5-VL's windows
/// (runs of rows) and the order they take the merged squares in (both empty without windows).
pub struct ViewPlan {
    pub n: usize,
    pub windows: Vec<Range<usize>>,
    pub square_order: Vec<usize>,
}

/// A view's inputs, written into `b`, in the order the ViT takes its patches (the grid's, or
/// Qwen-VL's by merged square and window): each patch's pixels, its learned position row
/// (resized to the view's grid where it differs) and its rotary turns (Qwen-VL).
pub fn plan_view(
    w: &VisionWeights,
    cfg: &VisionConfig,
    pixels: &Pixels,
    b: &mut Workspace,
) -> ViewPlan {
    let (p, e) = (cfg.patch_size, cfg.n_embd);
    let grid = (pixels.width / p, pixels.height / p);
    let (mut order, mut windows, mut square_order) = (Vec::new(), Vec::new(), Vec::new());
    if cfg.kind.merges_squares() {
        (order, windows, square_order) = qwen_order(grid, cfg);
    }
    im2col(pixels, p, &order, &mut b.patches);
    b.positions.clear();
    if let Some(rows) = w.positions {
        let side = cfg.image_size / p;
        let from = (rows.of(&w.arena), (side, side));
        resized_grid(from, e, grid, &order, &mut b.positions);
    }
    b.turns.clear();
    for &i in &order {
        rope_turns((i / grid.0, i % grid.0), cfg.head_dim, &mut b.turns);
    }
    ViewPlan {
        n: grid.0 * grid.1,
        windows,
        square_order,
    }
}

/// Where each merged square of the grid (in the grid's order) is among squares taken in
/// `square_order`: the gather that puts them back.
pub fn grid_order(square_order: &[usize]) -> Vec<usize> {
    let mut at = vec![0; square_order.len()];
    for (i, &square) in square_order.iter().enumerate() {
        at[square] = i;
    }
    at
}

/// Each patch's pixels as one row, in the order of the convolution kernel's values:
/// channel, then row, then column within the patch (ggml's `im2col`); the patches taken in
/// `order` (indices into the grid, row-major), or row-major where `order` is empty.
fn im2col(pixels: &Pixels, p: usize, order: &[usize], rows: &mut Vec<f32>) {
    let columns = pixels.width / p;
    let n = columns * (pixels.height / p);
    rows.clear();
    let mut patch = |i: usize| {
        let (px, py) = (i % columns, i / columns);
        for c in 0..3 {
            for ky in 0..p {
                let y = py * p + ky;
                rows.extend((0..p).map(|kx| pixels.at(px * p + kx, y, c)));
            }
        }
    };
    match order.is_empty() {
        true => (0..n).for_each(&mut patch),
        false => order.iter().for_each(|&i| patch(i)),
    }
}

/// The patches of a `grid` (columns, rows) in merged-square order: each `k` × `k` square's
/// patches row-major, the squares row-major (the order llama.cpp's Qwen-VL graphs permute
/// the patch rows into, and Idefics3's pixel shuffle puts side by side).
pub fn merge_order((columns, lines): (usize, usize), k: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(columns * lines);
    for sy in 0..lines / k {
        for sx in 0..columns / k {
            for dy in 0..k {
                order.extend((0..k).map(|dx| (sy * k + dy) * columns + sx * k + dx));
            }
        }
    }
    order
}

/// The order of a Qwen-VL grid's patch rows (`grid`: columns, rows): by merged square (each
/// square's 2 × 2 patches in a run, so that the merger takes runs of rows), the squares
/// window by window where blocks attend within windows; then the windows' runs of rows and
/// the squares' order (both empty without windows).
fn qwen_order(
    grid: (usize, usize),
    cfg: &VisionConfig,
) -> (Vec<usize>, Vec<Range<usize>>, Vec<usize>) {
    let k = cfg.n_merge;
    let order = merge_order(grid, k);
    let Some(win) = cfg.windows else {
        return (order, Vec::new(), Vec::new());
    };
    let (squares, runs) = window_order((grid.0 / k, grid.1 / k), win.side);
    let patches = (squares.iter())
        .flat_map(|&s| order[s * k * k..][..k * k].to_vec())
        .collect();
    let rows = (runs.iter())
        .map(|r| r.start * k * k..r.end * k * k)
        .collect();
    (patches, rows, squares)
}

/// Qwen2.5-VL's windows over a grid of merged squares (columns, rows): the squares window by
/// window (each window's row-major, the windows row-major; those at the right and bottom
/// edges cut short), and each window's run in that order (llama.cpp's `inv_window_idx`).
fn window_order((columns, lines): (usize, usize), side: usize) -> (Vec<usize>, Vec<Range<usize>>) {
    let (mut order, mut runs) = (Vec::with_capacity(columns * lines), Vec::new());
    for y in (0..lines).step_by(side) {
        for x in (0..columns).step_by(side) {
            let start = order.len();
            for row in y..(y + side).min(lines) {
                order.extend((x..(x + side).min(columns)).map(|c| row * columns + c));
            }
            runs.push(start..order.len());
        }
    }
    (order, runs)
}

/// A grid of rows of `width` (`from`: the rows, row-major, and the grid's columns and rows)
/// resized to the grid `to`, bilinear with the corners aligned: ggml's `interpolate` with
/// `ALIGN_CORNERS`, in its f32 arithmetic; the same grid is kept as it is. The cells are
/// written to `out` in `order` (indices into `to`, row-major), or row-major where it is empty.
fn resized_grid(
    (rows, from): (&[f32], (usize, usize)),
    width: usize,
    to: (usize, usize),
    order: &[usize],
    out: &mut Vec<f32>,
) {
    // Where output index `i` reads in an input of `n` (ggml's scale factor, corners aligned).
    let source = |i: usize, n_out: usize, n_in: usize| -> (usize, usize, f32) {
        let scale = match n_out > 1 && n_in > 1 {
            true => (n_out - 1) as f32 / (n_in - 1) as f32,
            false => n_out as f32 / n_in as f32,
        };
        let at = i as f32 / scale;
        let first = (at.floor() as usize).min(n_in - 1);
        let next = (first + 1).min(n_in - 1);
        (first, next, (at - first as f32).clamp(0.0, 1.0))
    };
    let at = |x: usize, y: usize| &rows[(y * from.0 + x) * width..][..width];
    let mut cell = |i: usize| {
        let (ox, oy) = (i % to.0, i / to.0);
        if from == to {
            return out.extend_from_slice(at(ox, oy));
        }
        let (y0, y1, dy) = source(oy, to.1, from.1);
        let (x0, x1, dx) = source(ox, to.0, from.0);
        let (a, b, c, d) = (at(x0, y0), at(x1, y0), at(x0, y1), at(x1, y1));
        out.extend((0..width).map(|i| {
            a[i] * (1.0 - dx) * (1.0 - dy)
                + b[i] * dx * (1.0 - dy)
                + c[i] * (1.0 - dx) * dy
                + d[i] * dx * dy
        }));
    };
    match order.is_empty() {
        true => (0..to.0 * to.1).for_each(&mut cell),
        false => order.iter().for_each(|&i| cell(i)),
    }
}

/// Qwen-VL's 2-D rotary turns (cos, sin) for a patch at `(row, column)` of the grid, one
/// per pair of a head of `hd`, appended to `turns`; as ggml's `rope_multi` in vision mode
/// computes them: the first quarter of the pairs turn by the patch's row, the second by its
/// column, at base 10,000 over `hd/2` dimensions.
fn rope_turns((y, x): (usize, usize), hd: usize, turns: &mut Vec<(f32, f32)>) {
    let (half, quarter) = (hd / 2, hd / 4);
    let scale = 10_000f32.powf(-2.0 / half as f32);
    // ggml multiplies each section's angle by the scale pair after pair (the second
    // section's restarting from its own position), in f32.
    let (mut by_row, mut by_column) = (y as f32, x as f32);
    for i in 0..half {
        if i == quarter {
            by_column = x as f32;
        }
        let theta = if i < quarter { by_row } else { by_column };
        turns.push((theta.cos(), theta.sin()));
        by_row *= scale;
        by_column *= scale;
    }
}

/// Rows of heads of `hd` turned by their rows' [`rope_turns`] (`hd / 2` a row): each head's
/// dimension `i` turns with `i + hd/2`.
fn rope_2d(rows: &mut [f32], turns: &[(f32, f32)], hd: usize) {
    let half = hd / 2;
    let width = rows.len() / (turns.len() / half);
    for (row, turns) in rows.chunks_exact_mut(width).zip(turns.chunks_exact(half)) {
        for head in row.chunks_exact_mut(hd) {
            let (a, b) = head.split_at_mut(half);
            for ((a, b), &(cos, sin)) in a.iter_mut().zip(b).zip(turns) {
                (*a, *b) = (*a * cos - *b * sin, *a * sin + *b * cos);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_squares_take_their_patches_in_runs() {
        // A 4 × 2 grid in squares of 2: the left square's four patches, then the right's.
        assert_eq!(merge_order((4, 2), 2), vec![0, 1, 4, 5, 2, 3, 6, 7]);
    }

    #[test]
    fn windows_take_their_squares_in_runs_and_the_edges_cut_short() {
        // A 3 × 3 grid of squares in windows of 2: the top-left window's four, the
        // top-right's two, the bottom-left's two, the last one.
        let (order, runs) = window_order((3, 3), 2);
        assert_eq!(order, vec![0, 1, 3, 4, 2, 5, 6, 7, 8]);
        assert_eq!(runs, vec![0..4, 4..6, 6..8, 8..9]);
    }

    #[test]
    fn a_grid_resized_with_aligned_corners_keeps_its_corners_and_blends_between() {
        // A 2 × 2 grid of one-value rows to 3 × 3: corners kept, the centre their mean.
        let resized = |rows: &[f32], width, from, to, order: &[usize]| {
            let mut out = Vec::new();
            resized_grid((rows, from), width, to, order, &mut out);
            out
        };
        let out = resized(&[0.0, 1.0, 2.0, 3.0], 1, (2, 2), (3, 3), &[]);
        assert_eq!(out, vec![0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 2.5, 3.0]);
        assert_eq!(resized(&[7.0, 8.0], 2, (1, 1), (1, 1), &[]), vec![7.0, 8.0]);
        // Taken in an order: the same cells, in that order.
        let out = resized(&[0.0, 1.0, 2.0, 3.0], 1, (2, 2), (3, 3), &[8, 4, 0]);
        assert_eq!(out, vec![3.0, 1.5, 0.0]);
    }

    #[test]
    fn patches_come_in_the_order_asked() {
        // A 4 × 2 image of patches of 2, each pixel's channels its x, y and 0.
        let mut data = Vec::new();
        for y in 0..2 {
            for x in 0..4 {
                data.extend([x as f32, y as f32, 0.0]);
            }
        }
        let pixels = Pixels::new(4, 2, data);
        let (mut grid, mut ordered) = (Vec::new(), Vec::new());
        im2col(&pixels, 2, &[], &mut grid);
        im2col(&pixels, 2, &[1, 0], &mut ordered);
        // Patch 0's red channel (x) row by row, then its green (y), then its blue.
        assert_eq!(
            &grid[..12],
            &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        );
        assert_eq!((&ordered[..12], &ordered[12..]), (&grid[12..], &grid[..12]));
    }

    #[test]
    fn rotary_positions_turn_by_row_then_column_and_leave_the_origin_alone() {
        let turns = |place| {
            let mut turns = Vec::new();
            rope_turns(place, 8, &mut turns);
            turns
        };
        let mut rows: Vec<f32> = (0..8).map(|v| v as f32).collect();
        rope_2d(&mut rows, &turns((0, 0)), 8);
        assert_eq!(rows, (0..8).map(|v| v as f32).collect::<Vec<_>>());
        // Row 1, column 0: the first pair turns by one radian, the second (a column pair)
        // not at all; lengths are kept.
        let mut rows = vec![1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        rope_2d(&mut rows, &turns((1, 0)), 8);
        assert!((rows[0] - 1f32.cos()).abs() < 1e-6 && (rows[4] - 1f32.sin()).abs() < 1e-6);
        assert_eq!((rows[2], rows[6]), (1.0, 0.0));
    }
}
