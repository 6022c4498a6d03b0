#!/usr/bin/env python3
"""End-to-end tests of the gaac command-line tool: exit codes, stdout/stderr discipline, JSON keys,
bit-exact round trips, clear errors on bad input, and the hardening rules (outputs never replace
inputs, bounded resources, checked output, safe reading, strict numbers, validate that can fail,
errors that say what and where). Usage: test_cli.py PATH/TO/gaac WORKDIR [PART], PART one of PARTS (the
test suite runs each in its own work directory, side by side); without PART, all of them.
Standard library only; prints "N passed, N failed" and exits non-zero on any failure. Tests that
need a real model (scripts/fetch_models.py) are skipped without one, or fail under
GAAC_REQUIRE_MODELS=1."""

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time

GAAC = sys.argv[1]
WORK = sys.argv[2]
PART = sys.argv[3] if len(sys.argv) > 3 else None
passed = 0
failed = 0


def run(*args, stdout=None, preexec_fn=None, timeout=300):
    """Runs gaac; stdout and stderr are captured as text unless `stdout` names a file to write to."""
    if stdout is None:
        return subprocess.run([GAAC, *args], capture_output=True, text=True, preexec_fn=preexec_fn, timeout=timeout)
    with open(stdout, "wb") as out:
        return subprocess.run([GAAC, *args], stdout=out, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn,
                              timeout=timeout)


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}", file=sys.stderr)


def path(name):
    return os.path.join(WORK, name)


def write_safetensors(file, tensors):
    """tensors: {name: (dtype, shape, raw bytes)}, written as the safetensors format specifies."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def basics():
    """Round trips, JSON keys and clear errors on bad input."""
    kv, calib_kv = path("kv.safetensors"), path("calib-kv.safetensors")

    r = run("synth", "--layers", "3", "--kv-heads", "2", "--head-dim", "256", "--tokens", "203", "-o", kv)
    check("synth exit", r.returncode == 0, r.stderr)
    r = run("synth", "--layers", "3", "--kv-heads", "2", "--head-dim", "256", "--tokens", "300", "--seed", "9",
            "-o", calib_kv)
    check("synth 2 exit", r.returncode == 0, r.stderr)

    calib = path("calib.safetensors")
    r = run("calibrate", calib_kv, kv, "-o", calib)
    check("calibrate exit", r.returncode == 0, r.stderr)
    check("calibrate reports capacities", "escape-slot capacity" in r.stdout, r.stdout)
    check("no progress bar when stderr is not a terminal", r.stderr == "", r.stderr)

    r = run("stats", kv, "--calib", calib, "--json")
    check("stats exit", r.returncode == 0, r.stderr)
    stats = json.loads(r.stdout)
    for key in ("ratio", "resident_ratio", "bits_per_element", "exponent_entropy_bits", "modes", "layers"):
        check(f"stats key {key}", key in stats, list(stats))
    modes = stats["modes"]
    check("mode fractions sum to 1", abs(modes["3bit"] + modes["4bit"] + modes["raw"] - 1) < 1e-9, modes)
    check("three layers", len(stats["layers"]) == 3, len(stats["layers"]))
    check("ratio plausible", 1.3 < stats["ratio"] < 1.43, stats["ratio"])
    check("resident below codec ratio", stats["resident_ratio"] <= stats["ratio"], stats)
    check("bits per element consistent", abs(stats["bits_per_element"] - 16 / stats["ratio"]) < 1e-9, stats)

    r = run("stats", kv)
    check("stats table (self-calibrated)", r.returncode == 0 and "total" in r.stdout, r.stderr)

    packed, restored = path("kv.gaac"), path("restored.safetensors")
    r = run("compress", kv, "--calib", calib, "-o", packed)
    check("compress exit", r.returncode == 0, r.stderr)
    r = run("decompress", packed, "-o", restored)
    check("decompress exit", r.returncode == 0, r.stderr)
    check("restored file identical", open(kv, "rb").read() == open(restored, "rb").read())
    r = run("verify", kv, "--calib", calib)
    check("verify exit", r.returncode == 0 and "verify OK" in r.stdout, r.stdout + r.stderr)
    on_gpu = path("kv-cuda.gaac")
    r = run("compress", kv, "--calib", calib, "--device", "cuda", "-o", on_gpu)
    if r.returncode == 0:
        check("compress --device cuda: the CPU's bytes", open(on_gpu, "rb").read() == open(packed, "rb").read())
    else:
        check("compress --device cuda without a GPU: a clear error, nothing written",
              r.returncode == 1 and "CUDA" in r.stderr and not os.path.exists(on_gpu), r.stderr)

    data = bytearray(open(packed, "rb").read())
    data[len(data) // 2] ^= 0x10
    corrupt = path("corrupt.gaac")
    open(corrupt, "wb").write(data)
    r = run("decompress", corrupt, "-o", path("never.safetensors"))
    check("corrupt snapshot rejected", r.returncode == 1 and "checksum" in r.stderr, r.stderr)
    check("nothing written for a corrupt snapshot", not os.path.exists(path("never.safetensors")))
    open(path("short.gaac"), "wb").write(bytes(data[:100]))
    r = run("decompress", path("short.gaac"), "-o", path("never.safetensors"))
    check("truncated snapshot rejected", r.returncode == 1 and "error" in r.stderr, r.stderr)

    f32 = path("f32.safetensors")
    write_safetensors(f32, {"k.0": ("F32", [1, 1, 64], bytes(256)), "v.0": ("BF16", [1, 1, 64], bytes(128))})
    r = run("stats", f32)
    check("non-BF16 rejected naming the tensor", r.returncode == 1 and "k.0" in r.stderr and "F32" in r.stderr,
          r.stderr)
    odd = path("odd.safetensors")
    write_safetensors(odd, {"k.0": ("BF16", [1, 1, 96], bytes(192)), "v.0": ("BF16", [1, 1, 96], bytes(192))})
    r = run("verify", odd)
    check("head_dim 96 rejected", r.returncode == 1 and "96" in r.stderr, r.stderr)

    other = path("other.safetensors")
    run("synth", "--layers", "2", "--head-dim", "64", "-o", other)
    r = run("stats", other, "--calib", calib)
    check("mismatched calibration rejected", r.returncode == 1 and "calibration" in r.stderr, r.stderr)

    r = run("compress", kv)
    check("missing -o is a usage error", r.returncode not in (0, 1), r.returncode)
    r = run("--help")
    check("--help lists the subcommands", r.returncode == 0 and all(
        c in r.stdout for c in ("calibrate", "stats", "compress", "decompress", "verify")), r.stdout)


# ---------------------------------------------------------------------------------------------
# Helpers for the hardening rules

def fp8():
    """FP8 dumps: convert, calibrate, stats, study, compress/decompress and verify, and clear refusals."""
    kv = path("fp8-src.safetensors")
    check("fp8 synth", run("synth", "--layers", "2", "--kv-heads", "2", "--head-dim", "128", "--tokens", "70", "-o", kv).returncode == 0)
    for fmt in ("e4m3", "e5m2"):
        out = path(f"kv-{fmt}.safetensors")
        r = run("convert", kv, "--to", fmt, "-o", out)
        check(f"convert {fmt}", r.returncode == 0 and fmt in r.stdout, r.stdout + r.stderr)
        header = json.loads(open(out, "rb").read()[8:8 + struct.unpack("<Q", open(out, "rb").read(8))[0]])
        check(f"convert {fmt}: FP8 tensors and scales", header["k.0"]["dtype"] == ("F8_E4M3" if fmt == "e4m3" else "F8_E5M2")
              and header["k_scale"]["dtype"] == "F32" and header["__metadata__"]["fp8_scaling"] == "per-tensor", header)
        calib = path(f"calib-{fmt}.safetensors")
        r = run("calibrate", out, "-o", calib)
        check(f"calibrate {fmt}", r.returncode == 0 and fmt in r.stdout, r.stdout + r.stderr)
        r = run("stats", out, "--calib", calib, "--json")
        check(f"stats {fmt}", r.returncode == 0, r.stderr)
        stats = json.loads(r.stdout)
        check(f"stats {fmt}: format and modes", stats["element_format"] == fmt and set(stats["modes"]) == {"2bit", "3bit", "raw"},
              stats)
        check(f"stats {fmt}: ratio vs BF16 twice the ratio", abs(stats["ratio_vs_bf16"] - 2 * stats["ratio"]) < 1e-9, stats)
        check(f"stats {fmt}: bits per element", abs(stats["bits_per_element"] - 8 / stats["ratio"]) < 1e-9, stats)
        r = run("study", "schemes", out)
        check(f"study schemes {fmt}", r.returncode == 0 and "2+3+raw" in r.stdout, r.stdout + r.stderr)
        r = run("study", "drift", out, "--calib", calib, "--segment", "32", "--layer", "1")
        check(f"study drift {fmt}", r.returncode == 0 and "| 0–32 |" in r.stdout, r.stdout + r.stderr)
        packed, restored = path(f"kv-{fmt}.gaac"), path(f"restored-{fmt}.safetensors")
        check(f"compress {fmt}", run("compress", out, "--calib", calib, "-o", packed).returncode == 0)
        r = run("decompress", packed, "-o", restored)
        check(f"decompress {fmt}", r.returncode == 0, r.stderr)
        check(f"{fmt} dump restored byte for byte", open(out, "rb").read() == open(restored, "rb").read())
        r = run("verify", out)
        check(f"verify {fmt}", r.returncode == 0 and "verify OK" in r.stdout, r.stdout + r.stderr)
    r = run("stats", path("kv-e4m3.safetensors"), "--calib", path("calib-e5m2.safetensors"))
    check("a table of another format refused", r.returncode == 1 and "e5m2" in r.stderr and "e4m3" in r.stderr, r.stderr)
    r = run("convert", path("kv-e4m3.safetensors"), "--to", "e5m2", "-o", path("never.safetensors"))
    check("convert refuses an FP8 input", r.returncode == 1 and "F8_E4M3" in r.stderr, r.stderr)
    r = run("convert", kv, "--to", "fp16", "-o", path("never.safetensors"))
    check("convert refuses an unknown format", is_usage_error(r), r.stderr)


def is_usage_error(r):
    """Any exit status other than 0 (success) and 1 (an error or a failed check), as README says."""
    return r.returncode not in (0, 1) and r.returncode > 0


def digest(file):
    with open(file, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def temporaries(directory):
    return [n for n in os.listdir(directory) if ".tmp." in n]


def write_gguf(file, strings):
    """A GGUF v3 file with no tensors and the given string metadata (key and value as bytes)."""
    def gguf_string(b):
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(strings))
    for key, value in strings:
        out += gguf_string(key) + struct.pack("<I", 8) + gguf_string(value)
    out += b"\0" * (-len(out) % 32)
    with open(file, "wb") as f:
        f.write(out)


def model_path():
    """The cached SmolLM2 GGUF (scripts/fetch_models.py), or None."""
    directory = os.environ.get("GAAC_MODEL_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gaac", "models")
    candidate = os.path.join(directory, "SmolLM2-135M-Instruct.Q4_1.gguf")
    return candidate if os.path.exists(candidate) else None


def sanitized_build():
    """True when gaac is built with AddressSanitizer, which reserves far more address space than any
    memory limit a test can set."""
    with open(GAAC, "rb") as f:
        return b"__asan_init" in f.read()


def small_dump(name, layers="2", heads="1", head_dim="64", tokens="40", seed="1"):
    file = path(name)
    r = run("synth", "--layers", layers, "--kv-heads", heads, "--head-dim", head_dim, "--tokens", tokens, "--seed",
            seed, "-o", file)
    check(f"synth {name}", r.returncode == 0, r.stderr)
    return file


def limit_file_size(limit):
    """preexec_fn: files may not grow beyond `limit` bytes; writes past it fail with EFBIG."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def limit_memory(limit):
    """preexec_fn: at most `limit` bytes of address space."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


# ---------------------------------------------------------------------------------------------
# Rule 1: no command writes over one of its inputs; special files are written in place, never
# replaced; a replaced file keeps its mode; temporary files never stay behind.

def rule1_outputs():
    a = small_dump("r1-a.safetensors")
    b = small_dump("r1-b.safetensors", seed="2")
    calib = path("r1-calib.safetensors")
    r = run("calibrate", a, "-o", calib)
    check("r1 calibrate", r.returncode == 0, r.stderr)
    packed = path("r1.gaac")
    r = run("compress", a, "-o", packed)
    check("r1 compress", r.returncode == 0, r.stderr)
    text = path("r1-text.txt")
    with open(text, "w") as f:
        f.write("Some text to prefill.\n")
    model = path("r1-model.gguf")  # never parsed: the output is refused first
    write_gguf(model, [(b"general.architecture", b"llama")])
    symbolic, hard = path("r1-symbolic"), path("r1-hard")
    os.symlink(a, symbolic)
    os.link(a, hard)

    cases = [
        ("calibrate A -o A", ["calibrate", a, "-o", a], a),
        ("calibrate A B -o B", ["calibrate", a, b, "-o", b], b),
        ("compress A -o A", ["compress", a, "-o", a], a),
        ("compress --calib C -o C", ["compress", a, "--calib", calib, "-o", calib], calib),
        ("compress -o symbolic link to A", ["compress", a, "-o", symbolic], a),
        ("compress -o hard link to A", ["compress", a, "-o", hard], a),
        ("decompress X -o X", ["decompress", packed, "-o", packed], packed),
        ("capture -o MODEL", ["capture", "-m", model, "--text", text, "-o", model], model),
        ("capture -o TEXT", ["capture", "-m", model, "--text", text, "-o", text], text),
        ("generate --save-kv MODEL", ["generate", "-m", model, "-p", "hi", "--save-kv", model], model),
        ("validate --write-tokens TEXT", ["validate", "-m", model, "--text", text, "--write-tokens", text], text),
    ]
    for name, args, victim in cases:
        before = digest(victim)
        r = run(*args)
        output = args[args.index("-o") + 1] if "-o" in args else args[-1]
        check(f"r1 refused: {name}", r.returncode == 1 and "never writes over a file it reads" in r.stderr
              and f"gaac: error: {output}: " in r.stderr, (r.returncode, r.stderr))
        check(f"r1 input intact: {name}", digest(victim) == before)
    check("r1 links stay links", os.path.islink(symbolic) and os.stat(hard).st_nlink == 2)
    check("r1 no temporary files", temporaries(WORK) == [], temporaries(WORK))

    # Standard output, as a pipe and as a regular file: written in order with the messages.
    r = subprocess.run([GAAC, "decompress", packed, "-o", "/dev/stdout"], capture_output=True)
    with open(a, "rb") as f:
        dump = f.read()
    check("r1 -o /dev/stdout through a pipe", r.returncode == 0 and r.stdout.startswith(dump)
          and r.stdout[len(dump):].startswith(packed.encode() + b": "), r.stderr)
    to_file = path("r1-stdout.bin")
    r = run("decompress", packed, "-o", "/dev/stdout", stdout=to_file)
    with open(to_file, "rb") as f:
        written = f.read()
    check("r1 -o /dev/stdout into a file", r.returncode == 0 and written.startswith(dump) and b"wrote" in written[len(dump):],
          r.stderr)
    check("r1 /dev/stdout is still a symbolic link", os.path.islink("/dev/stdout"))

    # A FIFO is written in place, and stays a FIFO.
    fifo = path("r1-fifo")
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(fifo, "rb").read()))
    reader.start()
    r = run("decompress", packed, "-o", fifo)
    reader.join(60)
    check("r1 FIFO written in place", r.returncode == 0 and received == [dump], r.stderr)
    check("r1 FIFO still a FIFO", stat.S_ISFIFO(os.lstat(fifo).st_mode))

    # A device node (our own null device: the system's /dev/null is never put at risk) stays one.
    node = path("r1-null")
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        print("skipped: device node output (cannot create device nodes here)", file=sys.stderr)
    else:
        r = run("decompress", packed, "-o", node)
        check("r1 device node written in place", r.returncode == 0 and stat.S_ISCHR(os.lstat(node).st_mode), r.stderr)
    if os.geteuid() != 0:  # (as root, a regression would replace the machine's /dev/null: the node above stands in)
        r = run("compress", a, "-o", "/dev/null")
        check("r1 -o /dev/null", r.returncode == 0 and stat.S_ISCHR(os.lstat("/dev/null").st_mode), r.stderr)

    # A replaced file keeps its mode.
    private = path("r1-private.gaac")
    with open(private, "w") as f:
        f.write("old")
    os.chmod(private, 0o600)
    r = run("compress", a, "-o", private)
    check("r1 replaced file keeps mode 600", r.returncode == 0 and stat.S_IMODE(os.stat(private).st_mode) == 0o600
          and digest(private) == digest(packed), r.stderr)

    # A write that fails (file size limit) leaves no temporary file and the old output intact.
    before = digest(private)
    r = run("synth", "--tokens", "20000", "-o", private, preexec_fn=limit_file_size(1 << 16))
    check("r1 failed write is an error naming the output", r.returncode == 1 and private in r.stderr
          and "File too large" in r.stderr, r.stderr)
    check("r1 failed write keeps the old file", digest(private) == before)
    r = run("synth", "--tokens", "20000", "-o", path("r1-never.safetensors"), preexec_fn=limit_file_size(1 << 16))
    check("r1 failed write creates nothing", r.returncode == 1 and not os.path.exists(path("r1-never.safetensors")))
    check("r1 no temporary file after failed writes", temporaries(WORK) == [], temporaries(WORK))

    # SIGINT or SIGTERM while the output is being written: the temporary file is removed and the
    # process still dies of the signal. The signal is sent once the temporary file is seen (a large
    # dump keeps it there for a few tenths of a second; a run that finishes first is retried).
    for sig in (signal.SIGINT, signal.SIGTERM):
        directory = path(f"r1-signal-{sig}")
        os.makedirs(directory)
        out = os.path.join(directory, "big.safetensors")
        seen = False
        for _ in range(5):
            p = subprocess.Popen([GAAC, "synth", "--layers", "4", "--kv-heads", "8", "--head-dim", "128", "--tokens",
                                  "8192", "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while p.poll() is None and not temporaries(directory):
                time.sleep(0.0005)
            if p.poll() is None:
                seen = True
                p.send_signal(sig)
            p.wait(120)
            if seen:
                break
            os.remove(out)
        check(f"r1 signal {sig} reached the write", seen)
        check(f"r1 process dies of signal {sig}", p.returncode == -sig, p.returncode)
        check(f"r1 signal {sig} leaves no temporary file", temporaries(directory) == [], temporaries(directory))
        check(f"r1 signal {sig} leaves no output", not os.path.exists(out))


# ---------------------------------------------------------------------------------------------
# Rule 2: every resource a flag controls is bounded and validated.

def rule2_resources():
    model, text = path("r2-model.gguf"), path("r2-text.txt")  # never loaded: the flags fail first
    write_gguf(model, [(b"general.architecture", b"llama")])
    with open(text, "w") as f:
        f.write("text\n")
    commands = {
        "generate": ["generate", "-m", model, "-p", "hi"],
        "capture": ["capture", "-m", model, "--text", text, "-o", path("r2.safetensors")],
        "validate": ["validate", "-m", model, "--text", text, "--reference", text],
    }
    for name, args in commands.items():
        for threads in ("40000", "-5"):
            r = run(*args, "-t", threads)
            check(f"r2 {name} -t {threads} refused", is_usage_error(r) and "--threads: " in r.stderr
                  and "out of range" in r.stderr and (threads != "40000" or "per available CPU" in r.stderr), r.stderr)
    r = run("capture", "-m", model, "--text", text, "--tokens", "-5", "-o", path("r2.safetensors"))
    check("r2 capture --tokens -5 refused", is_usage_error(r) and "--tokens" in r.stderr, r.stderr)
    r = run("generate", "-m", model, "-p", "hi", "-n", "0")
    check("r2 generate -n 0 refused", is_usage_error(r) and "--max-tokens" in r.stderr, r.stderr)
    r = run("synth", "--layers", "1000", "--kv-heads", "256", "--head-dim", "256", "--tokens", "16777216", "-o",
            path("r2-huge.safetensors"))
    check("r2 synth larger than the machine refused", r.returncode == 1 and "this machine has" in r.stderr
          and "bad_alloc" not in r.stderr, r.stderr)
    check("r2 synth wrote nothing", not os.path.exists(path("r2-huge.safetensors")))
    # An input larger than the machine's memory (a sparse file) is refused before it is read.
    sparse = path("r2-sparse.safetensors")
    with open(sparse, "wb") as f:
        f.truncate(2 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    r = run("stats", sparse)
    check("r2 input larger than memory refused", r.returncode == 1 and sparse in r.stderr
          and "more than this machine's" in r.stderr, r.stderr)
    os.remove(sparse)


# ---------------------------------------------------------------------------------------------
# Rule 3: a command succeeds only when its output was written.

def rule3_output_checked():
    kv = small_dump("r3.safetensors")
    packed = path("r3.gaac")
    run("compress", kv, "-o", packed)
    gguf = path("r3.gguf")
    write_gguf(gguf, [(b"general.architecture", b"llama"), (b"general.name", b"tiny")])
    commands = [
        ["inspect", gguf], ["inspect", gguf, "--json"], ["stats", kv], ["stats", kv, "--json"], ["verify", kv],
        ["study", "schemes", kv], ["study", "drift", kv, "--segment", "16", "--layer", "0"],
        ["synth", "-o", path("r3-synth.safetensors")], ["calibrate", kv, "-o", path("r3-calib.safetensors")],
        ["compress", kv, "-o", path("r3-2.gaac")], ["decompress", packed, "-o", path("r3-restored.safetensors")],
        ["--help"], ["--version"],
    ]
    for args in commands:
        r = run(*args, stdout="/dev/full")
        check(f"r3 {' '.join(args[:2])} > /dev/full fails", r.returncode == 1
              and "gaac: error: cannot write the results to standard output" in r.stderr, (r.returncode, r.stderr))
        if args[0] != "--version":  # (CLI11 writes and flushes that line itself: the reason is gone by then)
            check(f"r3 {' '.join(args[:2])} > /dev/full says why", "No space left on device" in r.stderr, r.stderr)
        r = run(*args, stdout=os.devnull)
        check(f"r3 {' '.join(args[:2])} > /dev/null succeeds", r.returncode == 0, r.stderr)
    r = run("decompress", packed, "-o", "/dev/full")
    check("r3 -o /dev/full fails naming it", r.returncode == 1 and "/dev/full: cannot write: No space left" in r.stderr,
          r.stderr)


# ---------------------------------------------------------------------------------------------
# Rule 4: inputs that change, or are not files, give errors, never a signal or a hang.

def rule4_inputs():
    # A stream (here a FIFO that another thread fills) is read to its end, like a file.
    source = small_dump("r4-source.safetensors")
    fifo = path("r4-fifo")
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as f, open(source, "rb") as s:
            f.write(s.read())
    for args in (["stats", "--json"], ["verify"]):
        writer = threading.Thread(target=feed)
        writer.start()
        through_fifo = run(args[0], fifo, *args[1:], timeout=120)
        writer.join(120)
        from_file = run(args[0], source, *args[1:])
        check(f"r4 {args[0]} reads a FIFO like a file", through_fifo.returncode == 0
              and through_fifo.stdout.replace(fifo, source) == from_file.stdout, through_fifo.stderr)
    kv = small_dump("r4.safetensors")
    with open(kv, "r+b") as f:
        f.truncate(os.path.getsize(kv) - 100)
    for command in ("compress", "verify", "stats"):
        args = [command, kv] + (["-o", path("r4.gaac")] if command == "compress" else [])
        r = run(*args)
        check(f"r4 {command} of a truncated dump is an error", r.returncode == 1 and kv in r.stderr
              and "truncated" in r.stderr, r.stderr)


# ---------------------------------------------------------------------------------------------
# Rule 5: every numeric option refuses NaN, infinities, out-of-range values and text.

def rule5_numbers():
    model, text, kv = path("r5.gguf"), path("r5.txt"), small_dump("r5.safetensors")
    write_gguf(model, [(b"general.architecture", b"llama")])
    with open(text, "w") as f:
        f.write("text\n")
    out = path("r5-out.safetensors")
    options = [
        (["synth", "-o", out], ["--layers", "--kv-heads", "--head-dim", "--tokens", "--seed"]),
        (["generate", "-m", model, "-p", "hi"], ["--max-tokens", "--temperature", "--top-p", "--seed", "--threads"]),
        (["capture", "-m", model, "--text", text, "-o", out], ["--tokens", "--threads"]),
        (["validate", "-m", model, "--text", text, "--reference", text], ["--tokens", "--min-agreement", "--threads"]),
        (["study", "drift", kv], ["--segment", "--layer"]),
    ]
    for base, names in options:
        for option in names:
            for value in ("nan", "inf", "-inf", "-1", "1e999", "abc", "", "99999999999999999999999"):
                r = run(*base, option, value)
                check(f"r5 {base[0]} {option} {value!r} refused", is_usage_error(r) and option in r.stderr
                      and len(r.stderr) < 300, r.stderr)
    r = run("synth", "-o", out, "--seed", str(2 ** 64))
    check("r5 seed 2^64 refused, not clamped", is_usage_error(r) and "out of range" in r.stderr, r.stderr)
    r = run("synth", "-o", out, "--seed", str(2 ** 64 - 1), "--tokens", "16", "--layers", "1")
    check("r5 seed 2^64-1 accepted", r.returncode == 0, r.stderr)
    r = run("study", "drift", kv, "--layer", "-1")
    check("r5 --layer -1 says its range briefly", is_usage_error(r) and "from 0 to" in r.stderr
          and len(r.stderr) < 200, r.stderr)
    r = run("study", "drift", kv, "--layer", "5")
    check("r5 --layer beyond the dump names the file", r.returncode == 1 and "--layer 5" in r.stderr and kv in r.stderr,
          r.stderr)
    r = run("generate", "-m", model, "-p", "hi", "--temperature", "0x10")
    check("r5 hexadecimal refused", is_usage_error(r), r.stderr)


# ---------------------------------------------------------------------------------------------
# Rule 6: validate fails below its agreement threshold and when it has nothing to compare.

def rule6_validate(model):
    fake = path("r6.gguf")
    write_gguf(fake, [(b"general.architecture", b"llama")])
    text = path("r6.txt")
    with open(text, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog, and then it rests.\n")
    r = run("validate", "-m", fake, "--text", text)
    check("r6 validate without a reference is a usage error", is_usage_error(r)
          and "nothing to compare against" in r.stderr, r.stderr)
    if model is None:
        return
    tokens = path("r6-tokens.txt")
    r = run("validate", "-m", model, "--text", text, "--tokens", "8", "--write-tokens", tokens)
    check("r6 --write-tokens alone succeeds", r.returncode == 0 and len(open(tokens).read().split()) == 8, r.stderr)
    vocab = 49152
    zeros, nans = path("r6-zero.f32"), path("r6-nan.f32")
    with open(zeros, "wb") as f:
        f.write(bytes(4 * vocab * 8))
    data = bytearray(4 * vocab * 8)
    data[4 * (vocab * 3 + 5):4 * (vocab * 3 + 6)] = struct.pack("<f", float("nan"))
    with open(nans, "wb") as f:
        f.write(data)
    r = run("validate", "-m", model, "--text", text, "--tokens", "8", "--reference", zeros)
    check("r6 a reference that matches nothing fails", r.returncode == 1 and "below --min-agreement 100" in r.stderr,
          r.stdout + r.stderr)
    r = run("validate", "-m", model, "--text", text, "--tokens", "8", "--reference", zeros, "--min-agreement", "0")
    check("r6 the threshold is an option", r.returncode == 0 and "top-1 agreement" in r.stdout, r.stderr)
    r = run("validate", "-m", model, "--text", text, "--tokens", "8", "--reference", nans)
    check("r6 a NaN in the reference is an error naming it", r.returncode == 1 and nans in r.stderr
          and "position 3" in r.stderr and "NaN" in r.stderr and "max |dlogit| 0" not in r.stdout, r.stdout + r.stderr)


# ---------------------------------------------------------------------------------------------
# Rule 7: errors say what and where; text from files never reaches a terminal raw.

def rule7_messages():
    kv = small_dump("r7.safetensors")
    other = small_dump("r7-other.safetensors", layers="3")
    packed, calib = path("r7.gaac"), path("r7-calib.safetensors")
    run("compress", kv, "-o", packed)
    run("calibrate", kv, "-o", calib)
    gguf = path("r7.gguf")
    write_gguf(gguf, [(b"general.architecture", b"llama"), (b"general.name", b"evil\x1b[31m\x1b]0;title\x07\xff\xc2\x9b"),
                      (b"llama.\x1b[2Jkey", b"v\x1b[1m")])

    r = run("stats", packed)
    check("r7 a .gaac given as a dump is named", r.returncode == 1 and f"{packed}: this is a .gaac snapshot" in r.stderr
          and "header length" not in r.stderr, r.stderr)
    r = run("verify", gguf)
    check("r7 a GGUF given as a dump is named", r.returncode == 1 and "this is a GGUF model" in r.stderr, r.stderr)
    r = run("stats", calib)
    check("r7 a calibration table given as a dump is named", r.returncode == 1
          and "this is a calibration table, not a KV dump" in r.stderr, r.stderr)
    r = run("frobnicate", kv)
    check("r7 unknown command", is_usage_error(r) and "'frobnicate' is not a gaac command" in r.stderr
          and "A subcommand is required" not in r.stderr, r.stderr)
    r = run("study", "frob", kv)
    check("r7 unknown study command", is_usage_error(r) and "'frob' is not a gaac study command" in r.stderr, r.stderr)
    bad = path("r7-bad.safetensors")
    with open(bad, "wb") as f:
        f.write(struct.pack("<Q", 8) + b"{bad    ")
    r = run("stats", bad)
    check("r7 bad JSON in plain words", r.returncode == 1 and "not valid JSON" in r.stderr
          and "json.exception" not in r.stderr, r.stderr)
    r = run("calibrate", kv, other, "-o", path("r7-never.safetensors"))
    check("r7 calibrate names the input that differs", r.returncode == 1 and other in r.stderr and kv in r.stderr
          and "3 layers" in r.stderr, r.stderr)
    r = run("stats", other, "--calib", calib)
    check("r7 a mismatched calibration names both files", r.returncode == 1 and other in r.stderr and calib in r.stderr,
          r.stderr)
    r = run("study", "schemes", kv, "--calib-kv", other)
    check("r7 study names the calibration dump that differs", r.returncode == 1 and other in r.stderr, r.stderr)

    for args in (["inspect", gguf], ["inspect", gguf, "--json"]):
        r = subprocess.run([GAAC, *args], capture_output=True)
        check(f"r7 {' '.join(args[1:]) or 'inspect'}: no raw escape from the model", r.returncode == 0
              and b"\x1b" not in r.stdout and b"\x07" not in r.stdout and b"\x9b" not in r.stdout, r.stdout)
    r = subprocess.run([GAAC, "inspect", gguf], capture_output=True)
    check("r7 inspect shows the escapes", b"evil\\x1b[31m" in r.stdout and b"\\x1b[2Jkey" in r.stdout, r.stdout)
    hostile = path("r7-hostile.gguf")
    write_gguf(hostile, [(b"general.architecture", b"llama"), (b"general.alignment\x1b[2J", b"x"),
                         (b"general.alignment", b"not a number")])
    r = subprocess.run([GAAC, "inspect", hostile], capture_output=True)
    check("r7 errors about a model file are escaped", r.returncode == 1 and b"\x1b" not in r.stderr
          and hostile.encode() in r.stderr, r.stderr)

    r = subprocess.run([GAAC, "generate", "-m", gguf, "-p", b"caf\xe9", "--save-kv", path("r7-kv.safetensors")],
                       capture_output=True)
    check("r7 a prompt the dump cannot record is named before any work", r.returncode == 1
          and b"--prompt is not valid UTF-8 (byte 3)" in r.stderr and not os.path.exists(path("r7-kv.safetensors")),
          r.stderr)

    if sanitized_build():
        print("skipped: out-of-memory message (AddressSanitizer build)", file=sys.stderr)
    else:
        r = run("synth", "--layers", "8", "--kv-heads", "8", "--head-dim", "256", "--tokens", "65536", "-o",
                path("r7-big.safetensors"), preexec_fn=limit_memory(300 << 20))
        check("r7 out of memory says while doing what", r.returncode == 1
              and "ran out of memory while generating a synthetic KV dump" in r.stderr and "bad_alloc" not in r.stderr,
              r.stderr)


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    if PART is not None and PART not in PARTS:
        print(f"unknown part {PART!r}; the parts: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    model = model_path()
    needs_model = any(PARTS[p][1] for p in ([PART] if PART else PARTS))
    if needs_model and model is None and os.environ.get("GAAC_REQUIRE_MODELS") == "1":
        check("model for the CLI tests", False, "run scripts/fetch_models.py")
    elif needs_model and model is None:
        print("skipped: tests with a real model (scripts/fetch_models.py)", file=sys.stderr)
    for name in [PART] if PART else PARTS:
        run_part, with_model_only = PARTS[name]
        if model is not None or not with_model_only:
            run_part(model)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def with_model(model):
    """The rules on the commands that run a model."""
    text = path("m-text.txt")
    with open(text, "w") as f:
        f.write("A short text that the model prefills.\n")
    out = path("m-capture.safetensors")
    r = run("capture", "-m", model, "--text", text, "-o", out)
    check("model capture", r.returncode == 0 and os.path.exists(out), r.stderr)
    copy = path("m-model.gguf")
    shutil.copyfile(model, copy)
    before = digest(copy)
    r = run("generate", "-m", copy, "-p", "hi", "-n", "2", "--save-kv", copy)
    check("model generate --save-kv MODEL refused", r.returncode == 1 and "never writes over" in r.stderr
          and digest(copy) == before, r.stderr)
    r = run("generate", "-m", model, "-p", "hi", "-n", "4", stdout="/dev/full")
    check("model generate > /dev/full fails", r.returncode == 1 and "standard output" in r.stderr, r.stderr)
    r = run("capture", "-m", model, "--text", text, "-o", out, stdout="/dev/full")
    check("model capture > /dev/full fails", r.returncode == 1 and "standard output" in r.stderr, r.stderr)
    r = run("validate", "-m", model, "--text", text, "--write-tokens", path("m-tokens.txt"), stdout="/dev/full")
    check("model validate > /dev/full fails", r.returncode == 1 and "standard output" in r.stderr, r.stderr)
    r = run("generate", "-m", model, "-p", "hi", "-n", "3", "-t", "0")
    check("model generate -t 0 (all CPUs)", r.returncode == 0, r.stderr)


def kv_cache(model):
    """generate over the paged cache: both caches give the same tokens, the JSON report, budgets, batches, plan."""
    question = "Name three colours."
    runs = {}
    for kv in ("gaac", "bf16"):
        r = run("generate", "-m", model, "-p", question, "-n", "40", "--kv", kv, "--json")
        ok = r.returncode == 0
        runs[kv] = json.loads(r.stdout) if ok else {}
        check(f"kv generate --kv {kv} --json", ok, r.stderr)
    if len(runs["gaac"]) and len(runs["bf16"]):
        g, b = runs["gaac"], runs["bf16"]
        keys = ["tokens", "kv_resident_bytes", "kv_bf16_bytes", "raw_fallback_tiles", "prompt_tokens_per_s",
                "decode_tokens_per_s"]
        check("kv --json has the keys", all(k in g and k in b for k in keys), sorted(g))
        check("kv the same tokens from either cache", g["tokens"] == b["tokens"] and len(g["tokens"]) > 0,
              (g.get("tokens"), b.get("tokens")))
        check("kv the same BF16 values held", g["kv_bf16_bytes"] == b["kv_bf16_bytes"], (g, b))
        check("kv the GAAC cache holds them in fewer bytes", g["kv_resident_bytes"] < b["kv_resident_bytes"],
              (g["kv_resident_bytes"], b["kv_resident_bytes"]))
        check("kv a bf16 cache has no raw fallbacks", b["raw_fallback_tiles"] == 0, b)
        check("kv --json gives the share of finalized tiles kept raw", g["raw_fallback_fraction"]
              == g["raw_fallback_tiles"] / (g["raw_fallback_tiles"] + g["compressed_tiles"]), g)
    r = run("generate", "-m", model, "-p", question, "-n", "40", "--kv-budget", "64K")
    check("kv a budget below one block is refused up front, saying what the tokens need", r.returncode == 1
          and "--kv-budget 65536 bytes cannot hold" in r.stderr and "needs a budget of at least" in r.stderr, r.stderr)
    r = run("generate", "-m", model, "-p", question * 8, "-n", "40", "--kv-budget", "600K")
    check("kv a budget too small for the prompt is refused up front, saying how much the tokens need",
          r.returncode == 1 and r.stdout == "" and "--kv-budget 614400 bytes cannot hold" in r.stderr
          and "needs a budget of at least" in r.stderr, r.stderr)
    for bad in ("12Q", "1.5G", "-1", "0"):
        r = run("generate", "-m", model, "-p", "hi", "--kv-budget", bad)
        check(f"kv --kv-budget {bad} is a usage error naming the option", is_usage_error(r) and "--kv-budget" in r.stderr,
              r.stderr)
    r = run("generate", "-m", model, "-p", "hi", "--kv", "fp8")
    check("kv --kv fp8 is a usage error", is_usage_error(r) and "--kv" in r.stderr, r.stderr)
    batch = path("kv-batch.txt")
    with open(batch, "w") as f:
        f.write(question + "\n\nWhat is two plus two?\nSay hello.\n")
    for kv in ("gaac", "bf16"):
        r = run("generate", "-m", model, "--batch-file", batch, "-n", "40", "--kv", kv, "--json")
        ok = r.returncode == 0
        report = json.loads(r.stdout) if ok else {}
        check(f"kv --batch-file --kv {kv}: three answers in one run", ok and len(report.get("sequences", [])) == 3,
              r.stderr)
        if ok and runs.get(kv):
            check(f"kv --batch-file --kv {kv}: a prompt's answer is the one it gets alone",
                  report["sequences"][0]["tokens"] == runs[kv]["tokens"], (report["sequences"][0], runs[kv]["tokens"]))
    r = run("generate", "-m", model, "--batch-file", batch, "-p", "hi")
    check("kv --batch-file with --prompt is refused", r.returncode == 1 and "exactly one of" in r.stderr, r.stderr)
    r = run("plan", "-m", model, "--budget", "16M", "--tokens", "512", "--json")
    ok = r.returncode == 0
    held = json.loads(r.stdout) if ok else {}
    check("kv plan: GAAC holds more than BF16 in one budget", ok
          and held["gaac"]["max_tokens"] > held["bf16"]["max_tokens"] > 0, r.stderr)
    r = run("plan", "-m", model, "--budget", "4G", "--tokens", "512", "--json")
    held = json.loads(r.stdout) if r.returncode == 0 else {}
    check("kv plan: the longest sequence stops at the model's context", held
          and held["gaac"]["max_tokens"] > held["context_tokens"] == held["gaac"]["longest_sequence"], r.stdout)
    r = run("plan", "-m", model, "--budget", "4G", "--tokens", "512")
    check("kv plan: the table says the longest sequence is the context", "8192 (context)" in r.stdout, r.stdout)
    r = run("plan", "-m", model, "--budget", "64M", "--tokens", "1")
    found = re.search(r"sequences of 1 tokens: gaac holds (\d+), bf16 (\d+) \((\S+)×\); shorter than a 16-token block", r.stdout)
    check("kv plan --tokens 1: the headline compares the sequences asked about and says why gaac holds fewer",
          found and int(found.group(1)) < int(found.group(2)) and float(found.group(3)) < 1, r.stdout)
    small = path("kv-small.safetensors")
    run("synth", "--layers", "2", "--kv-heads", "3", "--head-dim", "64", "--tokens", "32", "-o", small)
    r = run("plan", "-m", model, "--budget", "64M", "--check", small)
    check("kv plan --check with a dump of another geometry names the file and both shapes", r.returncode == 1
          and f"--check {small}" in r.stderr and "2 layers × 3 KV heads × head_dim 64" in r.stderr
          and "30 layers × 3 KV heads × head_dim 64" in r.stderr, r.stderr)


def raw_share():
    """stats reports the share of tiles that fall back to raw, and says when a calibration does not fit."""
    calib_kv, calib = path("share-calib-kv.safetensors"), path("share-calib.safetensors")
    run("synth", "--layers", "1", "--kv-heads", "1", "--head-dim", "64", "--tokens", "64", "-o", calib_kv)
    run("calibrate", calib_kv, "-o", calib)
    wild = path("share-wild.safetensors")  # random bit patterns: exponents everywhere, far outside any window
    data = bytes((i * 2654435761 >> 7) & 0xFF if i % 2 == 0 else (i * 40503 >> 3) & 0x7F for i in range(64 * 64 * 2))
    write_safetensors(wild, {"k.0": ("BF16", [64, 1, 64], data), "v.0": ("BF16", [64, 1, 64], data)})
    r = run("stats", wild, "--calib", calib, "--json")
    report = json.loads(r.stdout) if r.returncode == 0 else {}
    check("share stats --json gives the share of tiles kept raw", report.get("fallback_fraction", -1)
          == report.get("fallback_tiles", 0) / max(report.get("tiles", 1), 1) and report.get("fallback_fraction", 0) > 0.05,
          (r.stdout[:300], r.stderr))
    check("share stats says the calibration does not fit and how to calibrate", "fell back to raw" in r.stderr
          and "gaac calibrate" in r.stderr and "--calib" in r.stderr, r.stderr)
    r = run("stats", calib_kv, "--calib", calib)
    check("share stats on the calibration's own values: the table's raw line, no note", r.returncode == 0
          and "raw fallback tiles: " in r.stdout and "fell back" not in r.stderr, (r.stdout, r.stderr))


def budgets(model):
    """generate checks what it can before the work, and a budget that runs out keeps the answers."""
    r = run("generate", "-m", model, "-p", "", "-n", "4")
    check("budget -p '' is refused as empty, not as missing", r.returncode == 1 and "--prompt is empty" in r.stderr, r.stderr)
    r = run("generate", "-m", model, "-p", "hi", "--kv-budget", "99999999999999999999")
    check("budget --kv-budget past 2^64 states the accepted range", is_usage_error(r)
          and "from 1 to 1125899906842624 bytes" in r.stderr, r.stderr)
    r = run("generate", "-m", model, "-p", "hi", "-n", "4", "--kv-budget", "1T")
    check("budget --kv-budget 1T is refused as more than the machine's memory", r.returncode == 1
          and "bytes of memory" in r.stderr and "input" not in r.stderr, r.stderr)
    r = run("generate", "-m", model, "-p", "hi", "-n", "4", "--save-kv", "/proc/gaac-test.safetensors")
    check("budget --save-kv where no file can be created fails before generating", r.returncode == 1
          and r.stdout == "" and "/proc/gaac-test.safetensors" in r.stderr, (r.stdout, r.stderr))
    r = run("generate", "-m", model, "-p", "hi", "-n", "4", "--json", "--save-kv", "/dev/stdout")
    check("budget --save-kv /dev/stdout is refused: standard output carries the answer", r.returncode == 1
          and r.stdout == "" and "standard output" in r.stderr, (r.stdout[:200], r.stderr))
    # Three prompts: the first finishes early, the two others are long.
    story = "Tell me a long story about a dragon, please, in very many words."
    batch = path("budget-batch.txt")
    with open(batch, "w") as f:
        f.write(f"Reply with one word: yes.\n{story}\n{story}\n")
    r = run("generate", "-m", model, "--batch-file", batch, "-n", "24", "--kv-budget", "1M")
    found = re.search(r"needs a budget of at least (\d+) bytes for them", r.stderr)
    check("budget --batch-file: a budget too small for every prompt and -n is refused up front, naming the total",
          r.returncode == 1 and r.stdout == "" and found and "3 prompts" in r.stderr
          and "prompt 1 alone needs" in r.stderr, r.stderr)
    if not found:
        return
    least = found.group(1)
    r = run("generate", "-m", model, "--batch-file", batch, "-n", "24", "--kv-budget", least, "--json")
    report = json.loads(r.stdout) if r.stdout.startswith("{") else {}
    cut = [s["kv_full"] for s in report.get("sequences", [])]
    check("budget --batch-file: a budget that runs out anyway keeps the answers finished", r.returncode == 1
          and cut == [False, True, True] and len(report["sequences"][0]["tokens"]) > 0
          and "1 of 3 answers finished" in r.stderr, (cut, r.stderr))
    found = re.search(r"at position (\d+) needs a budget of (\d+) bytes; the budget is " + least + " bytes", r.stderr)
    check("budget running out names the budget needed and the budget given", found, r.stderr)
    if not found:
        return
    position, needed = found.group(1), int(found.group(2))
    r = run("generate", "-m", model, "--batch-file", batch, "-n", "24", "--kv-budget", str(needed - 1))
    check("budget one byte below the budget named runs out at the same place", r.returncode == 1
          and f"at position {position} needs a budget of {needed} bytes" in r.stderr, r.stderr)
    r = run("generate", "-m", model, "--batch-file", batch, "-n", "24", "--kv-budget", str(needed))
    check("budget the budget named is enough for that step", f"at position {position} " not in r.stderr
          and r.stdout.count("### ") == 3, r.stderr)


def files_part(model):
    basics()
    fp8()
    raw_share()


def rules_part(model):
    rule2_resources()
    rule3_output_checked()
    rule4_inputs()
    rule5_numbers()
    rule6_validate(model)


# name: (what it runs, whether it needs the model)
PARTS = {"files": (files_part, False), "outputs": (lambda model: rule1_outputs(), False),
         "rules": (rules_part, False), "messages": (lambda model: rule7_messages(), False), "model": (with_model, True),
         "cache": (kv_cache, True), "budgets": (budgets, True)}


if __name__ == "__main__":
    sys.exit(main())
