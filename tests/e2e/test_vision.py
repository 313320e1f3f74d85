"""Images in, end to end, for each projector type: `edgelm serve --mmproj` with the suite's test
projectors (made by `cargo test --test vision` from the reference model's tensors), gemma3 beside
Gemma 3 270M, idefics3 beside SmolVLM's text model (SmolLM2 with SmolVLM's tokens) and
qwen3vl_merger beside a Qwen3-VL text model and qwen2.5vl_merger beside a Qwen2.5-VL one
(SmolLM2's tensors as a qwen3vl and a qwen2vl, all made by the same test), asked by the
official openai client (chat with an image part, whole and streamed; Responses with
`input_image`) and by LangChain; the prefix cache keyed by the image; and hostile images, each
a 400 that names the part, after which the server still serves and every KV block is back."""

import base64
import functools
import io
import math
import struct
import threading
import zlib
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from openai import BadRequestError, OpenAI
from PIL import Image

from conftest import ROOT, Server

GEMMA3 = ROOT / "models" / "gemma-3-270m-Q4_K_M.gguf"
TEMPLATE = ROOT / "tests" / "data" / "gemma3-chat-template.jinja"
PHOTOS = ROOT / "tests" / "data" / "images"


def made(prefix: str) -> Path:
    """The newest recipe of the test model PREFIX.rN.gguf."""
    files = sorted((ROOT / "target" / "test-models").glob(f"{prefix}.r*.gguf"),
                   key=lambda p: int(p.stem.rsplit(".r", 1)[1]))
    assert files, f"{prefix} is missing: run cargo test --release --test vision first"
    return files[-1]


def projector_file(family: str = "gemma3") -> Path:
    return made(f"test-mmproj-{family}")


def serve(family: str, *extra: str) -> Server:
    """`edgelm serve` of FAMILY's text model with its test projector (and Gemma 3's chat
    template with image parts; SmolLM2's own renders the image marker in the text)."""
    if family == "gemma3":
        return Server("--mmproj", str(projector_file(family)), "--chat-template-file", str(TEMPLATE),
                      *extra, model=GEMMA3)
    text = {"idefics3": "test-smolvlm-text", "qwen3vl": "test-qwen3vl-text",
            "qwen25vl": "test-qwen2vl-text"}[family]
    return Server("--mmproj", str(projector_file(family)), *extra, model=made(text))


def image_positions(family: str, width: int, height: int) -> int:
    """The prompt positions an image of WIDTH × HEIGHT takes, its markers included: gemma3's
    64 rows between two markers; idefics3's test projector resizes to 448 pixels on the longer
    side, in tiles of 224 of 16 rows, each after two marker tokens, a newline between rows of
    tiles, then the overview's 16 rows after three tokens and before one."""
    if family == "gemma3":
        return 64 + 2
    if family == "qwen3vl":
        return qwen_rows(width, height) + 2
    if family == "qwen25vl":
        return qwen_rows(width, height, align=28) + 2
    aspect = width / height
    if width >= height:
        w, h = 448, int(448 / aspect)
        h += h % 2
    else:
        w, h = int(448 * aspect), 448
        w += w % 2
    cols, rows = math.ceil(w / 224), math.ceil(h / 224)
    return cols * rows * (16 + 2) + (rows - 1) + 3 + 16 + 1


def qwen_rows(width: int, height: int, align: int = 32, least: int = 8, most: int = 4096) -> int:
    """Qwen-VL's rows for an image of WIDTH × HEIGHT (mtmd's smart resize: the sides
    rounded to whole merged squares, 32 pixels for Qwen3-VL and 28 for Qwen2.5-VL, scaled
    into 8 to 4,096 squares)."""
    w = max(align, math.floor(width / align + 0.5) * align)
    h = max(align, math.floor(height / align + 0.5) * align)
    if w * h > most * align * align:
        beta = math.sqrt(width * height / (most * align * align))
        w = max(align, math.floor(width / beta / align) * align)
        h = max(align, math.floor(height / beta / align) * align)
    elif w * h < least * align * align:
        beta = math.sqrt(least * align * align / (width * height))
        w, h = math.ceil(width * beta / align) * align, math.ceil(height * beta / align) * align
    return (w // align) * (h // align)


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def photo(name: str) -> bytes:
    return (PHOTOS / name).read_bytes()


@pytest.fixture(scope="module", params=["gemma3", "idefics3", "qwen3vl", "qwen25vl"])
def vision(request):
    s = serve(request.param)
    s.family = request.param
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(vision):
    return OpenAI(base_url=vision.base + "/v1", api_key="none")


def ask(client, image: str, text="What is in this picture?", **kw):
    return client.chat.completions.create(
        model="gemma", temperature=0, max_tokens=16,
        messages=[{"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": image, "detail": "auto"}}]}], **kw)


def test_a_chat_with_an_image_answers_whole_and_streamed_alike(client, vision):
    url = data_url(photo("coffee.png"))
    whole = ask(client, url)
    assert whole.choices[0].message.content
    # The image's positions and its markers count as prompt tokens.
    plain = client.chat.completions.create(
        model="gemma", temperature=0, max_tokens=1,
        messages=[{"role": "user", "content": "What is in this picture?"}])
    size = Image.open(PHOTOS / "coffee.png").size
    assert whole.usage.prompt_tokens == plain.usage.prompt_tokens + image_positions(vision.family, *size)
    streamed = "".join(c.choices[0].delta.content or "" for c in ask(client, url, stream=True) if c.choices)
    assert streamed == whole.choices[0].message.content
    vision.wait_idle()
    assert vision.metrics()["edgelm_kv_blocks_used"] == 0


def test_the_same_image_again_is_a_prefix_cache_hit_and_another_is_not(client, vision):
    first = ask(client, data_url(photo("chelsea.png")), text="Describe it.")
    again = ask(client, data_url(photo("chelsea.png")), text="Describe it.")
    other = ask(client, data_url(photo("rocket.jpg")), text="Describe it.")
    prompt = first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens >= prompt - 16
    # The blocks of the image's positions are another image's: not reused (the text before
    # it may be; the image's positions alone are more than a 16-token block).
    text = prompt - image_positions(vision.family, *Image.open(PHOTOS / "chelsea.png").size)
    assert other.usage.prompt_tokens_details.cached_tokens <= text
    assert other.choices[0].message.content != first.choices[0].message.content


def test_responses_take_an_input_image_and_refuse_a_file_id(client):
    url = data_url(photo("coffee.png"))
    r = client.responses.create(
        model="gemma", temperature=0, max_output_tokens=16,
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is in this picture?"},
            {"type": "input_image", "image_url": url, "detail": "auto"}]}])
    assert r.output_text == ask(client, url).choices[0].message.content
    with pytest.raises(BadRequestError) as e:
        client.responses.create(model="gemma", input=[{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-123", "detail": "auto"}]}])
    assert "file_id" in str(e.value)


def test_langchain_sends_an_image_message(vision):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=vision.base + "/v1", api_key="none", model="gemma", temperature=0, max_tokens=8)
    reply = llm.invoke([HumanMessage(content=[
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": data_url(photo("camera.png"))}}])])
    # The image reached the model (its positions are in the prompt's count) and an answer came
    # back (a text model may end its turn at once: the content may be empty).
    assert reply.usage_metadata["input_tokens"] > image_positions(vision.family, 512, 512)
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    assert isinstance(reply.content, str)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header (checksum right) declares WIDTH × HEIGHT pixels, with one tiny
    compressed row behind it: a decompression bomb's first bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def encoded(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


def test_hostile_images_get_a_400_naming_the_part_and_nothing_leaks(vision):
    png, jpg = photo("chelsea.png"), photo("rocket.jpg")
    refused = {
        "truncated PNG": data_url(png[: len(png) // 2]),
        "corrupt JPEG": data_url(jpg[:200] + bytes(len(jpg) - 200), "image/jpeg"),
        "truncated WebP": data_url(encoded(Image.open(PHOTOS / "coffee.png"), "WEBP")[:300], "image/webp"),
        "a 50,000 × 50,000 bomb": data_url(png_header_only(50_000, 50_000)),
        "base64 that is not": "data:image/png;base64,@@@not base64@@@",
        "a remote URL": "https://example.com/cat.png",
        "not a data URL": "ftp://example.com/cat.png",
    }
    for what, url in refused.items():
        r = httpx.post(vision.base + "/v1/chat/completions", timeout=60, json={
            "model": "gemma", "max_tokens": 4,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Look."}, {"type": "image_url", "image_url": {"url": url}}]}]})
        assert r.status_code == 400, (what, r.text)
        err = r.json()["error"]
        assert err["param"] == "messages[0].content[1]", (what, err)
    # Images past the context: the one that crosses its end is named.
    context = httpx.post(vision.base + "/tokenize", json={"model": "gemma", "prompt": "x"}).json()["max_model_len"]
    tiny = {"type": "image_url", "image_url": {"url": data_url(encoded(Image.new("RGB", (4, 4)), "PNG"))}}
    per_image = image_positions(vision.family, 4, 4)
    r = httpx.post(vision.base + "/v1/chat/completions", timeout=60, json={
        "model": "gemma", "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Look."}] + [tiny] * (context // per_image + 2)}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "do not fit the context length" in err["message"], err
    crossing = int(err["param"].removeprefix("messages[0].content[").removesuffix("]"))
    assert 1 < crossing <= context // per_image + 1, err
    base = Image.open(PHOTOS / "coffee.png")
    accepted = {
        "a MIME type that lies": data_url(png, "image/jpeg"),
        "16-bit PNG": data_url(encoded(base.convert("I;16"), "PNG")),
        "palette PNG": data_url(encoded(base.convert("P"), "PNG")),
        "CMYK JPEG": data_url(encoded(base.convert("CMYK"), "JPEG"), "image/jpeg"),
        "GIF": data_url(encoded(base.convert("P"), "GIF"), "image/gif"),
        "WebP": data_url(encoded(base, "WEBP"), "image/webp"),
    }
    for what, url in accepted.items():
        r = httpx.post(vision.base + "/v1/chat/completions", timeout=60, json={
            "model": "gemma", "max_tokens": 2,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Look."}, {"type": "image_url", "image_url": {"url": url}}]}]})
        assert r.status_code == 200, (what, r.text)
    vision.wait_idle()
    assert vision.metrics()["edgelm_kv_blocks_used"] == 0
    assert httpx.get(vision.base + "/health").status_code == 200


def test_a_profile_lets_images_come_from_listed_hosts_and_its_folder(tmp_path, client, vision):
    """A camera-like HTTP server on loopback, listed by address in the profile, and the photos'
    folder: those URLs answer as the same image sent as a data URL does; any other host, a
    file outside the folder, a 404 and https are 400s naming the part."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(PHOTOS))
    camera = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=camera.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{camera.server_address[1]}"
    profile = tmp_path / "images.toml"
    profile.write_text(f'[images]\nfetch_hosts = ["{host}"]\nfetch_max_kib = 4096\n'
                       f'folder = "{PHOTOS}"\n')
    s = serve(vision.family, "--config", str(profile))
    try:
        local = OpenAI(base_url=s.base + "/v1", api_key="none")
        want = ask(client, data_url(photo("coffee.png"))).choices[0].message.content
        for url in (f"http://{host}/coffee.png", f"file://{PHOTOS / 'coffee.png'}"):
            assert ask(local, url).choices[0].message.content == want, url
        for url in (f"http://localhost:{camera.server_address[1]}/coffee.png", f"http://{host}/missing.png",
                    f"https://{host}/coffee.png", f"file://{PHOTOS}/../README.md", "file:///etc/hostname"):
            with pytest.raises(BadRequestError) as e:
                ask(local, url)
            assert e.value.body["param"] == "messages[0].content[1]", (url, e.value.body)
        s.wait_idle()
        assert s.metrics()["edgelm_kv_blocks_used"] == 0
    finally:
        s.stop()
        camera.shutdown()


def test_a_model_without_a_projector_refuses_an_image_part(server):
    r = httpx.post(server.base + "/v1/chat/completions", json={
        "model": "x", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(photo("coffee.png"))}}]}]})
    assert r.status_code == 400
    assert "projector" in r.json()["error"]["message"]


def test_tokenize_counts_an_images_positions(vision):
    def count(content):
        r = httpx.post(vision.base + "/tokenize", json={"model": "gemma", "messages": [
            {"role": "user", "content": content}]})
        assert r.status_code == 200, r.text
        return r.json()["count"]
    plain = count("Look.")
    with_image = count([{"type": "text", "text": "Look."},
                        {"type": "image_url", "image_url": {"url": data_url(photo("coffee.png"))}}])
    assert with_image == plain + image_positions(vision.family, *Image.open(PHOTOS / "coffee.png").size)
