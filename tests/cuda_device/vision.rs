//! Images on the device, for each projector type's test projector and text model
//! (tests/common/mmproj_model.rs):
//! - the encoder: a photograph encoded on the CPU and again on the CUDA device
//!   (`Projector::encode_on`), every row the text model would read within a cosine of 0.9999
//!   of the CPU's (the bar `tests/vision.rs` holds the CPU to against libmtmd is 0.999), no
//!   value off by more than a thousandth of its row's largest: the device computes in f32 as
//!   the CPU does, only the order of its sums differs;
//! - the text model reading the image: the logits of every position of a prompt with the
//!   image in it (Gemma 3's positions seeing each other, under a window shorter than the
//!   prompt; Qwen-VL's M-RoPE positions and DeepStack rows) as close to the CPU's f16 pages as
//!   the CPU's own q8_0 pages are (the bar of `architectures.rs`).

use super::forward::Agreement;
use super::{cosine, open};
use crate::common::{repo_root, test_mmproj, test_vlm_text};
use edgelm::backend::select::Backend;
use edgelm::chat::IMAGE_MARKER;
use edgelm::engine::{PromptImage, Session, SessionConfig};
use edgelm::kv::KvType;
use edgelm::model::{Logits, Model, Window};
use edgelm::tokenizer::Tokenizer;
use edgelm::vision::{decode, Projector, Rgb};
use std::sync::Arc;

const KINDS: [&str; 4] = ["gemma3", "idefics3", "qwen3vl", "qwen25vl"];

/// A `side` × `side` piece of a test photograph (whole photographs take minutes on the
/// emulator; a Qwen-VL projector still sees a grid of merged squares in windows).
fn photograph(side: usize) -> Rgb {
    let bytes = std::fs::read(repo_root().join("tests/data/images/chelsea.png")).unwrap();
    let whole = decode(&bytes).unwrap();
    let (w, h) = (side.min(whole.width), side.min(whole.height));
    let data = (0..h)
        .flat_map(|y| whole.data[y * whole.width * 3..][..w * 3].to_vec())
        .collect();
    Rgb {
        width: w,
        height: h,
        data,
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_image_encoder_matches_the_cpu_for_every_projector_type() {
    let dev = open();
    let image = photograph(240);
    for kind in KINDS {
        let projector = Projector::open(&test_mmproj(kind)).unwrap();
        let cpu = projector.encode(&image);
        projector.encode_on(&dev).unwrap();
        let device = projector.encode(&image);
        let width = projector.config.row_width();
        assert_eq!(device.len(), cpu.len(), "{kind}: rows");
        assert!(!cpu.is_empty() && cpu.len().is_multiple_of(width));
        let (mut worst_cos, mut worst_err) = (1f64, 0f32);
        for (d, c) in device.chunks_exact(width).zip(cpu.chunks_exact(width)) {
            let largest = c.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = d.iter().zip(c).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            worst_cos = worst_cos.min(cosine(d, c));
            worst_err = worst_err.max(err / largest);
        }
        eprintln!(
            "{kind}: {} rows of {width}: lowest cosine {worst_cos:.7}, largest error {worst_err:.2e} of a row's largest value",
            cpu.len() / width
        );
        assert!(worst_cos >= 0.9999, "{kind}: cosine {worst_cos}");
        assert!(worst_err <= 1e-3, "{kind}: error {worst_err}");
    }
}

/// The text model of `kind`'s test projector, cut to its first EDGELM_CUDA_TEST_LAYERS layers
/// where that is set (at least the DeepStack layers and one more), its windows (Gemma 3's)
/// cut to 16 positions so that the prompt crosses them.
fn vlm_text(kind: &str) -> Arc<Model> {
    let mut m = Model::load(&test_vlm_text(kind)).unwrap();
    let keep = std::env::var("EDGELM_CUDA_TEST_LAYERS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(m.config.n_layers, |l| l.max(m.config.deepstack_layers + 1));
    if keep < m.config.n_layers {
        m.weights.layers.truncate(keep);
        m.config.layers.truncate(keep);
        m.config.n_layers = keep;
    }
    for layer in &mut m.config.layers {
        if layer.window.is_some() {
            layer.window = Some(Window::Trailing(16));
        }
    }
    m.layout = m.config.kv_layout();
    Arc::new(m)
}

/// Every position's logits of `tokens` (with `images`) from a session on `backend`.
fn session_logits(
    model: &Arc<Model>,
    (tokens, images): (&[u32], &[PromptImage]),
    kv: KvType,
    backend: Backend,
) -> Vec<f32> {
    let cfg = SessionConfig {
        backend,
        ..SessionConfig::cpu(kv, 16, tokens.len(), 512)
    };
    let mut session = Session::new(model.clone(), cfg).unwrap();
    assert_eq!(session.is_cuda(), backend == Backend::Cuda, "no fallback");
    session
        .extend_with_images(tokens, images, Logits::All)
        .unwrap()
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_logits_after_an_image_match_the_cpu_for_every_projector_type() {
    let image = photograph(240);
    for kind in KINDS {
        let model = vlm_text(kind);
        let tok = Tokenizer::from_gguf(&model.file).unwrap();
        let projector = Projector::open(&test_mmproj(kind)).unwrap();
        let prompt = format!("Look: {IMAGE_MARKER} What is in it? A cat, sitting.");
        let size = [(image.width, image.height)];
        let (tokens, starts) = projector
            .prompt_tokens(&tok, &prompt, IMAGE_MARKER, 0, &size)
            .unwrap();
        let images: Vec<PromptImage> = (starts[0].iter().zip(projector.embed(&image)))
            .map(|(&at, rows)| PromptImage { at, rows })
            .collect();
        let prompt = (&tokens[..], &images[..]);
        let want = session_logits(&model, prompt, KvType::F16, Backend::Cpu);
        let q8 = session_logits(&model, prompt, KvType::Q8_0, Backend::Cpu);
        let got = session_logits(&model, prompt, KvType::F16, Backend::Cuda);
        let vocab = model.config.vocab_size;
        let (mut stats, mut yardstick) = (Agreement::default(), Agreement::default());
        for (r, w) in want.chunks_exact(vocab).enumerate() {
            let row = |l: &[f32]| l[r * vocab..(r + 1) * vocab].to_vec();
            stats.add(&format!("{kind} position {r}"), &row(&got), w);
            yardstick.add("", &row(&q8), w);
        }
        eprintln!(
            "{kind}: {} positions ({} of them the image's): device vs CPU: {}\n  yardstick, the CPU's q8_0 pages vs its f16 pages: {}",
            tokens.len(),
            images.iter().map(|i| i.rows.len()).sum::<usize>(),
            stats.summary(),
            yardstick.summary()
        );
        stats.assert_close_in_distance(&yardstick);
    }
}

/// `edgelm run --backend cuda` with an image, through the binary and the engine: the image is
/// encoded on the device and read by the text model's forward pass on the device, which
/// continues the prompt.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_run_reads_an_image_on_the_device() {
    let dir = std::env::temp_dir().join(format!("edgelm-cuda-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let piece = photograph(240);
    let path = dir.join("piece.png");
    let size = (piece.width as u32, piece.height as u32);
    image::save_buffer(&path, &piece.data, size.0, size.1, image::ColorType::Rgb8).unwrap();
    let kind = "qwen3vl";
    let out = crate::edgelm()
        .args(["run", "--temp", "0", "-n", "3", "--backend", "cuda", "-m"])
        .arg(test_vlm_text(kind))
        .arg("--mmproj")
        .arg(test_mmproj(kind))
        .arg("--image")
        .arg(&path)
        .args(["-p", &format!("{IMAGE_MARKER} A picture of")])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let device = String::from_utf8_lossy(&out.stdout);
    for line in [
        "images are encoded on the CUDA device",
        "CUDA: forward pass on",
    ] {
        assert!(log.contains(line), "no {line:?} in: {log}");
    }
    assert!(!device.trim().is_empty(), "no text: {log}");
    eprintln!("{kind} on the device: {device:?}");
}

/// `edgelm serve` on the device with a projector: a chat completion with an image part (a
/// data URL, as the official clients send it) is answered, its image encoded on the device,
/// and every prompt position counted.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_serve_answers_a_chat_with_an_image() {
    use base64::Engine as _;
    let kind = "qwen3vl";
    let section = format!(
        "[model]\npath = {:?}\nmmproj = {:?}\n",
        test_vlm_text(kind),
        test_mmproj(kind)
    );
    let mut server = crate::Served::start("cuda-image", &section);
    let encoder = server.line_with(&["images are encoded on the"]);
    let forward = server.line_with(&["CUDA: forward pass on", "on the CPU"]);
    assert!(server.wait_healthy(), "not healthy: {:?}", server.seen);
    let piece = photograph(240);
    let mut png = Vec::new();
    let encoder_png = image::codecs::png::PngEncoder::new(&mut png);
    let size = (piece.width as u32, piece.height as u32);
    image::ImageEncoder::write_image(
        encoder_png,
        &piece.data,
        size.0,
        size.1,
        image::ExtendedColorType::Rgb8,
    )
    .unwrap();
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]}],
        "max_tokens": 2,
        "temperature": 0,
    })
    .to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = server.exchange(&request);
    let status = server.stop();
    let (code, reply) = answer.unwrap_or_else(|| panic!("no answer: {:?}", server.seen));
    assert_eq!(code, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let projector = Projector::open(&test_mmproj(kind)).unwrap();
    let rows = projector.config.view_rows(piece.width, piece.height);
    let prompt = reply["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(
        prompt > rows,
        "{prompt} prompt tokens for an image of {rows}: {reply}"
    );
    let encoder = encoder.unwrap_or_else(|| panic!("no encoder line: {:?}", server.seen));
    assert!(encoder.contains("on the CUDA device"), "{encoder}");
    let forward = forward.unwrap_or_else(|| panic!("no backend line: {:?}", server.seen));
    assert!(forward.contains("CUDA: forward pass on"), "{forward}");
    assert!(
        status.is_some_and(|s| s.success()),
        "serve exited {status:?}"
    );
    eprintln!(
        "{kind} served on the device: {}",
        reply["choices"][0]["message"]["content"]
    );
}
