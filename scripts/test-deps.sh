#!/usr/bin/env bash
# Installs every tool the suite's tests use that is missing, then checks each one is there, so
# that a run on a fresh machine either has everything within its first minutes or stops then
# with the line that installs what could not be had. One rule for a missing tool: install it,
# or fail early; no test is skipped for want of one.
#
#   scripts/test-deps.sh        (scripts/test-preflight.sh runs it, so scripts/test.sh does)
#
# Installs: the Python test clients (tests/e2e/requirements.txt) with pip into their own
# virtual environment, target/test-venv, never into the system Python, whose packages other
# programs rely on and the clients' pins would replace (scripts/test.sh checks they are the same
# at its end as at its start); Debian's python3-venv when python3 cannot make that environment;
# Debian packages (curl, Chromium, nodejs and npm, lintian and file, skopeo umoci haproxy
# prometheus, cmake g++ make for the peer, the aarch64 cross toolchain and qemu-user);
# autocannon (npm, into target/node); the rustup targets (aarch64 gnu, x86_64 and aarch64
# musl). Not the nightly toolchain and cargo-fuzz: scripts/fuzz.sh, which is not a step of the
# suite, installs those itself.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

log() { echo "test-deps: $*" >&2; }

# Debian packages by the command (or file) that shows each is there.
declare -A debs=(
    [curl]=curl [chromium]=chromium [node]=nodejs [npm]=npm [lintian]=lintian [file]=file
    [skopeo]=skopeo [umoci]=umoci [haproxy]=haproxy [prometheus]=prometheus
    [promtool]=prometheus [cmake]=cmake [g++]=g++ [make]=make
    [aarch64-linux-gnu-gcc]=gcc-aarch64-linux-gnu [qemu-aarch64]=qemu-user
    [/usr/aarch64-linux-gnu/include/stdio.h]=libc6-dev-arm64-cross
)
present() { if [[ $1 == /* ]]; then [ -e "$1" ]; else command -v "$1" >/dev/null; fi; }

missing=()
for what in "${!debs[@]}"; do
    present "$what" || missing+=("${debs[$what]}")
done
if [ ${#missing[@]} -gt 0 ]; then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python test clients, in target/test-venv (the end-to-end tests run its python). Installed
# again when tests/e2e/requirements.txt differs from the copy kept beside them, so that a changed
# pin reaches the environment; made afresh when its python does not start (python3 replaced).
venv=target/test-venv
clients="import openai, httpx, pytest, jsonschema, yaml, agents, langchain_openai, litellm, llm"
clients+=", pydantic_ai"
if ! "$venv/bin/python" -c "$clients" 2>/dev/null \
    || ! cmp -s tests/e2e/requirements.txt "$venv/requirements.txt"; then
    if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
        rm -rf "$venv"
        # Debian's python3 makes a virtual environment only with python3-venv (its ensurepip).
        if ! python3 -m venv "$venv" >/dev/null 2>&1; then
            rm -rf "$venv"
            log "apt-get install python3-venv"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                python3-venv >/dev/null
            python3 -m venv "$venv"
        fi
    fi
    log "pip install -r tests/e2e/requirements.txt into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r tests/e2e/requirements.txt
    cp tests/e2e/requirements.txt "$venv/requirements.txt"
fi

if [ ! -x target/node/node_modules/.bin/autocannon ]; then
    log "npm install autocannon@9 into target/node"
    npm install --prefix target/node --no-audit --no-fund --silent autocannon@9
fi

installed=$(rustup target list --installed)
for triple in aarch64-unknown-linux-gnu x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
    if ! grep -qx "$triple" <<<"$installed"; then
        log "rustup target add $triple"
        rustup --quiet target add "$triple"
    fi
done

# Everything again: what is still missing stops the run now, with its install line.
problems=()
for what in "${!debs[@]}"; do
    present "$what" || problems+=("$what: apt-get install ${debs[$what]}")
done
"$venv/bin/python" -c "$clients" 2>/dev/null \
    || problems+=("the Python test clients: python3 -m venv $venv &&
    $venv/bin/python -m pip install -r tests/e2e/requirements.txt")
[ -x target/node/node_modules/.bin/autocannon ] \
    || problems+=("autocannon: npm install --prefix target/node autocannon@9")
if [ ${#problems[@]} -gt 0 ]; then
    {
        echo "test-deps: could not install:"
        printf '  - %s\n' "${problems[@]}"
    } >&2
    exit 1
fi
log "every tool the tests use is here"
