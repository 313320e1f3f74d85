//! Where a request image's bytes come from: a base64 `data:` URL always; an `http://` URL only
//! from a host the profile lists (`images.fetch_hosts`), within its size and time limits and
//! never following a redirect (which could lead anywhere); a `file://` URL only inside the
//! profile's folder (`images.folder`), its real path checked after every link is resolved.
//! Anything else is refused with the reason.

use base64::Engine as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The profile's image sources, ready to read from.
pub struct ImageSources {
    hosts: Vec<String>,
    max_bytes: u64,
    /// With the fetch timeout, no redirects and no proxy from the environment.
    agent: Option<ureq::Agent>,
    /// Canonical: links resolved at start.
    folder: Option<PathBuf>,
}

impl ImageSources {
    /// `data:` URLs only.
    pub fn data_only() -> ImageSources {
        ImageSources {
            hosts: Vec::new(),
            max_bytes: 0,
            agent: None,
            folder: None,
        }
    }

    /// `http://` URLs from `hosts` (`name` or `name:port`), at most `max_kib` KiB each in
    /// `timeout`; `file://` URLs inside `folder` (empty: none; it must exist). The profile's
    /// `[images]` section.
    pub fn new(
        hosts: &[String],
        max_kib: usize,
        timeout: Duration,
        folder: &Path,
    ) -> anyhow::Result<ImageSources> {
        let folder = match folder.as_os_str().is_empty() {
            true => None,
            false => Some(
                folder
                    .canonicalize()
                    .map_err(|e| anyhow::anyhow!("images.folder {}: {e}", folder.display()))?,
            ),
        };
        let agent = (!hosts.is_empty()).then(|| {
            ureq::Agent::config_builder()
                .timeout_global(Some(timeout))
                .max_redirects(0)
                .proxy(None)
                .http_status_as_error(false)
                .build()
                .new_agent()
        });
        Ok(ImageSources {
            hosts: hosts.to_vec(),
            max_bytes: max_kib as u64 * 1024,
            agent,
            folder,
        })
    }

    /// The bytes `url` names, or why not (a sentence for the client).
    pub fn read(&self, url: &str) -> Result<Vec<u8>, String> {
        let url = url.trim();
        if let Some(rest) = url.strip_prefix("data:") {
            return data_url(rest);
        }
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("http") => self.fetch(url),
            Some("https") => Err(match self.hosts.is_empty() {
                true => NOT_FETCHED.into(),
                false => "https image URLs are not fetched (edgelm carries no TLS): name an \
                          http:// URL from a listed host, or send a data: URL"
                    .into(),
            }),
            Some("file") => self.file(&url["file://".len()..]),
            _ => Err("image_url.url must be a data: URL (data:image/png;base64,...)".into()),
        }
    }

    fn fetch(&self, url: &str) -> Result<Vec<u8>, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("the image URL does not parse ({e})"))?;
        let host = uri.authority().map(|a| a.as_str()).unwrap_or_default();
        let (Some(agent), true) = (
            &self.agent,
            self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)),
        ) else {
            return Err(match self.hosts.is_empty() {
                true => NOT_FETCHED.into(),
                false => format!("host {host:?} is not one the server fetches images from"),
            });
        };
        let mut response = agent
            .get(uri)
            .call()
            .map_err(|e| format!("fetching the image failed ({e})"))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("fetching the image got HTTP {status}"));
        }
        let mut bytes = Vec::new();
        response
            .body_mut()
            .as_reader()
            .take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("fetching the image failed ({e})"))?;
        self.bounded(bytes)
    }

    /// `bytes`, unless there are more than the profile's `fetch_max_kib` (files too).
    fn bounded(&self, bytes: Vec<u8>) -> Result<Vec<u8>, String> {
        match bytes.len() as u64 > self.max_bytes {
            true => Err(format!(
                "the image is larger than the server reads ({} KiB)",
                self.max_bytes / 1024
            )),
            false => Ok(bytes),
        }
    }

    /// `path` (a `file://` URL's, percent-encoded) inside the folder.
    fn file(&self, path: &str) -> Result<Vec<u8>, String> {
        let Some(folder) = &self.folder else {
            return Err("file:// image URLs are not read: the server has no images folder".into());
        };
        // `file://localhost/…` names the same file as `file:///…`.
        let path = path.strip_prefix("localhost").unwrap_or(path);
        let decoded = percent_encoding::percent_decode_str(path)
            .decode_utf8()
            .map_err(|_| "the file URL's path is not UTF-8".to_string())?;
        let outside = || format!("{decoded} is not a file in the server's images folder");
        let real = PathBuf::from(decoded.as_ref())
            .canonicalize()
            .map_err(|_| outside())?;
        if !real.starts_with(folder) || !real.is_file() {
            return Err(outside());
        }
        let file = std::fs::File::open(&real).map_err(|_| outside())?;
        let mut bytes = Vec::new();
        file.take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("reading {decoded} failed ({e})"))?;
        self.bounded(bytes)
    }
}

const NOT_FETCHED: &str =
    "remote image URLs are not fetched by this server; send the image as a data: URL";

/// A `data:` URL's payload (after `data:`), base64-decoded; its MIME type is not trusted (the
/// bytes decide the format).
fn data_url(rest: &str) -> Result<Vec<u8>, String> {
    let Some((head, data)) = rest.split_once(',') else {
        return Err("image_url.url must be a data: URL (data:image/png;base64,...)".into());
    };
    if !head.ends_with(";base64") {
        return Err("the data: URL is not base64 (;base64)".into());
    }
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("the data: URL's base64 does not decode ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A one-shot HTTP server answering `response` to the first request; its `host:port`.
    fn serve_once(response: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let host = listener.local_addr().expect("addr").to_string();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let mut head = [0u8; 4096];
                let _ = s.read(&mut head);
                let _ = s.write_all(&response);
            }
        });
        host
    }

    fn answer(status: &str, extra: &str, body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    fn sources(hosts: &[&str], max_kib: usize, folder: &Path) -> ImageSources {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        ImageSources::new(&hosts, max_kib, Duration::from_secs(5), folder).expect("sources")
    }

    #[test]
    fn data_urls_decode_and_everything_else_is_refused_by_default() {
        let s = ImageSources::data_only();
        assert_eq!(s.read("data:image/png;base64,AAEC"), Ok(vec![0, 1, 2]));
        assert!(s
            .read("data:image/png,AAEC")
            .unwrap_err()
            .contains("not base64"));
        assert!(s
            .read("data:image/png;base64,%%%")
            .unwrap_err()
            .contains("does not decode"));
        for url in ["http://127.0.0.1/a.png", "https://example.com/a.png"] {
            assert!(s.read(url).unwrap_err().contains("not fetched"), "{url}");
        }
        assert!(s
            .read("file:///etc/passwd")
            .unwrap_err()
            .contains("no images folder"));
        assert!(s
            .read("ftp://x/y")
            .unwrap_err()
            .contains("must be a data: URL"));
    }

    #[test]
    fn listed_hosts_are_fetched_within_the_limits_and_redirects_are_not_followed() {
        let none = Path::new("");
        let body = vec![7u8; 3000];
        let host = serve_once(answer("200 OK", "", &body));
        let s = sources(&[&host], 4, none);
        assert_eq!(s.read(&format!("http://{host}/frame.jpg")), Ok(body));

        let host = serve_once(answer("200 OK", "", &vec![1u8; 5000]));
        let s = sources(&[&host], 4, none);
        let err = s.read(&format!("http://{host}/big.jpg")).unwrap_err();
        assert!(
            err.contains("larger than the server reads (4 KiB)"),
            "{err}"
        );

        let host = serve_once(answer("302 Found", "Location: http://10.0.0.1/x\r\n", b""));
        let s = sources(&[&host], 4, none);
        let err = s.read(&format!("http://{host}/moved.jpg")).unwrap_err();
        assert!(err.contains("302"), "{err}");

        let s = sources(&["camera.local"], 4, none);
        let err = s.read("http://127.0.0.1:9/x.jpg").unwrap_err();
        assert!(
            err.contains("\"127.0.0.1:9\" is not one the server fetches"),
            "{err}"
        );
        assert!(s
            .read("https://camera.local/x.jpg")
            .unwrap_err()
            .contains("no TLS"));
    }

    #[test]
    fn files_are_read_inside_the_folder_only() {
        let root = std::env::temp_dir().join(format!("edgelm-sources-{}", std::process::id()));
        let folder = root.join("images");
        std::fs::create_dir_all(&folder).expect("folder");
        std::fs::write(folder.join("a b.png"), [1, 2, 3]).expect("file");
        std::fs::write(root.join("secret.png"), [9]).expect("file");
        let s = sources(&[], 1, &folder);
        let url = |p: &std::path::Path| format!("file://{}", p.display()).replace(' ', "%20");
        assert_eq!(s.read(&url(&folder.join("a b.png"))), Ok(vec![1, 2, 3]));
        for escape in [
            root.join("secret.png"),
            folder.join("../secret.png"),
            folder.clone(),
        ] {
            let err = s.read(&url(&escape)).unwrap_err();
            assert!(
                err.contains("not a file in the server's images folder"),
                "{err}"
            );
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(root.join("secret.png"), folder.join("link.png"))
                .expect("link");
            assert!(s.read(&url(&folder.join("link.png"))).is_err());
        }
        std::fs::write(folder.join("big.png"), vec![0u8; 2048]).expect("file");
        assert!(s
            .read(&url(&folder.join("big.png")))
            .unwrap_err()
            .contains("larger"));
        let _ = std::fs::remove_dir_all(&root);
    }
}
