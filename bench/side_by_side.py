"""Side-by-side attention benchmark on one GPU, in one run (docs/performance.md).

Times PyTorch SDPA (flash = FlashAttention-2, cuDNN) and FlexAttention on the
standard shapes, runs gqattn's C++ bench (gqattn_bench) on the same shapes in
the same run, and prints one table: shape, fwd/bwd TFLOP/s of each, and the
ratio of gqattn to the strongest of the others. Writes everything as JSON to
$OUT/side_by_side.json (or --out DIR).

Method (the same in both halves): bf16 inputs drawn from N(0.5, 1), several
copies rotated between calls so that together they exceed the L2 cache,
warm-up calls, every call timed alone between two CUDA events, median.
FLOPs: forward 4 * d * H * B * (kept (i, j) pairs, counted exactly from the
mask), backward 2.5x forward. SDPA has no window or softcap: those shapes
are compared with FlexAttention only. Checked by running it on the GPU
machine (its host-side logic also by bench/tests/test_side_by_side.py);
torch backends are spot-checked against an f32 reference so a
fast-but-wrong result is not reported.

usage: python bench/side_by_side.py [--bench PATH] [--out DIR] [--repeats N]
                                    [--sustained SECONDS] [--settle SECONDS] [--idle-ms N]
                                    [--spin-ahead-us N] [--back-to-back] [--rounds N]
                                    [--shapes all|core] [--match TEXT]
                                    [--ours-only | --torch-only] [--ours BACKEND[:nondet],...]

--rounds N repeats the whole measurement (ours on every shape, then the
PyTorch side) N times in the run. The table then gives each backend's median
TFLOP/s over the rounds and the ratio's median with its range over the
rounds: the same build moves by up to 13% between runs on the H200
(docs/performance.md), as much as the 1.10x criteria, so one round cannot
decide them. The JSON keeps every round's records ("results", each with
its "round") and the medians ("medians"); bench/plot.py draws the rounds'
medians with their spread.

Stopped early (SIGTERM, as `timeout` sends, or Ctrl-C), it still prints
the tables and writes the JSON over what it measured so far, with
"partial": true and the shape it stopped on ("stopped_at"), then exits
with status 3: a sustained run that outgrows its device call keeps its
rows (2026-12-03, docs/performance.md). A second signal stops it at once.

--settle SECONDS lets the GPU idle that long (drained, then asleep on the
host) before each backend's forward and each backend's backward pass,
ours (gqattn_bench --settle-ms) and PyTorch's alike, so that every pass
starts from the same state of the power limiter. Without it a burst's
speed depends on what ran just before: our T16k forward read 609 to 695
TFLOP/s over five rounds of one build (2026-12-04, H200). At 0.5 s it
narrowed both sides' spread in one run and not in the next, so it is off
by default. The JSON records it ("settle_s").

--idle-ms N lets the GPU idle N ms before every timed call (the previous
call has been waited for; then the host sleeps), ours (gqattn_bench
--idle-ms) and PyTorch's alike: each call then runs from a rested power
limiter, so no burst steps down in the middle of its calls. Back to back,
a long kernel that draws more power than its competitor runs 5-6% faster
for its first calls than after the limiter reacts, somewhere in the 30
(the cap30 backward read 447-456 or 463-473 TFLOP/s by where that step
fell, 459-461 with 150 ms pauses: 2026-12-04, H200,
docs/performance.md), so the median of a burst is either level by chance.
Paused calls measure each kernel at its rested clock, a reproducible
basis; --sustained measures the opposite regime. The run takes N ms more
per timed call (at 150 ms and the default 30 repeats, 1800 timed calls a
round of the standard shapes, 4.5 minutes more; --repeats 10 makes that
1.5). Off by default; the JSON records it ("idle_ms"). Paused calls need
--spin-ahead-us: without it each call's time holds the host's launch
latency after the pause, which is PyTorch's more than ours (next).

--spin-ahead-us N queues a GPU spin of N microseconds in front of every
timed call, ours (gqattn_bench --spin-ahead-us, bench/spin_ahead.hpp) and
PyTorch's (torch.cuda._sleep) alike, so that the host has queued the call
and its stop event before the start event fires: the events then time the
GPU alone. Every timed call follows a synchronisation, so without the spin
the start event fires at once and the host's time to launch the call
counts: in bursts PyTorch takes 100-500 us to queue a forward call and
300-1300 us a backward, gqattn 10-30 and 25-70; after an idle pause
PyTorch's grow to 0.5-1.3 and 0.9-1.6 ms (2026-12-04, H200). That is
10-15% of a T4k forward, and every in-run ratio measured without the spin
holds it in our favour (docs/performance.md, "The spin ahead of every
call").
Every record gives the median host time to queue a call ("fwd_enqueue_us",
"bwd_enqueue_us") and, with a spin, how many calls were queued slower than
the spin lasted ("fwd_spin_short", "bwd_spin_short": those include host
time; the run names them at its end). On by default at 2000 us, which
covers PyTorch's slowest backward seen (0 for the earlier method, before
974fb9d); the JSON records it ("spin_ahead_us").

--back-to-back queues each pass's timed calls at once after the spin, an
event between each two and no synchronisation (gqattn_bench
--back-to-back; as triton's do_bench, which measured the anchors, but
without its cache flush): the GPU runs the calls without a gap, as in
training, and a call's time is the GPU's as long as the host stays ahead.
"*_spin_short" then counts the calls the host may have queued only after
the GPU was ready for them. Not with --idle-ms; the JSON records it
("back_to_back").

The JSON also records which GPU it ran on and its state at the start
("gpu": nvidia-smi's name, uuid, serial, driver, VBIOS, power limit,
temperature, maximum SM clock; {} without nvidia-smi): two device calls
may land on different H200s.

--match keeps the shapes whose label (as printed, e.g. "cap30" or "d256")
contains TEXT, for a short run of the shapes a change touched; the tables
of docs/performance.md are full runs.

While it runs, nvidia-smi samples the GPU's SM clock and power draw every
50 ms (where nvidia-smi exists; nothing else changes if it does not). Each
record gets the mean over the samples inside its timed calls (fwd_sm_mhz,
fwd_power_w, bwd_sm_mhz, bwd_power_w), and two more tables print each
backend's SM clock and power during its forward and its backward calls:
under the H200's power cap a long backward runs at lower clocks back to back than after a pause (2026-12-01,
docs/performance.md), and this shows by how much, per backend, in the same
run. The power is nvidia-smi's power.draw.instant where the driver has
it, else power.draw (averaged over about a second: a rough figure). GPU 0
as nvidia-smi numbers them; not under --torch-only.

Energy per FLOP: each record with a clock sample also gets fwd/bwd_pj_per_flop,
the mean power over its timed calls divided by its TFLOP/s (W per TFLOP/s is
pJ per FLOP), and the clock tables print it. Under the H200's 700 W cap
two backends that both run at the cap are as fast as their energy per FLOP
allows, whatever their speed at full clock. A rough figure: the samples
are instantaneous readings 50 ms apart (cuDNN's T16k forward read 1.17 and
0.91 pJ in two runs at the same TFLOP/s); the TFLOP/s at the cap are the
firm comparison. gqattn's records also carry gqattn_bench's
fwd/bwd_nvml_pj_per_flop, from NVML's energy counter where it answers
(bench/nvml_energy.hpp): ours only, so not in the tables.

--sustained SECONDS raises every shape's repeats so that each backend's
timed forward calls last about SECONDS back to back (estimated at
SUSTAINED_EST_TFLOPS; the backward's 2.5x longer), long enough for the
power cap to settle: the regime of training, which the default 30 calls
(a few milliseconds to 0.3 s, partly before the cap reacts) do not reach
on every shape. 2026-12-01 (H200, docs/performance.md): the
T16k forward reads 589-673 TFLOP/s in 30-call bursts and 604 sustained.

--ours lists the gqattn backends to time (default cuda-flash); an entry
BACKEND:nondet runs gqattn_bench --nondeterministic (Options::deterministic
= false: cuda-flash's backward adds dQ with atomics) and is labelled
gqattn:BACKEND:nondet. The ours/best ratios use the deterministic entries
(gqattn's default) when there are any.
"""
import argparse
import glob
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

ROTATE_BYTES = 256 << 20
MAX_SETS = 16
INPUT_MEAN = 0.5
WARMUP = 5
BWD_FACTOR = 2.5
SUSTAINED_EST_TFLOPS = 500.0  # --sustained's guess of a forward's speed, for its repeats
REF_ROWS = 64          # query rows of the f32 spot check
REF_MAX_REL_ERR = 2e-2  # a backend above this is reported as wrong, not timed

# (B, T, H, Hkv, d, causal, window, softcap): docs/performance.md's shapes.
STANDARD = [
    (16, 1024, 32, 8, 128, True, 0, 0.0),
    (4, 4096, 32, 8, 128, True, 0, 0.0),
    (1, 16384, 32, 8, 128, True, 0, 0.0),
    (4, 4096, 32, 8, 128, False, 0, 0.0),
    (4, 4096, 32, 8, 64, True, 0, 0.0),
    (4, 4096, 16, 8, 256, True, 0, 0.0),
    (2, 8192, 16, 8, 256, True, 4096, 50.0),
    (4, 4096, 32, 8, 128, True, 1024, 0.0),
    (4, 4096, 32, 8, 128, True, 0, 30.0),
]


# Which GPU a run measured and in what state it started: fresh device
# calls may land on different H200s, whose levels differ by a few percent
# on both sides (2026-12-04, H200).
GPU_FIELDS = ("name", "uuid", "serial", "driver_version", "vbios_version", "power.limit",
              "temperature.gpu", "clocks.max.sm")


def gpu_identity(gpu=0, run=subprocess.run):
    """nvidia-smi's GPU_FIELDS for GPU `gpu` as a dict (values as strings,
    [N/A] kept as printed); {} without nvidia-smi or if it fails."""
    try:
        got = run(["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}",
                   "--format=csv,noheader,nounits", "-i", str(gpu)],
                  capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    parts = [p.strip() for p in got.stdout.strip().split(",")]
    if got.returncode != 0 or len(parts) != len(GPU_FIELDS):
        return {}
    return dict(zip(GPU_FIELDS, parts))


class ClockSampler:
    """nvidia-smi in the background, one line per period: the SM clock (MHz)
    and the power draw (W) of the GPU. mean(start, end) averages the samples
    taken in a wall-clock span (time.time() seconds; nvidia-smi's local
    timestamps are converted the same way). Never raises: without
    nvidia-smi, or if it fails, there are no samples and mean() is None."""

    # power.draw averages over about a second on recent drivers (2026-12-01,
    # H200: 125-650 W for calls that all keep the tensor cores busy);
    # power.draw.instant, where the driver has it, is one reading.
    POWER_FIELDS = ("power.draw.instant", "power.draw")

    def __init__(self, period_ms=50, gpu=0, enabled=True):
        self.samples = []  # (epoch seconds, sm MHz, watts)
        self.proc = None
        self.power_field = None
        self.log = tempfile.TemporaryFile(mode="w+")
        if not enabled:
            return
        self.power_field = self.pick_power_field(gpu)
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu=timestamp,clocks.sm,{self.power_field}",
                 "--format=csv,noheader,nounits", "-lms", str(period_ms), "-i", str(gpu)],
                stdout=self.log, stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    @classmethod
    def pick_power_field(cls, gpu, run=subprocess.run):
        """The first of POWER_FIELDS that nvidia-smi answers with a number
        (an unknown field is an error; an unsupported one reads [N/A])."""
        for field in cls.POWER_FIELDS[:-1]:
            try:
                got = run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits",
                           "-i", str(gpu)], capture_output=True, text=True, timeout=10)
                float(got.stdout.strip())
                if got.returncode == 0:
                    return field
            except (OSError, ValueError, subprocess.TimeoutExpired):
                continue
        return cls.POWER_FIELDS[-1]

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.seek(0)
        self.samples = self.parse(self.log.read())

    @staticmethod
    def parse(text):
        out = []
        for line in text.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 3:
                continue
            try:
                t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((t, float(parts[1]), float(parts[2])))
            except ValueError:
                continue  # a header, "[N/A]", a cut-off last line
        return out

    def mean(self, start, end):
        inside = [(mhz, w) for t, mhz, w in self.samples if start <= t <= end]
        if not inside:
            return None
        return (statistics.fmean(m for m, _ in inside), statistics.fmean(w for _, w in inside))


def annotate_clocks(results, sampler):
    """Adds fwd/bwd_sm_mhz and fwd/bwd_power_w to every record whose timed
    calls' span (fwd_wall_s / bwd_wall_s) holds samples, and where it has
    the TFLOP/s, fwd/bwd_pj_per_flop (W / TFLOP/s)."""
    for rec in results:
        for short in ("fwd", "bwd"):
            span = rec.get(f"{short}_wall_s")
            got = sampler.mean(*span) if span else None
            if got:
                rec[f"{short}_sm_mhz"], rec[f"{short}_power_w"] = round(got[0]), round(got[1], 1)
                if rec.get(f"{short}_tflops"):
                    rec[f"{short}_pj_per_flop"] = round(got[1] / rec[f"{short}_tflops"], 4)


def repeats_for(cfg, repeats, sustained_s):
    """Timed calls per backend on cfg: `repeats`, or under --sustained enough
    forward calls for about sustained_s seconds at SUSTAINED_EST_TFLOPS."""
    if sustained_s <= 0:
        return repeats
    B, T, H, Hkv, d, causal, window, softcap = cfg
    call_s = 4.0 * d * H * B * kept_pairs(T, T, causal, window) / (SUSTAINED_EST_TFLOPS * 1e12)
    return max(repeats, math.ceil(sustained_s / call_s))


def kept_pairs(Tq, Tk, causal, window):
    off = Tk - Tq
    total = 0
    for i in range(Tq):
        hi = min(Tk - 1, i + off) if causal else Tk - 1
        lo = max(0, i + off - window + 1) if window else 0
        total += max(0, hi - lo + 1)
    return total


def shape_key(cfg):
    B, T, H, Hkv, d, causal, window, softcap = cfg
    return f"B{B} T{T} H{H}/{Hkv} d{d} c{int(causal)} w{window} cap{softcap:g}"


def find_bench(path):
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    hits = sorted(glob.glob(os.path.join(here, "..", "build", "*", "bench", "gqattn_bench")),
                  key=os.path.getmtime)
    return hits[-1] if hits else None


NONDET = "nondet"  # the --ours suffix for Options::deterministic = false


def parse_ours(entry):
    """'cuda-flash' -> ('cuda-flash', True); 'cuda-flash:nondet' -> ('cuda-flash', False)."""
    backend, _, flag = entry.strip().partition(":")
    if flag not in ("", NONDET):
        raise SystemExit(f"--ours entry {entry!r}: the only suffix is :{NONDET}")
    return backend, flag == ""


def run_ours(bench, cfg, repeats, backend, deterministic=True, settle_s=0.0, idle_ms=0,
             spin_ahead_us=0, back_to_back=False):
    B, T, H, Hkv, d, causal, window, softcap = cfg
    shape = f"{B},{T},{T},{H},{Hkv},{d},{int(causal)},{window},{softcap}"
    cmd = [bench, "--shape", shape, "--repeats", str(repeats), "--warmup", str(WARMUP),
           "--backend", backend]
    if not deterministic:
        cmd.append("--nondeterministic")
    if settle_s > 0:
        cmd += ["--settle-ms", str(round(settle_s * 1000))]
    if idle_ms > 0:
        cmd += ["--idle-ms", str(idle_ms)]
    if spin_ahead_us > 0:
        cmd += ["--spin-ahead-us", str(spin_ahead_us)]
    if back_to_back:
        cmd.append("--back-to-back")
    return bench_record(cmd)


def bench_record(cmd):
    """Runs gqattn_bench's command `cmd` and returns its last JSON line, or
    {"error": ...} (a failed shape is reported, the run goes on)."""
    try:
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            return {"error": f"exit {run.returncode}: {run.stderr.strip()[-200:]}"}
        return json.loads(run.stdout.strip().splitlines()[-1])
    except Exception as e:  # report, keep going
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def call_times_ms(fn, sets, repeats, idle_ms=0, spin_ahead_us=0, queueing=None,
                  back_to_back=False):
    """WARMUP untimed calls of fn, then `repeats` calls each alone between
    two CUDA events (fn(sets[i % len(sets)])): their times in ms, in call
    order. idle_ms (--idle-ms): before each timed call the GPU is drained
    and the host sleeps that long. spin_ahead_us (--spin-ahead-us): a GPU
    spin that long is queued in front of each timed call. queueing, a dict
    if given, gets "enqueue_us" (the median host time from before the start
    event to after the stop event was queued) and, with a spin,
    "spin_short" (the calls queued slower than the spin lasted).
    back_to_back (--back-to-back): all timed calls queued at once after the
    spin, an event between each two, as gqattn_bench --back-to-back does;
    "enqueue_us" is then the median host time between two calls queued and
    "spin_short" counts the calls the host may have queued only after the
    GPU was ready for them."""
    import torch
    for i in range(WARMUP):
        fn(sets[i % len(sets)])
    if back_to_back:
        return back_to_back_ms(fn, sets, repeats, spin_ahead_us, queueing)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times, queue_us = [], []
    for i in range(repeats):
        idle_gpu(idle_ms / 1000)  # the warm-up drained too, before the first
        spin_ahead(spin_ahead_us)
        queue_start = time.perf_counter()
        start.record()
        fn(sets[i % len(sets)])
        stop.record()
        queue_us.append((time.perf_counter() - queue_start) * 1e6)
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    if queueing is not None:
        queueing["enqueue_us"] = round(sorted(queue_us)[len(queue_us) // 2], 1)
        if spin_ahead_us > 0:
            queueing["spin_short"] = sum(us >= spin_ahead_us for us in queue_us)
    return times


def back_to_back_ms(fn, sets, repeats, spin_ahead_us, queueing):
    """call_times_ms's back_to_back timing, after the warm-up. The GPU can
    start call i once the spin and calls 0..i-1 are done; if the host had
    not queued call i by then, the GPU may have waited for it inside the
    call's window, and the call counts as short."""
    import torch
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
    spin_ahead(spin_ahead_us)
    queue_start = time.perf_counter()
    marks[0].record()
    queued_at_us = []
    for i in range(repeats):
        fn(sets[i % len(sets)])
        marks[i + 1].record()
        queued_at_us.append((time.perf_counter() - queue_start) * 1e6)
    marks[-1].synchronize()
    times = [marks[i].elapsed_time(marks[i + 1]) for i in range(repeats)]
    if queueing is not None:
        gaps = [b - a for a, b in zip([0.0] + queued_at_us, queued_at_us)]
        queueing["enqueue_us"] = round(sorted(gaps)[len(gaps) // 2], 1)
        gpu_ready_us = [spin_ahead_us + 1e3 * sum(times[:i]) for i in range(repeats)]
        queueing["spin_short"] = sum(q > r for q, r in zip(queued_at_us, gpu_ready_us))
    return times


# Longer than PyTorch takes to queue one backward call (at most about 1.6 ms
# after 150 ms pauses, 0.3-1.3 ms back to back: 2026-12-04, H200).
DEFAULT_SPIN_AHEAD_US = 2000

# torch.cuda._sleep counts SM clock cycles; SPIN_CALIBRATION_CYCLES of them
# (about 10 ms at the H200's 1980 MHz) measure how many make a microsecond.
SPIN_CALIBRATION_CYCLES = 20_000_000
_spin_cycles_per_us = None


def spin_ahead(us):
    """Queues a GPU spin of about `us` microseconds (torch.cuda._sleep, a
    one-thread kernel: the GPU stays as rested as idle) in front of the
    next timed call, as gqattn_bench --spin-ahead-us does (its
    bench/spin_ahead.hpp says why: the host's launch time, which grows
    after an idle pause, stays out of the events' window). Nothing for 0.
    The cycles per microsecond are measured once, the highest of three
    tries, so that a slower clock only lengthens the spin."""
    global _spin_cycles_per_us
    if us <= 0:
        return
    import torch
    if _spin_cycles_per_us is None:
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        rates = []
        for _ in range(3):
            a.record()
            torch.cuda._sleep(SPIN_CALIBRATION_CYCLES)
            b.record()
            b.synchronize()
            rates.append(SPIN_CALIBRATION_CYCLES / (a.elapsed_time(b) * 1000))
        _spin_cycles_per_us = max(rates)
    torch.cuda._sleep(int(us * _spin_cycles_per_us))


def idle_gpu(seconds):
    """The GPU idles `seconds`, its queue drained first (--settle before a
    pass's warm-up, --idle-ms before each timed call); nothing for 0."""
    if seconds <= 0:
        return
    import torch
    torch.cuda.synchronize()
    time.sleep(seconds)


def median_ms(fn, sets, repeats, idle_ms=0, spin_ahead_us=0, queueing=None, back_to_back=False):
    times = sorted(call_times_ms(fn, sets, repeats, idle_ms, spin_ahead_us, queueing,
                                 back_to_back))
    return times[len(times) // 2]


def sdpa(backend, causal):
    """SDPA restricted to `backend` on [B, T, H, d] tensors (passed as
    [B, H, T, d] views, GQA by enable_gqa)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def f(q, k, v):
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                               enable_gqa=kt.shape[1] != qt.shape[1])
        return o.transpose(1, 2)
    return f


_flex_compiled = {}


def flex(T, causal, window, softcap, dev="cuda"):
    """FlexAttention (torch.compile, compiled once per process) on [B, T, H,
    d] tensors, with the mask as a block mask and softcap as a score_mod."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if "fa" not in _flex_compiled:
        _flex_compiled["fa"] = torch.compile(flex_attention, dynamic=False)
    fa = _flex_compiled["fa"]

    def mask_mod(b, h, qi, kj):
        m = qi >= kj
        if window:
            m = m & (qi - kj < window)
        return m
    block_mask = create_block_mask(mask_mod, None, None, T, T, device=dev) if causal else None
    score_mod = None
    if softcap:
        def score_mod(s, b, h, qi, kj):
            return softcap * torch.tanh(s / softcap)

    def f(q, k, v):
        o = fa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod,
               block_mask=block_mask, enable_gqa=k.shape[2] != q.shape[2])
        return o.transpose(1, 2)
    return f


def torch_side(cfgs, repeats_of, results, progress=None, settle_s=0.0, idle_ms=0,
               spin_ahead_us=0, back_to_back=False):
    """PyTorch's backends on every shape; repeats_of(cfg): the timed calls.
    progress (a dict), if given, gets the label of the shape being timed
    ("shape"), for the message of a run stopped early. settle_s: the idle
    time before each pass (--settle); idle_ms: before each timed call
    (--idle-ms); spin_ahead_us: the GPU spin in front of each timed call
    (--spin-ahead-us); back_to_back: the timed calls queued at once
    (--back-to-back)."""
    import torch
    from torch.nn.attention import SDPBackend

    dev = "cuda"
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 256
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)

    def ref_error(f, q, k, v, causal, window, softcap):
        B, T, H, d = q.shape
        with torch.no_grad():
            o = f(q, k, v).float()
            rows = torch.arange(0, T, max(1, T // REF_ROWS), device=dev)
            rep = H // k.shape[2]
            qs = q[:1, rows].float()
            ks = k[:1].float().repeat_interleave(rep, dim=2)
            vs = v[:1].float().repeat_interleave(rep, dim=2)
            s = torch.einsum("bihd,bjhd->bhij", qs, ks) / math.sqrt(d)
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            j = torch.arange(T, device=dev)
            keep = torch.ones(len(rows), T, dtype=torch.bool, device=dev)
            if causal:
                keep &= j[None, :] <= rows[:, None]
            if window:
                keep &= rows[:, None] - j[None, :] < window
            p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
            ref = torch.einsum("bhij,bjhd->bihd", p, vs)
            return ((o[:1, rows] - ref).norm() / ref.norm()).item()

    for cfg in cfgs:
        if progress is not None:
            progress["shape"] = shape_key(cfg)
        B, T, H, Hkv, d, causal, window, softcap = cfg
        fl = 4.0 * d * H * B * kept_pairs(T, T, causal, window)
        candidates = []
        if window == 0 and softcap == 0:
            candidates += [("sdpa-flash", sdpa(SDPBackend.FLASH_ATTENTION, causal)),
                           ("sdpa-cudnn", sdpa(SDPBackend.CUDNN_ATTENTION, causal))]
        candidates.append(("flex", None))
        set_bytes = 2 * (4 * B * T * H * d + 4 * B * T * Hkv * d)
        nsets = max(1, min(MAX_SETS, -(-ROTATE_BYTES // set_bytes)))
        for name, f in candidates:
            rec = dict(backend=name, shape=shape_key(cfg), B=B, T=T, H=H, Hkv=Hkv, d=d,
                       causal=causal, window=window, softcap=softcap, settle_s=settle_s,
                       idle_ms=idle_ms, spin_ahead_us=spin_ahead_us,
                       back_to_back=back_to_back)
            try:
                if f is None:
                    f = flex(T, causal, window, softcap)
                sets = []
                for _ in range(nsets):
                    def t(heads):
                        x = torch.randn(B, T, heads, d, device=dev, dtype=torch.bfloat16)
                        return (x + INPUT_MEAN).requires_grad_(True)
                    q, k, v = t(H), t(Hkv), t(Hkv)
                    do = torch.randn(B, T, H, d, device=dev, dtype=torch.bfloat16) + INPUT_MEAN
                    sets.append([q, k, v, do, None])
                err = ref_error(f, *sets[0][:3], causal, window, softcap)
                rec["rel_err"] = err
                if not err < REF_MAX_REL_ERR:
                    raise RuntimeError(f"wrong result: relative error {err:.2e}")
                idle_gpu(settle_s)
                wall = time.time()
                queueing = {}
                fwd_ms = median_ms(lambda s: f(s[0], s[1], s[2]), sets, repeats_of(cfg), idle_ms,
                                   spin_ahead_us, queueing, back_to_back)
                rec.update({"fwd_" + k: v for k, v in queueing.items()})
                rec["fwd_wall_s"] = [wall, time.time()]
                rec["fwd_ms"], rec["fwd_tflops"] = fwd_ms, fl / fwd_ms / 1e9
                for s in sets:
                    s[4] = f(s[0], s[1], s[2])

                def bwd(s):
                    s[0].grad = s[1].grad = s[2].grad = None
                    s[4].backward(s[3], retain_graph=True)
                idle_gpu(settle_s)
                wall = time.time()
                queueing = {}
                bwd_ms = median_ms(bwd, sets, repeats_of(cfg), idle_ms, spin_ahead_us, queueing,
                                   back_to_back)
                rec.update({"bwd_" + k: v for k, v in queueing.items()})
                rec["bwd_wall_s"] = [wall, time.time()]
                rec["bwd_ms"], rec["bwd_tflops"] = bwd_ms, BWD_FACTOR * fl / bwd_ms / 1e9
                del sets
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {e}"[:200]
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            results.append(rec)
            print(f"  {name:12s} {rec['shape']:40s} fwd {rec.get('fwd_tflops', float('nan')):7.1f} "
                  f"bwd {rec.get('bwd_tflops', float('nan')):7.1f} {rec.get('error', '')}",
                  flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="path of gqattn_bench (default: newest build/*/bench/)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                    help="time each backend's calls back to back for about this long "
                         "(the power-capped regime); 0: --repeats calls")
    ap.add_argument("--settle", type=float, default=0.0, metavar="SECONDS",
                    help="idle the GPU this long before every backend's forward and "
                         "backward pass, so each starts from the same power state")
    ap.add_argument("--idle-ms", type=int, default=0, metavar="N",
                    help="idle the GPU N ms before every timed call, so no burst steps down "
                         "in the middle (the power limiter rests between calls)")
    ap.add_argument("--spin-ahead-us", type=int, default=DEFAULT_SPIN_AHEAD_US, metavar="N",
                    help="queue a GPU spin of N us in front of every timed call, so the "
                         "host's launch time stays out of the measured time (0: none; "
                         f"default {DEFAULT_SPIN_AHEAD_US})")
    ap.add_argument("--back-to-back", action="store_true",
                    help="queue each pass's timed calls at once (no synchronisation "
                         "between them, as in training); not with --idle-ms")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure everything this many times; report medians and ranges")
    ap.add_argument("--shapes", choices=["all", "core"], default="all")
    ap.add_argument("--match", default="",
                    help="only the shapes whose label contains this text, e.g. cap30")
    ap.add_argument("--ours-only", action="store_true")
    ap.add_argument("--torch-only", action="store_true",
                    help="only PyTorch's backends (e.g. under a profiler: "
                         "scripts/h200-cycle profile's torch entries)")
    ap.add_argument("--ours", default="cuda-flash",
                    help="comma-separated gqattn backends to time, e.g. cuda-flash,cuda-hopper; "
                         f"BACKEND:{NONDET} times it with Options::deterministic = false")
    args = ap.parse_args()
    cfgs = STANDARD if args.shapes == "all" else STANDARD[:6]
    cfgs = [c for c in cfgs if args.match in shape_key(c)]
    if not cfgs:
        ap.error(f"--match {args.match!r}: no standard shape's label contains it")

    if args.sustained < 0:
        ap.error("--sustained must not be negative")
    if args.settle < 0:
        ap.error("--settle must not be negative")
    if args.idle_ms < 0:
        ap.error("--idle-ms must not be negative")
    if args.spin_ahead_us < 0:
        ap.error("--spin-ahead-us must not be negative")
    if args.back_to_back and args.idle_ms > 0:
        ap.error("--back-to-back queues the timed calls without a pause; it excludes --idle-ms")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.ours_only and args.torch_only:
        ap.error("--ours-only and --torch-only exclude each other")

    ours_entries = [parse_ours(e) for e in args.ours.split(",") if e.strip()]
    results = []
    # Not under --torch-only, which scripts/h200-cycle profile runs under
    # Nsight Compute: nothing else should touch the GPU there.
    sampler = ClockSampler(enabled=not args.torch_only)
    gpu = {} if args.torch_only else gpu_identity()
    if gpu:
        print(f"GPU {gpu.get('name')} {gpu.get('uuid')} driver {gpu.get('driver_version')}, "
              f"{gpu.get('temperature.gpu')} C at the start", flush=True)
    bench = None if args.torch_only else find_bench(args.bench)
    if bench is None and not args.torch_only:
        print("gqattn_bench not found (build it, or pass --bench)", file=sys.stderr)
    if args.settle > 0:
        print(f"every pass after {args.settle:g} s of idle GPU (--settle)", flush=True)
    if args.idle_ms > 0:
        print(f"every timed call after {args.idle_ms} ms of idle GPU (--idle-ms)", flush=True)
    if args.spin_ahead_us > 0:
        print(f"every timed call queued behind a {args.spin_ahead_us} us GPU spin "
              f"(--spin-ahead-us)", flush=True)
    if args.back_to_back:
        print("every pass's timed calls queued at once (--back-to-back)", flush=True)
    progress = dict(round=0, shape=None)
    stopped = False
    previous_term = signal.signal(signal.SIGTERM, stop_early)
    try:
        for round_index in range(args.rounds):
            progress["round"] = round_index
            if args.rounds > 1:
                print(f"round {round_index + 1} of {args.rounds}", flush=True)
            if bench is not None:
                for cfg in cfgs:
                    progress["shape"] = shape_key(cfg)
                    for backend, deterministic in ours_entries:
                        rec = run_ours(bench, cfg, repeats_for(cfg, args.repeats, args.sustained),
                                       backend, deterministic, args.settle, args.idle_ms,
                                       args.spin_ahead_us, args.back_to_back)
                        rec["backend"] = ("gqattn:" + rec.get("backend", backend) +
                                          ("" if deterministic else ":" + NONDET))
                        rec["deterministic"] = deterministic
                        rec["shape"] = shape_key(cfg)
                        rec["round"] = round_index
                        results.append(rec)
                        print(f"  {rec['backend']:12s} {rec['shape']:40s} "
                              f"fwd {rec.get('fwd_tflops', float('nan')):7.1f} "
                              f"bwd {rec.get('bwd_tflops', float('nan')):7.1f} "
                              f"{rec.get('error', '')}", flush=True)
            if not args.ours_only:
                first = len(results)
                torch_side(cfgs, lambda c: repeats_for(c, args.repeats, args.sustained), results,
                           progress, args.settle, args.idle_ms, args.spin_ahead_us,
                           args.back_to_back)
                for rec in results[first:]:
                    rec["round"] = round_index
    except (StoppedEarly, KeyboardInterrupt):
        stopped = True
        print(f"\nstopped early in round {progress['round'] + 1}, at {progress['shape']}: "
              f"the tables and the JSON hold what was measured", file=sys.stderr, flush=True)
    finally:
        # A second signal while the summary is written ends the run as usual.
        signal.signal(signal.SIGTERM, previous_term)
        # torch_side's records of the round it stopped in have no round yet.
        for rec in results:
            rec.setdefault("round", progress["round"])
    sampler.stop()
    annotate_clocks(results, sampler)
    medians, table = summarise(cfgs, results, args.rounds)
    print_clocks(cfgs, results, sampler.power_field)
    print_spin_short(results)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "side_by_side.json")
    with open(path, "w") as fh:
        json.dump(dict(results=results, medians=medians, table=table,
                       power_field=sampler.power_field, sustained_s=args.sustained,
                       settle_s=args.settle, idle_ms=args.idle_ms,
                       spin_ahead_us=args.spin_ahead_us, back_to_back=args.back_to_back,
                       gpu=gpu,
                       partial=stopped,
                       stopped_at=(dict(round=progress["round"], shape=progress["shape"])
                                   if stopped else None)), fh,
                  indent=1)
    print(f"\nwrote {path}" + (" (partial)" if stopped else ""))
    if stopped:
        sys.exit(EXIT_STOPPED_EARLY)


# Exit status of a run stopped early that still wrote its partial JSON
# (neither 0, a complete run, nor 1 / 2, a failure or a usage error).
EXIT_STOPPED_EARLY = 3


class StoppedEarly(BaseException):
    """Raised from the SIGTERM handler: the measurement loop stops and
    what was measured is still summarised and written. A BaseException,
    as KeyboardInterrupt is, so that run_ours's and torch_side's
    `except Exception` (a failed backend is reported, the run goes on) do
    not take it for a failed measurement."""


def stop_early(signum, frame):
    raise StoppedEarly()


METRICS = ("fwd_tflops", "bwd_tflops")


def print_clocks(cfgs, results, power_field=None):
    """Per direction, one row per shape: each backend's mean SM clock (MHz),
    power (W, nvidia-smi's power_field) and energy per FLOP (pJ) during its
    timed calls, medians over the rounds."""
    for short, what in (("fwd", "forward"), ("bwd", "backward")):
        names = []
        for r in results:
            if r["backend"] not in names and f"{short}_sm_mhz" in r:
                names.append(r["backend"])
        if not names:
            continue
        print(f"\nSM clock MHz / power W / pJ per FLOP during the timed {what} calls "
              f"(nvidia-smi clocks.sm / {power_field}, 50 ms samples)")
        print(f"{'shape':40s} " + " ".join(f"{n:>22s}" for n in names))
        for cfg in cfgs:
            key = shape_key(cfg)
            cells = []
            for n in names:
                recs = [r for r in results if r["shape"] == key and r["backend"] == n
                        and f"{short}_sm_mhz" in r]
                pj = [r[f"{short}_pj_per_flop"] for r in recs if f"{short}_pj_per_flop" in r]
                cells.append(f"{statistics.median(r[f'{short}_sm_mhz'] for r in recs):5.0f} / "
                             f"{statistics.median(r[f'{short}_power_w'] for r in recs):4.0f} / "
                             + (f"{statistics.median(pj):5.3f}" if pj else "  -  ")
                             if recs else "-")
            print(f"{key:40s} " + " ".join(f"{c:>22s}" for c in cells))


def ratio_of(records, others, ours_det, key):
    """gqattn's best deterministic entry over the strongest other backend, on
    one shape in one round (records: backend -> record); None if either
    side has no number."""
    best = max((records[n][key] for n in others if n in records and key in records[n]),
               default=None)
    mine = max((records[n][key] for n in ours_det if n in records and key in records[n]),
               default=None)
    return mine / best if best and mine else None


def print_spin_short(results):
    """Names the passes whose timed calls the host queued slower than the
    spin ahead of them lasted (--spin-ahead-us): their times include host
    time, as every call's did without a spin."""
    short = [f"{r['backend']} {r['shape']} {p} ({r[p + '_spin_short']} of the calls, "
             f"median queueing {r.get(p + '_enqueue_us', float('nan')):.0f} us)"
             for r in results for p in ("fwd", "bwd") if r.get(p + "_spin_short")]
    if short:
        print("\nnote: calls queued slower than the spin ahead of them (their times include "
              "host time; raise --spin-ahead-us):\n  " + "\n  ".join(short))


def summarise(cfgs, results, rounds):
    """Prints the table (one row per shape: each backend's median TFLOP/s
    over the rounds, the ratio's median and, with several rounds, its range)
    and returns (medians, table) for the JSON."""
    names = []
    for r in results:
        if r["backend"] not in names:
            names.append(r["backend"])
    ours = [n for n in names if n.startswith("gqattn:")]
    others = [n for n in names if not n.startswith("gqattn:")]
    # The ratios compare gqattn's deterministic entries (its default) when
    # there are any; :nondet columns are shown beside them.
    ours_det = [n for n in ours if not n.endswith(":" + NONDET)] or ours
    cell = lambda r, k: f"{r[k]:6.0f}" if r and k in r else "     -"
    width = max([17] + [len(n) for n in names])  # 17: "ffffff/bbbbbb    "
    header = (f"{'shape':40s} " + " ".join(f"{n:>{width}s}" for n in names) +
              "   ours/best fwd  bwd" + ("   range fwd    range bwd" if rounds > 1 else ""))
    print("\nTFLOP/s fwd/bwd" + (f", median of {rounds} rounds" if rounds > 1 else ""))
    print(header)
    medians, table = [], []
    for cfg in cfgs:
        key = shape_key(cfg)
        row = {}
        for n in names:
            recs = [r for r in results if r["shape"] == key and r["backend"] == n]
            med = {k: statistics.median(r[k] for r in recs if k in r)
                   for k in METRICS if any(k in r for r in recs)}
            if med:
                med.update(shape=key, backend=n, rounds=len(recs))
                medians.append(med)
                row[n] = med
        line = f"{key:40s} " + " ".join(
            f"{cell(row.get(n), 'fwd_tflops')}/{cell(row.get(n), 'bwd_tflops')}    ".rjust(width)
            for n in names)
        entry = dict(shape=key)
        spans = []
        for k, short in zip(METRICS, ("fwd", "bwd")):
            per_round = []
            for i in range(rounds):
                recs = {r["backend"]: r for r in results
                        if r["shape"] == key and r.get("round", 0) == i}
                value = ratio_of(recs, others, ours_det, k)
                if value is not None:
                    per_round.append(value)
            entry[f"ratio_{short}"] = statistics.median(per_round) if per_round else None
            entry[f"ratio_{short}_rounds"] = per_round
            spans.append(f"{min(per_round):5.2f}-{max(per_round):5.2f}" if per_round
                         else "     -     ")
        line += "   " + "  ".join(f"{entry[f'ratio_{s}']:5.2f}" if entry[f"ratio_{s}"]
                                  else "    -" for s in ("fwd", "bwd"))
        if rounds > 1:
            line += "   " + "  ".join(spans)
        print(line)
        table.append(entry)
    return medians, table


if __name__ == "__main__":
    main()
