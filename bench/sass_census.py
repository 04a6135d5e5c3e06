"""A census of the SASS of the kernels in `cuobjdump -sass` output, on the host.

For each kernel (function) whose mangled name matches a pattern: its
instruction count, the counts of the instructions that tell a kernel's
story here (HGMMA: the tensor-core GEMMs; MUFU: exponentials and
reciprocals; LDL/STL: register spills; BAR, SYNCS: barriers; STG/STS/LDS:
global and shared stores and loads; STSM/LDSM: stmatrix and ldmatrix) and
its loops: every backward branch
spanning at least --min-loop instructions, with the same counts inside it.
A kernel's key loop is its shortest loop that holds HGMMA (the loops around
it are the work-tile loops). The point is to
compare two builds (a switch flipped) without a GPU: whether a change moved
the key loop, or only code outside it.

Where the dumps come from: scripts/sass-census compiles a translation unit
of the build and dumps it with cuobjdump and nvdisasm (the CUDA toolkit's,
or the PyPI wheels nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm, which run
on a machine without a GPU).
Checked by bench/tests/test_sass_census.py (synthetic listings).

usage: python bench/sass_census.py DUMP.sass [PATTERN] [--min-loop N]
"""
import argparse
import collections
import re
import sys

# The instruction classes counted, by the opcode's name before its first
# '.' (so STSM, stmatrix, is not counted as STS).
CLASSES = ("HGMMA", "MUFU", "LDL", "STL", "BAR", "SYNCS", "STG", "STS", "LDS", "STSM", "LDSM",
           "SHFL")

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
_BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def opcode(text):
    """The opcode of one instruction's text, without its guard predicate."""
    fields = _PREDICATE.sub("", text).split()
    return fields[0] if fields else ""


def parse(lines):
    """{function: [(address, text)]} of a cuobjdump -sass listing, in order."""
    functions = collections.OrderedDict()
    current = None
    for line in lines:
        m = _FUNCTION.match(line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    return functions


def counts(instructions):
    c = collections.Counter()
    for _, text in instructions:
        name = opcode(text).split(".")[0]
        if name in CLASSES:
            c[name] += 1
    return c


def loops(instructions, min_loop):
    """(first, last) indices of the backward branches' bodies, longest first."""
    index_of = {address: i for i, (address, _) in enumerate(instructions)}
    found = []
    for i, (_, text) in enumerate(instructions):
        m = _BRANCH_TARGET.search(text)
        if not m:
            continue
        target = index_of.get(int(m.group(1), 16))
        if target is not None and target < i and i - target + 1 >= min_loop:
            found.append((target, i))
    return sorted(found, key=lambda span: span[0] - span[1])


def census(instructions, min_loop):
    spans = loops(instructions, min_loop)
    with_gemms = [s for s in spans if counts(instructions[s[0]:s[1] + 1])["HGMMA"] > 0]
    key = min(with_gemms, key=lambda s: s[1] - s[0]) if with_gemms else None
    return {
        "instructions": len(instructions),
        "counts": counts(instructions),
        "loops": [(s, counts(instructions[s[0]:s[1] + 1])) for s in spans],
        "key_loop": key,
    }


def describe(c):
    return " ".join(f"{cls} {c[cls]}" for cls in CLASSES if c[cls])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump")
    ap.add_argument("pattern", nargs="?", default="")
    ap.add_argument("--min-loop", type=int, default=50)
    args = ap.parse_args(argv)
    with open(args.dump, errors="replace") as f:
        functions = parse(f)
    pattern = re.compile(args.pattern)
    shown = 0
    for name, instructions in functions.items():
        if not pattern.search(name):
            continue
        shown += 1
        c = census(instructions, args.min_loop)
        print(f"{name}\n  {c['instructions']} instructions: {describe(c['counts'])}")
        for (first, last), lc in c["loops"]:
            mark = "  key loop" if (first, last) == c["key_loop"] else ""
            print(f"  loop {instructions[first][0]:#x}-{instructions[last][0]:#x}: "
                  f"{last - first + 1} instructions: {describe(lc)}{mark}")
    if shown == 0:
        print(f"no function matches {args.pattern!r} in {args.dump}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
