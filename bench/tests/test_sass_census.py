"""bench/sass_census.py without a GPU or cuobjdump: a synthetic listing in
cuobjdump -sass's format, with two kernels, guard predicates, a work-tile
loop around a key loop, and a spin loop too short to count."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sass_census  # noqa: E402


def listing(name, body):
    """cuobjdump's lines for one function: address comments, ';', encoding."""
    lines = [f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90\""]
    for i, text in enumerate(body):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;"
                     f"                 /* 0x000000000000000{i % 10} */")
    return lines


# Addresses are 16 * index: the key loop is 0x40-0x90 (indices 4-9), the
# work-tile loop 0x20-0xb0 (2-11), the spin loop 0xc0-0xd0 (12-13).
KERNEL = [
    "LDC R1, c[0x0][0x28]",                 # 0
    "S2R R0, SR_TID.X",                     # 1
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",  # 2 work tile
    "LDL R4, [R1]",                         # 3
    "WARPGROUP.ARRIVE",                     # 4 key loop
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT",  # 5
    "MUFU.EX2 R5, R5",                      # 6
    "@!P1 MUFU.EX2 R6, R6",                 # 7
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24",  # 8
    "@P2 BRA 0x40",                         # 9 back to the key loop's start
    "STG.E [R8.64], R24",                   # 10
    "@P3 BRA 0x20",                         # 11 back to the work tile's start
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",  # 12
    "@!P0 BRA 0xc0",                        # 13 spin: two instructions
    "STL [R1], R4",                         # 14
    "EXIT",                                 # 15
]


def test_parse_splits_functions_and_reads_addresses():
    lines = listing("_Z6kernelA", KERNEL) + listing("_Z6kernelB", ["NOP", "EXIT"])
    functions = sass_census.parse(lines)
    assert list(functions) == ["_Z6kernelA", "_Z6kernelB"]
    assert len(functions["_Z6kernelA"]) == len(KERNEL)
    assert functions["_Z6kernelA"][9] == (0x90, "@P2 BRA 0x40")


def test_opcode_drops_the_guard_predicate():
    assert sass_census.opcode("@!P1 MUFU.EX2 R6, R6") == "MUFU.EX2"
    assert sass_census.opcode("@UPT HGMMA.64x8x16.F32.BF16 R0") == "HGMMA.64x8x16.F32.BF16"
    assert sass_census.opcode("STG.E [R8.64], R24") == "STG.E"


def test_census_counts_and_finds_the_key_loop():
    instructions = sass_census.parse(listing("_Z6kernelA", KERNEL))["_Z6kernelA"]
    c = sass_census.census(instructions, min_loop=5)
    assert c["instructions"] == 16
    assert c["counts"]["HGMMA"] == 2 and c["counts"]["MUFU"] == 2
    assert c["counts"]["LDL"] == 1 and c["counts"]["STL"] == 1 and c["counts"]["STG"] == 1
    assert c["counts"]["SYNCS"] == 2
    # Longest first; the spin loop (2 instructions) is below min_loop.
    assert [span for span, _ in c["loops"]] == [(2, 11), (4, 9)]
    assert c["key_loop"] == (4, 9)
    key_counts = dict(c["loops"])[(4, 9)]
    assert key_counts["HGMMA"] == 2 and key_counts["MUFU"] == 2 and key_counts["LDL"] == 0


def test_no_key_loop_without_gemms():
    body = ["NOP", "NOP", "NOP", "@P0 BRA 0x0", "EXIT"]
    c = sass_census.census(sass_census.parse(listing("_Z1f", body))["_Z1f"], min_loop=2)
    assert c["loops"] and c["key_loop"] is None


def test_main_filters_by_pattern(tmp_path, capsys):
    dump = tmp_path / "unit.sass"
    dump.write_text("\n".join(listing("_Z6kernelA", KERNEL) + listing("_Z6kernelB", ["EXIT"])))
    assert sass_census.main([str(dump), "kernelA", "--min-loop", "5"]) == 0
    out = capsys.readouterr().out
    assert "_Z6kernelA" in out and "_Z6kernelB" not in out
    assert "16 instructions" in out and "key loop" in out
    assert sass_census.main([str(dump), "nothing"]) == 1


def test_stmatrix_and_ldmatrix_are_not_shared_stores_or_loads():
    body = ["STS [R0], R1", "STS.128 [R0], R4", "STSM.16.M88.4 [R2], R8", "LDS R3, [R0]",
            "LDSM.16.M88.4 R8, [R2]", "EXIT"]
    c = sass_census.counts(sass_census.parse(listing("_Z1k", body))["_Z1k"])
    assert (c["STS"], c["STSM"], c["LDS"], c["LDSM"]) == (2, 1, 1, 1)
