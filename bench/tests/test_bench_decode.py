"""The host-side logic of bench/decode.py, without a GPU or torch: the grid
it times (and its filters), the bytes it counts, the commands it gives
gqattn_bench and how it reads their lines, the goal's verdicts, the
ratios, and a whole --ours-only run against a stand-in gqattn_bench
writing decode.json. The timing is checked by running the script on the
GPU machine."""
import argparse
import json
import os
import stat
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import decode  # noqa: E402

Case = decode.Case


def test_grid_spans_what_the_issue_asks():
    shapes, skipped = decode.cases()
    assert not skipped  # every shape of this grid fits MAX_CACHE_BYTES
    assert len(shapes) == len(set(shapes))
    assert {c.tq for c in shapes} == {1, 16, 64}
    assert {c.page for c in shapes} == {0, 1, 16, 256}
    assert {c.lengths for c in shapes} == {"mixed", "8k", "32k"}
    assert {c.B for c in shapes} == {1, 8, 32, 128}
    assert {c.d for c in shapes} == {64, 128, 256}
    assert {c.hkv for c in shapes} == {8, 1}
    assert {c.d for c in shapes if c.hkv == 1} == {64, 128, 256}
    assert all(decode.causal(c) == (c.tq > 1) for c in shapes)
    assert all(decode.cache_bytes(c) <= decode.MAX_CACHE_BYTES for c in shapes)
    # Runtime: one gqattn_bench process per group and backend, SDPA once
    # per group; this many keeps the run under about 6 minutes.
    assert len(shapes) <= 150 and len(decode.groups(shapes)) <= 45
    # Every group's shapes differ only in their cache layout.
    for members in decode.groups(shapes):
        assert len({c._replace(page=0) for c in members}) == 1


def test_quick_and_match_filter_the_grid():
    quick, _ = decode.cases(quick=True)
    assert 0 < len(quick) <= 8
    one_key, _ = decode.cases(match="p1")
    assert one_key and all(c.page == 1 for c in one_key)  # not p16
    chunks, _ = decode.cases(match="Tq16 p16")
    assert chunks and all(c.tq == 16 and c.page == 16 for c in chunks)
    assert decode.cases(match="B1 dense d128 32k")[0] == [Case(1, 1, "32k", 8, 128, 0)]
    assert decode.cases(match="nothing")[0] == []


def test_too_large_caches_are_skipped(monkeypatch):
    monkeypatch.setattr(decode, "MAX_CACHE_BYTES", 1e9)
    shapes, skipped = decode.cases()
    assert skipped and all(size > 1e9 for _, size in skipped)
    assert all(decode.cache_bytes(c) <= 1e9 for c in shapes)
    big = Case(1, 128, "32k", 8, 128, 0)
    assert decode.cache_bytes(big) == 128 * 32768 * 8 * 128 * 2 * 2
    assert (decode.label(big), decode.cache_bytes(big)) in skipped


def test_lengths_are_seeded_and_in_range():
    mixed = decode.lens_of("mixed", 128)
    assert mixed == decode.lens_of("mixed", 128)
    assert min(mixed) >= 512 and max(mixed) <= 32768 and len(set(mixed)) > 100
    assert decode.lens_of("8k", 3) == [8192] * 3 and decode.lens_of("32k", 1) == [32768]


def test_bytes_are_the_keys_read_and_q_and_o():
    # K and V: (5 + 9) keys * Hkv 2 * d 8 * 2 tensors * 2 bytes; q and o:
    # 2 * B 2 * Tq 3 * H 32 * d 8 * 2 bytes.
    assert decode.bytes_moved([5, 9], 3, 2, 8) == 14 * 2 * 8 * 2 * 2 + 2 * 2 * 3 * 32 * 8 * 2
    # A window keeps the last window + Tq - 1 keys; one as wide as the keys
    # is no window (Problem::effective_window).
    assert decode.keys_read(100, 4, window=10) == 13
    assert decode.keys_read(100, 1, window=100) == 100
    assert decode.keys_read(100, 1) == 100


def test_labels_and_the_gqattn_bench_spec():
    c = Case(16, 2, "8k", 1, 64, 16)
    assert decode.label(c) == "Tq16 B2 8k H32/1 d64 c1 p16"
    assert decode.group(c) == "Tq16 B2 8k H32/1 d64 c1"
    assert decode.label(c._replace(tq=1, page=0)) == "Tq1 B2 8k H32/1 d64 dense"
    assert decode.kv_spec(c) == "8192/8192,16,32,1,64,16,1,0,0"
    mixed = Case(1, 3, "mixed", 8, 128, 0)
    lens = decode.lens_of("mixed", 3)
    assert decode.kv_spec(mixed) == "/".join(map(str, lens)) + ",1,32,8,128,0,0,0,0"


def test_one_gqattn_bench_process_per_group(monkeypatch):
    seen = []
    shapes = [Case(1, 2, "8k", 8, 128, p) for p in (0, 1, 16)]

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        # Two lines, then a failure: the third shape gets the error.
        lines = [json.dumps({"tbps": 1.5, "bytes": 10}), json.dumps({"error": "unsupported"})]
        return types.SimpleNamespace(returncode=2, stdout="\n".join(lines) + "\n",
                                     stderr="gqattn_bench: cudaMalloc: out of memory")
    monkeypatch.setattr(decode.subprocess, "run", fake_run)
    recs = decode.run_ours("b", shapes, "cuda-hopper", 10, 2000, batch_invariant=True)
    cmd = seen[-1]
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--kv-cache"] == \
        [decode.kv_spec(c) for c in shapes]
    assert "--no-backward" in cmd and cmd[-3:] == ["--spin-ahead-us", "2000", "--batch-invariant"]
    assert cmd[cmd.index("--backend") + 1] == "cuda-hopper"
    assert [r["shape"] for r in recs] == [decode.label(c) for c in shapes]
    assert recs[0]["tbps"] == 1.5 and recs[1]["error"] == "unsupported"
    assert recs[2]["error"].startswith("exit 2: ") and "out of memory" in recs[2]["error"]
    assert all(r["backend"] == "cuda-hopper" and r["group"] == "Tq1 B2 8k H32/8 d128"
               for r in recs)
    plain = decode.ours_command("b", shapes[:1], "cuda-flash", 5, 0)
    assert "--spin-ahead-us" not in plain and "--batch-invariant" not in plain


def test_goal_applies_to_long_decoding_shapes():
    assert decode.goal_tbps(Case(1, 8, "8k", 8, 128, 16)) == 3.8
    assert decode.goal_tbps(Case(1, 8, "32k", 8, 128, 0)) == 3.8
    assert decode.goal_tbps(Case(1, 8, "32k", 8, 128, 256)) == 3.8
    assert abs(decode.goal_tbps(Case(1, 8, "8k", 1, 64, 1)) - 0.7 * 3.8) < 1e-12
    assert min(decode.lens_of("mixed", 128)) < 8192
    assert decode.goal_tbps(Case(1, 128, "mixed", 8, 128, 16)) is None  # keys under 8k
    # Mixed lengths that all reach 8k are held to it too.
    long_enough = min(decode.lens_of("mixed", 8)) >= 8192
    assert (decode.goal_tbps(Case(1, 8, "mixed", 8, 128, 16)) == 3.8) == long_enough
    assert decode.goal_tbps(Case(16, 8, "8k", 8, 128, 16)) is None  # not decoding


def test_summary_ratios_and_goal():
    ours = ["cuda-hopper", "cuda-flash"]
    dense, paged = Case(1, 8, "8k", 8, 128, 0), Case(1, 8, "8k", 8, 128, 1)
    results = [
        {"backend": "cuda-hopper", "shape": decode.label(dense), "tbps": 4.0},
        {"backend": "cuda-flash", "shape": decode.label(dense), "tbps": 3.0},
        {"backend": "cuda-hopper", "shape": decode.label(paged), "tbps": 2.7},
        {"backend": "cuda-flash", "shape": decode.label(paged), "error": "unsupported"},
        # SDPA: one record per group, for every layout of it.
        {"backend": "sdpa-cudnn", "shape": None, "group": decode.group(dense), "tbps": 2.5},
        {"backend": "sdpa-flash", "shape": None, "group": decode.group(dense), "tbps": 3.2},
        {"backend": "flashinfer", "shape": decode.label(paged), "group": decode.group(paged),
         "tbps": 4.0},
        {"backend": "sdpa-cudnn", "shape": None, "group": "other", "tbps": 99.0},
    ]
    table = decode.summarise([dense, paged], results, ours)
    row = table[0]
    assert row["best_peer"] == "sdpa-flash" and row["ratio"]["cuda-hopper"] == 4.0 / 3.2
    assert row["meets"] == {"cuda-hopper": True, "cuda-flash": False}
    row = table[1]
    assert row["best_peer"] == "flashinfer" and row["ratio"] == {"cuda-hopper": 2.7 / 4.0}
    assert row["meets"] == {"cuda-hopper": True}  # 2.7 >= 0.7 * 3.8
    assert row["bytes"] == decode.bytes_moved([8192] * 8, 1, 8, 128)
    lines = decode.goal_lines(table, ours)
    assert lines[0] == "goal cuda-hopper: 2 of 2 applicable shapes meet it"
    assert lines[1].startswith("goal cuda-flash: 0 of 2") and decode.label(paged) in lines[1]
    decode.print_table(table, results, ours)  # prints without a KeyError


def test_document_is_json():
    args = argparse.Namespace(repeats=30, spin_ahead_us=2000, batch_invariant=False,
                              quick=True, match="")
    shapes = [Case(1, 8, "8k", 8, 128, 16)]
    doc = decode.document(args, ["cuda-hopper"], shapes, [("x", 5e10)], [], [], [],
                          dict(gpu={}, flashinfer="not installed", torch=None, partial=False,
                               stopped_at=None))
    back = json.loads(json.dumps(doc))
    assert back["shapes"] == ["Tq1 B8 8k H32/8 d128 p16"]
    assert back["flashinfer"] == "not installed"
    assert back["skipped_shapes"] == [{"shape": "x", "cache_bytes": 5e10}]
    assert back["goal"]["tbps"] == 3.8 and back["ours"] == ["cuda-hopper"]


STAND_IN = """#!{python}
# gqattn_bench's stand-in: one line per --kv-cache, as the real one prints.
import json, sys
args = sys.argv[1:]
backend = args[args.index("--backend") + 1]
for i, a in enumerate(args):
    if a == "--kv-cache":
        lens, rest = args[i + 1].split(",", 1)
        lens = [int(n) for n in lens.split("/")]
        tq, h, hkv, d, page = (int(x) for x in rest.split(",")[:5])
        moved = sum(lens) * hkv * d * 4 + 2 * len(lens) * tq * h * d * 2
        print(json.dumps({{"backend": backend, "page_size": page, "bytes": moved,
                           "fwd_ms": 1.0, "tbps": moved / 1e9, "fwd_spin_short": 0}}))
"""


def test_ours_only_run_writes_decode_json(tmp_path, monkeypatch):
    bench = tmp_path / "gqattn_bench"
    bench.write_text(STAND_IN.format(python=sys.executable))
    bench.chmod(bench.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "argv", ["decode.py", "--bench", str(bench), "--ours-only",
                                      "--quick", "--match", "8k B8", "--out", str(tmp_path)])
    decode.main()
    doc = json.loads((tmp_path / "decode.json").read_text())
    assert doc["partial"] is False and doc["torch"] is None
    labels = [decode.label(c) for c in decode.QUICK if decode.matches(c, "8k B8")]
    assert doc["shapes"] == labels
    assert [r["shape"] for r in doc["results"] if r["backend"] == "cuda-hopper"] == labels
    for rec, c in zip([r for r in doc["results"] if r["backend"] == "cuda-flash"],
                      [c for c in decode.QUICK if decode.matches(c, "8k B8")]):
        assert rec["bytes"] == decode.bytes_moved(decode.lens_of(c.lengths, c.B), c.tq, c.hkv,
                                                  c.d)
        assert rec["page_size"] == c.page
    assert len(doc["table"]) == len(labels) and doc["summary"]
