"""The host-side logic of bench/side_by_side.py, without a GPU: the exact
FLOP count's kept pairs, and the clock sampler's parsing of nvidia-smi
lines and their attribution to each record's timed calls, and (with a
stand-in for gqattn_bench) a run stopped by SIGTERM writing what it
measured. The timing itself is checked by running the script on the GPU
machine."""
import json
import os
import subprocess
import sys
import time
from datetime import datetime

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import side_by_side as sbs  # noqa: E402


def smi_line(t, mhz, watts):
    """One line as nvidia-smi --format=csv,noheader,nounits prints it."""
    return f"{datetime.fromtimestamp(t).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {mhz}, {watts}"


def sampler_with(samples):
    s = sbs.ClockSampler(enabled=False)
    s.samples = samples
    return s


def test_kept_pairs_match_the_masks():
    assert sbs.kept_pairs(4, 4, False, 0) == 16
    assert sbs.kept_pairs(4, 4, True, 0) == 10
    # Tq < Tk, causal: query i sees keys up to i + Tk - Tq.
    assert sbs.kept_pairs(2, 5, True, 0) == 4 + 5
    # The window shape of the standard set (tests/cpu/test_problem.cpp).
    assert sbs.kept_pairs(4096, 4096, True, 1024) == 3670528


def test_parse_keeps_well_formed_lines_only():
    t0 = time.time()
    text = "\n".join([
        "timestamp, clocks.current.sm [MHz], power.draw [W]",  # a header, if one appears
        smi_line(t0, 1980, "118.50"),
        smi_line(t0 + 0.05, 1710, "[N/A]"),
        smi_line(t0 + 0.10, 1650, "650.25"),
        "2026/12/01 01:2",  # cut off by terminate()
    ])
    samples = sbs.ClockSampler.parse(text)
    assert [(mhz, w) for _, mhz, w in samples] == [(1980.0, 118.5), (1650.0, 650.25)]
    assert samples[0][0] == pytest.approx(t0, abs=2e-3)  # ms resolution


def test_mean_averages_the_samples_inside_a_span():
    s = sampler_with([(10.0, 1980.0, 100.0), (10.5, 1700.0, 600.0), (11.0, 1800.0, 500.0)])
    assert s.mean(10.4, 11.0) == pytest.approx((1750.0, 550.0))
    assert s.mean(12.0, 13.0) is None


def test_annotate_adds_clocks_where_samples_fall_in_the_timed_calls():
    s = sampler_with([(10.0, 1980.0, 100.0), (20.0, 1700.0, 650.0)])
    recs = [
        dict(backend="a", fwd_wall_s=[9.5, 10.5], bwd_wall_s=[19.0, 21.0]),
        dict(backend="b", fwd_wall_s=[30.0, 31.0]),  # no samples then, no backward
        dict(backend="c", error="exit 1"),  # a failed run has no spans
    ]
    sbs.annotate_clocks(recs, s)
    assert (recs[0]["fwd_sm_mhz"], recs[0]["fwd_power_w"]) == (1980, 100.0)
    assert (recs[0]["bwd_sm_mhz"], recs[0]["bwd_power_w"]) == (1700, 650.0)
    assert "fwd_sm_mhz" not in recs[1] and "bwd_sm_mhz" not in recs[1]
    assert set(recs[2]) == {"backend", "error"}


def test_annotate_adds_energy_per_flop_as_watts_over_tflops():
    s = sampler_with([(10.0, 1700.0, 690.0)])
    recs = [dict(backend="a", fwd_wall_s=[9.5, 10.5], fwd_tflops=600.0),
            dict(backend="b", fwd_wall_s=[9.5, 10.5], error="exit 1")]  # no TFLOP/s
    sbs.annotate_clocks(recs, s)
    assert recs[0]["fwd_pj_per_flop"] == pytest.approx(1.15)
    assert "fwd_pj_per_flop" not in recs[1] and recs[1]["fwd_power_w"] == 690.0


def test_sustained_repeats_cover_the_seconds_asked_for():
    cfg = (1, 16384, 32, 8, 128, True, 0, 0.0)
    assert sbs.repeats_for(cfg, 30, 0) == 30
    flops = 4.0 * 128 * 32 * sbs.kept_pairs(16384, 16384, True, 0)
    n = sbs.repeats_for(cfg, 30, 3.0)
    call_s = flops / (sbs.SUSTAINED_EST_TFLOPS * 1e12)
    assert n * call_s >= 3.0 > (n - 1) * call_s
    # Never fewer than --repeats, however short the time.
    assert sbs.repeats_for(cfg, 30, 1e-6) == 30


def test_a_disabled_sampler_starts_nothing_and_yields_nothing():
    s = sbs.ClockSampler(enabled=False)
    s.stop()
    assert s.proc is None and s.samples == [] and s.mean(0.0, 1e12) is None


class FakeRun:
    """subprocess.run's stand-in: answers each nvidia-smi query field with
    (returncode, stdout) from `answers`, or raises OSError for None."""

    def __init__(self, answers):
        self.answers = answers
        self.asked = []

    def __call__(self, cmd, **kwargs):
        field = next(a.split("=", 1)[1] for a in cmd if a.startswith("--query-gpu="))
        self.asked.append(field)
        answer = self.answers.get(field)
        if answer is None:
            raise OSError("no nvidia-smi")
        return subprocess.CompletedProcess(cmd, answer[0], stdout=answer[1], stderr="")


def test_power_field_prefers_the_instant_reading_where_the_driver_has_it():
    run = FakeRun({"power.draw.instant": (0, "412.37\n")})
    assert sbs.ClockSampler.pick_power_field(0, run=run) == "power.draw.instant"


def test_power_field_falls_back_where_the_instant_reading_is_unknown_or_na():
    unknown = FakeRun({"power.draw.instant": (2, 'Field "power.draw.instant" is not a valid field\n')})
    not_available = FakeRun({"power.draw.instant": (0, "[N/A]\n")})
    no_smi = FakeRun({})
    for run in (unknown, not_available, no_smi):
        assert sbs.ClockSampler.pick_power_field(0, run=run) == "power.draw"
        assert run.asked == ["power.draw.instant"]


class FakeEvent:
    """torch.cuda.Event for the timing helpers: each stop event's
    elapsed_time is the next entry of `durations`."""
    durations = []

    def __init__(self, enable_timing=False):
        self.enable_timing = enable_timing

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, stop):
        return FakeEvent.durations.pop(0)


def test_call_times_warm_up_then_time_every_call_in_order(monkeypatch):
    import types
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(Event=FakeEvent)
    monkeypatch.setitem(sys.modules, "torch", fake)
    FakeEvent.durations = [3.0, 1.0, 2.0, 5.0]
    seen = []
    times = sbs.call_times_ms(seen.append, ["a", "b"], 4)
    assert times == [3.0, 1.0, 2.0, 5.0]
    # WARMUP untimed calls, then the timed ones, cycling through the sets.
    assert seen == [["a", "b"][i % 2] for i in range(sbs.WARMUP)] + ["a", "b", "a", "b"]
    FakeEvent.durations = [3.0, 1.0, 2.0]
    assert sbs.median_ms(lambda s: None, [None], 3) == 2.0


FAKE_BENCH = """#!/usr/bin/env python3
# A stand-in for gqattn_bench: one JSON line per shape; the shape in
# SLOW_SHAPE's T hangs (a device call running out of time).
import json, sys, time
shape = sys.argv[sys.argv.index("--shape") + 1].split(",")
if shape[1] == "{slow_t}":
    time.sleep(60)
settle = sys.argv[sys.argv.index("--settle-ms") + 1] if "--settle-ms" in sys.argv else None
idle = sys.argv[sys.argv.index("--idle-ms") + 1] if "--idle-ms" in sys.argv else None
spin = (sys.argv[sys.argv.index("--spin-ahead-us") + 1] if "--spin-ahead-us" in sys.argv
        else None)
print(json.dumps(dict(backend="fake", fwd_tflops=100.0 + int(shape[1]) / 1024,
                      bwd_tflops=50.0, settle_arg=settle, idle_arg=idle, spin_arg=spin,
                      back_to_back_arg="--back-to-back" in sys.argv)))
"""


def test_a_run_stopped_by_sigterm_writes_what_it_measured(tmp_path):
    # The three causal d128 cap0 shapes run T1k, T4k, T16k in that order:
    # T1k is measured, T4k hangs and the run is stopped there.
    bench = tmp_path / "fake_bench"
    bench.write_text(FAKE_BENCH.format(slow_t=4096))
    bench.chmod(0o755)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "side_by_side.py")
    proc = subprocess.Popen(
        [sys.executable, script, "--bench", str(bench), "--ours", "cuda-hopper", "--ours-only",
         "--match", "d128 c1 w0 cap0", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the protocol's lines, then the T1k record
    while first.startswith("every timed call"):
        first = proc.stdout.readline()
    assert "T1024" in first and "fwd   101.0" in first
    time.sleep(0.5)  # into the hanging call
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == sbs.EXIT_STOPPED_EARLY, err
    assert "stopped early in round 1, at B4 T4096" in err
    assert "(partial)" in out
    with open(tmp_path / "side_by_side.json") as fh:
        run = json.load(fh)
    assert run["partial"] is True
    assert run["stopped_at"] == {"round": 0, "shape": "B4 T4096 H32/8 d128 c1 w0 cap0"}
    assert [(r["shape"], r["round"], r["fwd_tflops"]) for r in run["results"]] == [
        ("B16 T1024 H32/8 d128 c1 w0 cap0", 0, 101.0)]
    assert [m["shape"] for m in run["medians"]] == ["B16 T1024 H32/8 d128 c1 w0 cap0"]


def test_a_complete_run_is_not_partial(tmp_path):
    bench = tmp_path / "fake_bench"
    bench.write_text(FAKE_BENCH.format(slow_t=-1))
    bench.chmod(0o755)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "side_by_side.py")
    run = subprocess.run(
        [sys.executable, script, "--bench", str(bench), "--ours", "cuda-hopper", "--ours-only",
         "--match", "d128 c1 w0 cap0", "--rounds", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with open(tmp_path / "side_by_side.json") as fh:
        result = json.load(fh)
    assert result["partial"] is False and result["stopped_at"] is None
    assert sorted({(r["round"], r["shape"][:9]) for r in result["results"]}) == [
        (0, "B1 T16384"), (0, "B16 T1024"), (0, "B4 T4096 "),
        (1, "B1 T16384"), (1, "B16 T1024"), (1, "B4 T4096 ")]


def run_ours_only_on_t1k(tmp_path, *flags):
    """side_by_side.py --ours-only on the B16 T1024 shape with the fake bench
    and `flags`: the finished process and the JSON it wrote."""
    bench = tmp_path / "fake_bench"
    bench.write_text(FAKE_BENCH.format(slow_t=-1))
    bench.chmod(0o755)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "side_by_side.py")
    run = subprocess.run(
        [sys.executable, script, "--bench", str(bench), "--ours", "cuda-hopper", "--ours-only",
         "--match", "B16 T1024", *flags, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with open(tmp_path / "side_by_side.json") as fh:
        return run, json.load(fh)


def usage_error(tmp_path, *flags):
    """side_by_side.py --ours-only with `flags` that argparse must refuse:
    its stderr, after asserting exit status 2."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "side_by_side.py")
    run = subprocess.run([sys.executable, script, "--ours-only", *flags, "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    return run.stderr


def test_settle_reaches_gqattn_bench_in_milliseconds_and_the_json(tmp_path):
    for settle, arg in (("0.25", "250"), ("0", None)):
        run, result = run_ours_only_on_t1k(tmp_path, "--settle", settle)
        assert ("of idle GPU (--settle)" in run.stdout) == (arg is not None)
        assert result["settle_s"] == float(settle)
        assert [r["settle_arg"] for r in result["results"]] == [arg]


def test_a_negative_settle_is_a_usage_error(tmp_path):
    assert "--settle must not be negative" in usage_error(tmp_path, "--settle", "-1")


def test_settle_drains_the_gpu_then_sleeps_and_zero_does_nothing(monkeypatch):
    import types
    calls = []
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(synchronize=lambda: calls.append("sync"))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(sbs.time, "sleep", lambda s: calls.append(("sleep", s)))
    sbs.idle_gpu(0.0)
    assert calls == []
    sbs.idle_gpu(0.5)
    assert calls == ["sync", ("sleep", 0.5)]


def test_gpu_identity_pairs_the_fields_with_nvidia_smis_answer():
    import types
    line = "NVIDIA H200, GPU-1234, 165, 580.1, 96.00, 700.00, 34, 1980"

    def fake_run(cmd, **kwargs):
        assert cmd[1] == "--query-gpu=" + ",".join(sbs.GPU_FIELDS)
        return types.SimpleNamespace(returncode=0, stdout=line + "\n")
    got = sbs.gpu_identity(run=fake_run)
    assert got["uuid"] == "GPU-1234" and got["power.limit"] == "700.00"
    assert list(got) == list(sbs.GPU_FIELDS)


def test_gpu_identity_is_empty_when_nvidia_smi_fails_or_is_missing():
    import types

    def missing(cmd, **kwargs):
        raise FileNotFoundError("nvidia-smi")
    assert sbs.gpu_identity(run=missing) == {}
    assert sbs.gpu_identity(run=lambda cmd, **kw: types.SimpleNamespace(
        returncode=9, stdout="")) == {}
    assert sbs.gpu_identity(run=lambda cmd, **kw: types.SimpleNamespace(
        returncode=0, stdout="only, three, fields")) == {}


def test_idle_reaches_gqattn_bench_and_the_json(tmp_path):
    for idle, arg in (("150", "150"), ("0", None)):
        run, result = run_ours_only_on_t1k(tmp_path, "--idle-ms", idle)
        assert ("of idle GPU (--idle-ms)" in run.stdout) == (arg is not None)
        assert result["idle_ms"] == int(idle)
        assert [r["idle_arg"] for r in result["results"]] == [arg]


def test_a_negative_idle_is_a_usage_error(tmp_path):
    assert "--idle-ms must not be negative" in usage_error(tmp_path, "--idle-ms", "-5")


def test_idle_drains_and_sleeps_before_every_timed_call_only(monkeypatch):
    import types
    calls = []

    class LoggingEvent(FakeEvent):
        def record(self):
            calls.append("record")

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(Event=LoggingEvent,
                                      synchronize=lambda: calls.append("sync"))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(sbs.time, "sleep", lambda s: calls.append(("sleep", s)))
    FakeEvent.durations = [1.0, 2.0]
    seen = []
    assert sbs.call_times_ms(seen.append, ["a"], 2, idle_ms=150) == [1.0, 2.0]
    # The warm-up runs without pauses; each timed call's start event comes
    # after a drain and the sleep.
    assert len(seen) == sbs.WARMUP + 2
    pause = ["sync", ("sleep", 0.15), "record", "record"]
    assert calls == pause + pause
    calls.clear()
    FakeEvent.durations = [1.0]
    sbs.call_times_ms(lambda s: None, ["a"], 1)
    assert calls == ["record", "record"]


def test_spin_ahead_reaches_gqattn_bench_and_the_json(tmp_path):
    default = str(sbs.DEFAULT_SPIN_AHEAD_US)
    for flags, arg in (((), default), (("--spin-ahead-us", "500"), "500"),
                       (("--spin-ahead-us", "0"), None)):
        run, result = run_ours_only_on_t1k(tmp_path, *flags)
        assert ("GPU spin (--spin-ahead-us)" in run.stdout) == (arg is not None)
        assert result["spin_ahead_us"] == int(arg or 0)
        assert [r["spin_arg"] for r in result["results"]] == [arg]


def test_passes_queued_slower_than_their_spin_are_named(capsys):
    results = [dict(backend="flex", shape="S", fwd_spin_short=0, bwd_spin_short=3,
                    bwd_enqueue_us=2400.0),
               dict(backend="gqattn:cuda-hopper", shape="S", fwd_spin_short=0,
                    bwd_spin_short=0)]
    sbs.print_spin_short(results)
    out = capsys.readouterr().out
    assert "flex S bwd (3 of the calls, median queueing 2400 us)" in out
    assert "gqattn" not in out and " fwd " not in out
    sbs.print_spin_short(results[1:])
    assert capsys.readouterr().out == ""


def test_a_negative_spin_is_a_usage_error(tmp_path):
    assert "--spin-ahead-us must not be negative" in usage_error(tmp_path, "--spin-ahead-us",
                                                                 "-1")


def test_the_spin_is_queued_before_every_start_event_and_slow_queueing_is_counted(monkeypatch):
    import types
    calls = []

    class LoggingEvent(FakeEvent):
        def record(self):
            calls.append("record")

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(Event=LoggingEvent, _sleep=lambda n: calls.append(n))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(sbs, "_spin_cycles_per_us", None)
    # Calibration: three spins of SPIN_CALIBRATION_CYCLES; the fastest
    # (10 ms: 2000 cycles a microsecond) sets the rate. Then two timed calls.
    FakeEvent.durations = [20.0, 10.0, 40.0, 1.0, 2.0]
    clock = iter([0.0, 0.0005, 1.0, 1.003])  # queued in 500 us, then in 3000 us
    monkeypatch.setattr(sbs.time, "perf_counter", lambda: next(clock))
    queueing = {}
    times = sbs.call_times_ms(lambda s: None, ["a"], 2, spin_ahead_us=2000, queueing=queueing)
    assert times == [1.0, 2.0]
    calibration = ["record", sbs.SPIN_CALIBRATION_CYCLES, "record"] * 3
    timed = [2000 * 2000, "record", "record"]
    assert calls == calibration + timed + timed
    assert queueing == {"enqueue_us": 3000.0, "spin_short": 1}
    # Without a spin: no kernel queued, no spin_short.
    calls.clear()
    FakeEvent.durations = [1.0]
    clock = iter([0.0, 0.00002])
    queueing = {}
    sbs.call_times_ms(lambda s: None, ["a"], 1, queueing=queueing)
    assert calls == ["record", "record"] and queueing == {"enqueue_us": 20.0}


def test_back_to_back_reaches_gqattn_bench_and_the_json_and_excludes_idle(tmp_path):
    for flags, on in (((), False), (("--back-to-back",), True)):
        run, result = run_ours_only_on_t1k(tmp_path, *flags)
        assert ("queued at once (--back-to-back)" in run.stdout) == on
        assert result["back_to_back"] == on
        assert [r["back_to_back_arg"] for r in result["results"]] == [on]
    assert "it excludes --idle-ms" in usage_error(tmp_path, "--back-to-back", "--idle-ms", "150")


def test_back_to_back_queues_every_call_before_waiting_and_counts_late_ones(monkeypatch):
    import types
    calls = []

    class LoggingEvent(FakeEvent):
        def record(self):
            calls.append("record")

        def synchronize(self):
            calls.append("sync")

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(Event=LoggingEvent, _sleep=lambda n: calls.append("spin"))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(sbs, "_spin_cycles_per_us", 1000.0)
    # Three calls of 1 ms each behind a 2000 us spin: the GPU is ready for
    # them at 2000, 3000 and 4000 us. The host queues them by 500, 3500
    # (late) and 3900 us.
    FakeEvent.durations = [1.0, 1.0, 1.0]
    clock = iter([0.0, 0.0005, 0.0035, 0.0039])
    monkeypatch.setattr(sbs.time, "perf_counter", lambda: next(clock))
    seen, queueing = [], {}
    times = sbs.call_times_ms(lambda s: seen.append("call") or calls.append("call"), ["a"], 3,
                              spin_ahead_us=2000, queueing=queueing, back_to_back=True)
    assert times == [1.0, 1.0, 1.0]
    # The warm-up, then the spin and every call with its mark before one wait.
    assert calls == ["call"] * sbs.WARMUP + ["spin", "record"] + ["call", "record"] * 3 + ["sync"]
    assert queueing == {"enqueue_us": 500.0, "spin_short": 1}  # gaps 500, 3000, 400
