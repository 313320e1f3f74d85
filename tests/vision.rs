//! Images in, against the peer: the rows edgelm's projector hands the text model agree with
//! libmtmd's (llama.cpp's multimodal library, through `scripts/peer/mtmd-embed.cpp`) on each
//! test projector and each photograph in `tests/data/images`; and projector files edgelm
//! does not implement are refused in one line.

mod common;

use common::{edited_copy, gemma3_path, kept, peer_tool, repo_root, test_mmproj, TensorEntry};
use edgelm::gguf::Value;
use edgelm::vision::{decode, projector_names, Projector};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The photographs (scikit-image's sample data: PNG, JPEG, colour and gray).
fn images() -> Vec<PathBuf> {
    let dir = repo_root().join("tests/data/images");
    let mut all: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("png" | "jpg")))
        .collect();
    all.sort();
    assert!(all.len() >= 4, "photographs missing in {}", dir.display());
    all
}

/// The peer's rows for `image` (kept beside the test projector while neither changes), and
/// the text tokens libmtmd puts before and after them.
fn peer_rows(text_model: &Path, mmproj: &Path, image: &Path) -> (Vec<f32>, String) {
    let stem = format!(
        "{}-{}",
        mmproj.file_stem().unwrap().to_string_lossy(),
        image.file_name().unwrap().to_string_lossy()
    );
    let dir = repo_root().join("target/peer-vision");
    let line_path = dir.join(format!("{stem}.txt"));
    let rows_path = dir.join(format!("{stem}.f32"));
    let sources = [text_model, mmproj, image, &peer_tool("mtmd-embed")];
    kept(&line_path, &sources, || {
        let out = Command::new(peer_tool("mtmd-embed"))
            .args([text_model, mmproj, image, &rows_path])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mtmd-embed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    });
    let bytes = std::fs::read(&rows_path).unwrap();
    let rows = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (rows, std::fs::read_to_string(&line_path).unwrap())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn gemma3_image_rows_agree_with_libmtmd_on_every_photograph() {
    let text = gemma3_path();
    let mmproj = test_mmproj("gemma3");
    let projector = Projector::open(&mmproj).unwrap();
    let width = projector.config.projection_dim;
    for image in images() {
        let (peer, line) = peer_rows(&text, &mmproj, &image);
        let ours = projector.encode(&decode(&std::fs::read(&image).unwrap()).unwrap());
        let name = image.file_name().unwrap().to_string_lossy();
        assert_eq!(ours.len(), projector.tokens_per_image() * width, "{name}");
        assert_eq!(ours.len(), peer.len(), "{name}: {line}");
        let cosines: Vec<f64> = ours
            .chunks(width)
            .zip(peer.chunks(width))
            .map(|(a, b)| cosine(a, b))
            .collect();
        let worst = cosines.iter().copied().fold(f64::INFINITY, f64::min);
        let mean = cosines.iter().sum::<f64>() / cosines.len() as f64;
        eprintln!(
            "{name}: {} rows, cosine with libmtmd's: worst {worst:.6}, mean {mean:.6}",
            cosines.len()
        );
        assert!(
            worst >= 0.999,
            "{name}: a row's cosine with the peer's is {worst}"
        );
        // The rows are not all alike: a projector that ignored its pixels would agree too.
        let least_alike = ours
            .chunks(width)
            .map(|r| cosine(r, &ours[..width]))
            .fold(f64::INFINITY, f64::min);
        eprintln!("{name}: the least alike rows' cosine {least_alike:.4}");
        assert!(
            least_alike < 0.9,
            "{name}: every row is alike ({least_alike})"
        );
    }
}

/// The test projector with `edit` applied, loaded: the one-line error it is refused with.
fn refusal(
    name: &str,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<TensorEntry>),
) -> String {
    let path = edited_copy(&test_mmproj("gemma3"), name, edit);
    let e = Projector::open(&path).err().expect("refused");
    let line = format!("{e:#}");
    assert!(!line.contains('\n'), "{line}");
    line
}

#[test]
fn projector_files_edgelm_does_not_implement_are_refused_in_one_line() {
    let set = |kvs: &mut Vec<(String, Value)>, key: &str, v: Value| match kvs
        .iter_mut()
        .find(|(k, _)| k == key)
    {
        Some(slot) => slot.1 = v,
        None => kvs.push((key.into(), v)),
    };
    let e = refusal("mmproj-llava.gguf", |kvs, _| {
        set(kvs, "clip.projector_type", Value::String("llava".into()))
    });
    assert!(
        e.contains("'llava' is not implemented") && e.contains(&projector_names()),
        "{e}"
    );
    let e = refusal("mmproj-window.gguf", |kvs, _| {
        set(kvs, "clip.vision.window_size", Value::U32(112))
    });
    assert!(e.contains("clip.vision.window_size"), "{e}");
    let e = refusal("mmproj-quick-gelu.gguf", |kvs, _| {
        kvs.retain(|(k, _)| k != "clip.use_gelu")
    });
    assert!(e.contains("GELU"), "{e}");
    let e = refusal("mmproj-extra.gguf", |_, ts| {
        let mut extra = ts[0].clone();
        extra.0 = "v.class_embd".into();
        ts.push(extra);
    });
    assert!(
        e.contains("'v.class_embd' is not used by projector 'gemma3'"),
        "{e}"
    );
    let e = refusal("mmproj-missing.gguf", |_, ts| {
        ts.retain(|t| t.0 != "v.blk.1.attn_k.weight")
    });
    assert!(e.contains("v.blk.1.attn_k.weight"), "{e}");
    let e = refusal("mmproj-patch.gguf", |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "v.patch_embd.weight")
            .unwrap();
        t.1.swap(2, 3);
    });
    assert!(
        e.contains("v.patch_embd.weight") && e.contains("dims"),
        "{e}"
    );
}

#[test]
fn a_projector_is_refused_beside_a_text_model_it_was_not_made_for() {
    let projector = Projector::open(&test_mmproj("gemma3")).unwrap();
    let width = projector.config.projection_dim;
    projector.check_text_model("gemma3", width).unwrap();
    let e = projector
        .check_text_model("llama", width)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gemma3 text model, not llama"), "{e}");
    let e = projector
        .check_text_model("gemma3", 576)
        .unwrap_err()
        .to_string();
    assert!(e.contains("576"), "{e}");
}
