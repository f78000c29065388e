"""The machine code of kiln's kernels' loops, without a GPU: what ptxas made of the PTX.

    python3 scripts/sass_loops.py DIR_OR_PTX... [--match REGEX] [--all-loops]

Takes PTX files (or directories of them: `KILN_PTX_DUMP=DIR`, or `kiln ptx --out DIR`), compiles
each with the toolkit's ptxas for the file's own .target, disassembles the cubin with cuobjdump
(the toolkit's, or else the `nvidia-cuda-cuobjdump` wheel from PyPI, installed once into the
benchmarks' virtual environment, .venv-bench or $KILN_BENCH_VENV), and prints for each loop (a
backward branch and its target; the innermost ones unless --all-loops) the instructions it holds
by kind. Counted from the loop's first instruction to its branch, both paths of a branch inside
it included (a slow edge path is counted too: read the fast path's mix off the kinds that only
it has). Also prints:
  - where the loop's global loads (LDG) and cp.async copies (LDGSTS) sit among the FFMAs of each
    k step (the FFMAs before each): ptxas schedules loads issued at the top of a k step in PTX
    as late as it likes;
  - the memory barriers (MEMBAR) a fence puts in the loop.
The PTX ISA says what the PTX means; this says what the hardware runs. Nothing here is timed.
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def find_tool(name):
    for path in (shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if path and os.path.exists(path):
            return path
    venv = os.environ.get("KILN_BENCH_VENV", ".venv-bench")
    found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "*", "bin", name))
    if not found and name == "cuobjdump":
        print(f"installing nvidia-cuda-cuobjdump from PyPI into {venv} (once)", file=sys.stderr)
        if not os.path.exists(os.path.join(venv, "bin", "pip")):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        # The cu13 cuobjdump disassembles through nvdisasm, a wheel of its own.
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "nvidia-cuda-cuobjdump",
                        "nvidia-cuda-nvdisasm"], check=True)
        found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "*", "bin", name))
    if not found:
        sys.exit(f"sass_loops: {name} not found (PATH, /usr/local/cuda/bin, {venv})")
    for tool in [found[0]] + glob.glob(os.path.join(os.path.dirname(found[0]), "nvdisasm")):
        os.chmod(tool, 0o755)  # wheels may not keep the mode
    return found[0]


def kind(text):
    """The instruction's kind: its opcode, with the width of memory accesses (LDS.128)."""
    words = text.split()
    op = words[1] if words[0].startswith("@") else words[0]
    parts = op.split(".")
    if parts[0] in ("LDS", "STS", "LDG", "STG", "LDGSTS"):
        width = next((p for p in parts[1:] if p in ("64", "128")), "")
        return parts[0] + ("." + width if width else "")
    return parts[0]


def sass_of(ptx, ptxas, cuobjdump):
    target = re.search(r"^\.target\s+(\w+)", open(ptx).read(), re.M).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        done = subprocess.run([ptxas, f"-arch={target}", "-o", cubin, ptx], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"sass_loops: ptxas rejected {ptx}:\n{done.stderr}")
        env = dict(os.environ, PATH=os.path.dirname(cuobjdump) + os.pathsep + os.environ.get("PATH", ""))
        text = subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True, text=True, env=env).stdout
    return [(int(m.group(1), 16), m.group(2)) for m in map(LINE.match, text.splitlines()) if m]


def loops(code, innermost):
    """(start, end) index ranges of the loops: a branch to an earlier address and that address
    (addresses are one function's: kiln writes a kernel a file)."""
    at = {addr: i for i, (addr, _) in enumerate(code)}
    found = []
    for i, (addr, text) in enumerate(code):
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in at:
            found.append((at[int(m.group(1), 16)], i))
    if innermost:
        found = [(s, e) for s, e in found if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in found)]
    return found


def report(ptx, code, ranges):
    name = os.path.basename(ptx)
    for start, end in ranges:
        body = [t for _, t in code[start:end + 1]]
        kinds = collections.Counter(kind(t) for t in body)
        mix = ", ".join(f"{k} {n}" for k, n in kinds.most_common())
        print(f"{name} loop 0x{code[start][0]:x}-0x{code[end][0]:x}: {len(body)} instructions: {mix}")
        # Per k step (the stretch up to each barrier): the FFMAs issued before each global load
        # and each cp.async copy.
        segment, ffmas, loads, copies = 0, 0, [], []
        for t in body:
            k = kind(t)
            if k == "FFMA":
                ffmas += 1
            elif k in ("LDG", "LDG.64", "LDG.128"):
                loads.append(ffmas)
            elif k.startswith("LDGSTS"):
                copies.append(ffmas)
            elif k == "BAR":
                if ffmas and loads:
                    print(f"  step {segment}: global loads after FFMA # {loads} of its {ffmas}")
                if ffmas and copies:
                    print(f"  step {segment}: cp.async copies after FFMA # {copies} of its {ffmas}")
                segment, ffmas, loads, copies = segment + 1, 0, [], []
        for t in body:
            if kind(t) == "MEMBAR":
                print(f"  {t}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("paths", nargs="+")
    p.add_argument("--match", default="", help="only kernels whose file name matches this regex")
    p.add_argument("--all-loops", action="store_true")
    a = p.parse_args()
    ptxas, cuobjdump = find_tool("ptxas"), find_tool("cuobjdump")
    files = []
    for path in a.paths:
        files += sorted(glob.glob(os.path.join(path, "*.ptx"))) if os.path.isdir(path) else [path]
    for ptx in files:
        if re.search(a.match, os.path.basename(ptx)):
            code = sass_of(ptx, ptxas, cuobjdump)
            report(ptx, code, loops(code, not a.all_loops))


if __name__ == "__main__":
    main()
