#!/usr/bin/env python3
"""Burst load client of bench/bursts: sends the burst shapes to one router and measures what
the replicas behind it did.

    client.py run --target NAME --url URL --replica-metrics URL,URL,... --out FILE [...]
    client.py report FILE... [--json OUT]

`run` warms the router's connections, then sends every selected shape (--steps steps each,
every step with fresh random prompts, the next step once the previous one has completed) to
the router at URL. Around every step it reads each replica's /metrics (counter deltas: prompt
tokens looked up and found cached, requests finished) and, for switchyard (--admin), the
admin API's decision records of the step (router-side arrival times and burst windows). Each
response names its replica in mock-replica's `x-mock-replica` header, which both routers pass
through. Everything goes to FILE raw (JSON). `report` turns one or more such files into the
markdown tables (and writes them, merged with per-row summaries, to --json).

Prompts are text (`/v1/completions`), ASCII random words. mock-replica tokenizes text at 4
bytes per token and caches full 16-token blocks, so every prompt (and every multi-turn prefix,
every shared system prompt) is a multiple of 64 bytes: a prompt that a replica already holds
then costs it 0 prefill tokens, and "ideal" is exact (README.md).
"""

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time

import aiohttp

REQUEST_TIMEOUT_S = 120  # a request still unanswered then counts as an error
BLOCK_BYTES = 64  # 16-token blocks at 4 bytes per token
BYTES_PER_TOKEN = 4

# Shape 5: unequal group sizes (fixed, sum 512).
UNEQUAL_GROUPS = [96, 8, 64, 24, 80, 16, 56, 32, 48, 40, 36, 12]

SHAPES = {
    1: dict(name="32x16 at once", kind="burst", groups=[16] * 32, spread_ms=0),
    2: dict(name="32x16 over 30 ms", kind="burst", groups=[16] * 32, spread_ms=30),
    3: dict(name="32x16 over 250 ms", kind="burst", groups=[16] * 32, spread_ms=250),
    4: dict(name="4x128 over 30 ms", kind="burst", groups=[128] * 4, spread_ms=30),
    5: dict(name="12 unequal groups over 50 ms", kind="burst", groups=UNEQUAL_GROUPS,
            spread_ms=50),
    6: dict(name="multi-turn 32 sessions x 4 turns", kind="multi-turn", sessions=32, turns=4,
            spread_ms=30),
    7: dict(name="shared prefix 8x64 over 1 s", kind="shared-prefix", prefixes=8, per_prefix=64,
            prefix_tokens=2048, spread_ms=1000),
    8: dict(name="32x16 prompt by prompt over 250 ms", kind="burst", groups=[16] * 32,
            spread_ms=250, prompt_by_prompt=True),
    9: dict(name="12 unequal groups over 250 ms", kind="burst", groups=UNEQUAL_GROUPS,
            spread_ms=250),
}


# --- prompts --------------------------------------------------------------------------------

def make_vocab(rng, n=4096):
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))))
    return sorted(words)


def words_text(rng, vocab, nbytes):
    """Random words, exactly nbytes bytes long (ASCII), ending with a space."""
    parts, size = [], 0
    while size < nbytes:
        w = rng.choice(vocab)
        parts.append(w)
        size += len(w) + 1
    text = " ".join(parts) + " "
    text = text[:nbytes]
    if not text.endswith(" "):
        text = text[:-1] + " "
    return text


def pad_to_block(rng, vocab, text, extra_min_bytes=0):
    """Appends random words so that len(text) is a multiple of BLOCK_BYTES and at least
    extra_min_bytes were added."""
    target = len(text) + extra_min_bytes
    target = -(-target // BLOCK_BYTES) * BLOCK_BYTES
    return text + words_text(rng, vocab, target - len(text)) if target > len(text) else text


def tokens_of(text):
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def aligned_prompt(rng, vocab, min_tokens, max_tokens):
    tokens = rng.randint(min_tokens, max_tokens) // 16 * 16
    return words_text(rng, vocab, tokens * BYTES_PER_TOKEN)


# --- metrics --------------------------------------------------------------------------------

COUNTERS = {
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:request_success_total": "requests",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


async def scrape(session, url):
    async with session.get(url) as r:
        text = await r.text()
    out = {v: 0.0 for v in COUNTERS.values()}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS:
            out[COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
    return out


async def scrape_all(session, urls):
    return await asyncio.gather(*(scrape(session, u) for u in urls))


async def wait_idle(session, urls, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        snaps = await scrape_all(session, urls)
        if all(s["running"] == 0 and s["waiting"] == 0 for s in snaps):
            return snaps
        if time.monotonic() > deadline:
            raise RuntimeError("replicas still busy after %ds" % timeout)
        await asyncio.sleep(0.05)


# --- sending --------------------------------------------------------------------------------

class RawConnections:
    """HTTP/1.1 keep-alive connections to one host:port over plain asyncio streams. A request
    is one pre-built bytes object written in one call, so a task that starts a request does
    almost nothing before its first await: 512 requests leave the client within a few ms,
    where aiohttp's per-request work (about 0.2 ms here) spreads them over ~100 ms."""

    def __init__(self, url):
        rest = url.split("://", 1)[1]
        hostport, _, path = rest.partition("/")
        self.host, _, port = hostport.partition(":")
        self.port = int(port or 80)
        self.path = "/" + path
        self.idle = []

    async def _open(self):
        return await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    def head(self, rid, length):
        return ("POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\nx-request-id: %s\r\n\r\n"
                % (self.path, self.host, self.port, length, rid)).encode()

    async def post(self, rid, body, now_ms):
        request = self.head(rid, len(body)) + body
        for attempt in (0, 1):
            fresh = not self.idle
            reader, writer = self.idle.pop() if self.idle else await self._open()
            try:
                writer.write(request)
                sent_ms = now_ms()
                status_line = await reader.readuntil(b"\r\n")
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                if fresh or attempt:
                    raise
                continue  # a kept-alive connection the server had closed: once more, fresh
            break
        status = int(status_line.split()[1])
        headers = {}
        for line in (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n"):
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            raw = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            raw = b"".join(parts)
        else:
            raw = await reader.read()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append((reader, writer))
        return status, headers, raw, sent_ms

    def close(self):
        for _, writer in self.idle:
            writer.close()
        self.idle = []


class Sender:
    """Sends completions to the router with either client: "raw" (RawConnections, default)
    or "aiohttp"."""

    def __init__(self, url, model, max_tokens, client):
        self.url = url
        self.model = model
        self.max_tokens = max_tokens
        self.client = client
        self.t0 = time.perf_counter()
        self.raw = RawConnections(url) if client == "raw" else None
        self.session = None
        if client == "aiohttp":
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=120),
                timeout=aiohttp.ClientTimeout(total=None), trace_configs=[trace_config(self)])

    async def close(self):
        if self.session:
            await self.session.close()
        if self.raw:
            self.raw.close()

    def now_ms(self):
        return (time.perf_counter() - self.t0) * 1000.0

    def body(self, prompt, max_tokens=None):
        return json.dumps({"model": self.model, "prompt": prompt,
                           "max_tokens": max_tokens or self.max_tokens,
                           "temperature": 1.0}).encode()

    async def _post_aiohttp(self, rid, body):
        ctx = {"sent_ms": None}
        async with self.session.post(
                self.url, data=body, trace_request_ctx=ctx,
                headers={"content-type": "application/json", "x-request-id": rid}) as r:
            raw = await r.read()
            headers = {k.lower(): v for k, v in r.headers.items()}
            return r.status, headers, raw, ctx["sent_ms"]

    async def send(self, rid, group, prompt, offset_ms=None, max_tokens=None, body=None):
        """prompt: the text (for its token count); body: pre-built, or built here."""
        if body is None:
            body = self.body(prompt, max_tokens)
        rec = {"id": rid, "group": group, "prompt_tokens_sent": tokens_of(prompt),
               "offset_ms": offset_ms, "sent_ms": None}
        rec["start_ms"] = self.now_ms()
        try:
            post = (self.raw.post(rid, body, self.now_ms) if self.raw
                    else self._post_aiohttp(rid, body))
            status, headers, raw, rec["sent_ms"] = await asyncio.wait_for(
                post, REQUEST_TIMEOUT_S)
            rec["end_ms"] = self.now_ms()
            rec["status"] = status
            rec["replica"] = headers.get("x-mock-replica")
            rec["decision"] = headers.get("x-switchyard-decision")
            if status == 200:
                doc = json.loads(raw)
                usage = doc.get("usage") or {}
                rec["prompt_tokens"] = usage.get("prompt_tokens")
                rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get(
                    "cached_tokens")
                rec["text"] = doc["choices"][0].get("text", "")
            else:
                rec["error"] = raw[:300].decode(errors="replace")
        except Exception as e:  # noqa: BLE001 - every failure is a counted error
            rec["end_ms"] = self.now_ms()
            rec["status"] = None
            rec["error"] = repr(e)[:300]
        return rec


def trace_config(sender):
    tc = aiohttp.TraceConfig()

    async def on_chunk_sent(_session, ctx, _params):
        # The time the request's last body chunk was handed to the socket.
        if ctx.trace_request_ctx is not None:
            ctx.trace_request_ctx["sent_ms"] = sender.now_ms()

    tc.on_request_chunk_sent.append(on_chunk_sent)
    return tc


async def dispatch(sender, plan):
    """plan: list of (offset_ms, coroutine factory). Starts each at its offset after now."""
    plan = sorted(plan, key=lambda p: p[0])
    base = sender.now_ms()
    tasks = []
    for offset, factory in plan:
        delay = (base + offset - sender.now_ms()) / 1000.0
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(factory()))
    return await asyncio.gather(*tasks)


def offsets(rng, n, spread_ms):
    if spread_ms <= 0:
        return [0.0] * n
    return sorted(rng.uniform(0, spread_ms) for _ in range(n))


# --- shapes ---------------------------------------------------------------------------------

async def step_burst(sender, rng, vocab, shape, tag, args):
    prompts = [aligned_prompt(rng, vocab, args.min_tokens, args.max_prompt_tokens)
               for _ in shape["groups"]]
    reqs = []
    for g, n in enumerate(shape["groups"]):
        for k in range(n):
            reqs.append((g, k))
    if not shape.get("prompt_by_prompt"):
        rng.shuffle(reqs)
    offs = offsets(rng, len(reqs), shape["spread_ms"])
    bodies = [sender.body(p) for p in prompts]
    plan = []
    for (g, k), off in zip(reqs, offs):
        rid = "%s-g%d-s%d" % (tag, g, k)
        plan.append((off, lambda rid=rid, g=g, off=off: sender.send(rid, g, prompts[g], off,
                                                                    body=bodies[g])))
    recs = await dispatch(sender, plan)
    ideal = sum(tokens_of(p) for p in prompts)
    return recs, {"ideal_tokens": ideal, "groups": len(prompts),
                  "ideal_definition": "each distinct prompt prefilled once"}


async def step_shared_prefix(sender, rng, vocab, shape, tag, args):
    systems = [words_text(rng, vocab, shape["prefix_tokens"] * BYTES_PER_TOKEN)
               for _ in range(shape["prefixes"])]
    reqs = []
    for g in range(shape["prefixes"]):
        for k in range(shape["per_prefix"]):
            suffix = words_text(rng, vocab, rng.randint(64, 256) * BYTES_PER_TOKEN
                                + rng.randint(0, 3))
            suffix = "Question %d.%d: %s" % (g, k, suffix)
            reqs.append((g, k, systems[g] + suffix))
    rng.shuffle(reqs)
    offs = offsets(rng, len(reqs), shape["spread_ms"])
    plan = []
    for (g, k, prompt), off in zip(reqs, offs):
        rid = "%s-g%d-s%d" % (tag, g, k)
        body = sender.body(prompt)
        plan.append((off, lambda rid=rid, g=g, p=prompt, off=off, b=body:
                     sender.send(rid, g, p, off, body=b)))
    recs = await dispatch(sender, plan)
    # Ideal: each system prompt prefilled once; every suffix is distinct, so always prefilled.
    ideal = sum(tokens_of(s) for s in systems) + sum(
        tokens_of(p) - tokens_of(systems[g]) for g, _, p in reqs)
    return recs, {"ideal_tokens": ideal, "groups": len(systems),
                  "ideal_definition": "each system prompt once + every distinct suffix"}


async def step_multi_turn(sender, rng, vocab, shape, tag, args):
    sessions = shape["sessions"]
    firsts = [aligned_prompt(rng, vocab, args.min_tokens, args.max_prompt_tokens // 2)
              for _ in range(sessions)]
    # Per-session rng so the user texts do not depend on the order answers come back in.
    seeds = [rng.getrandbits(64) for _ in range(sessions)]
    finals = [None] * sessions

    async def session(s):
        srng = random.Random(seeds[s])
        prompt = firsts[s]
        out = []
        for turn in range(shape["turns"]):
            if turn > 0:
                prev = out[-1]
                answer = prev.get("text") or ""
                user = "\nUser: " + words_text(srng, vocab, srng.randint(64, 256) * 4)
                prompt = pad_to_block(srng, vocab, prompt + answer + user)
            rec = await sender.send("%s-g%d-t%d" % (tag, s, turn), s, prompt, None)
            rec["turn"] = turn
            out.append(rec)
            if rec.get("status") != 200:
                break
        finals[s] = prompt
        return out

    offs = offsets(rng, sessions, shape["spread_ms"])
    order = list(range(sessions))
    rng.shuffle(order)
    plan = [(off, lambda s=s: session(s)) for s, off in zip(order, offs)]
    per_session = await dispatch(sender, plan)
    recs = [r for rs in per_session for r in rs]
    for r in recs:
        r.pop("text", None)
    # Ideal: each turn's prompt extends the previous one by whole blocks, so a session kept on
    # one replica prefills every token of its last prompt exactly once (the previous answer is
    # not in the cache: generated tokens are not cached, they are prefilled in the next turn).
    ideal = sum(tokens_of(p) for p in finals)
    return recs, {"ideal_tokens": ideal, "groups": sessions,
                  "ideal_definition": "each session's last prompt prefilled once"}


STEP_FNS = {"burst": step_burst, "shared-prefix": step_shared_prefix,
            "multi-turn": step_multi_turn}


async def admin_get(session, admin, path):
    """GET `path` on the router's admin API: (body text, None), or (None, {"error": why})."""
    try:
        async with session.get(admin.rstrip("/") + path) as r:
            if r.status != 200:
                return None, {"error": "admin %s answered %d" % (path, r.status)}
            return await r.text(), None
    except Exception as e:  # noqa: BLE001
        return None, {"error": repr(e)}


async def fetch_decisions(session, admin, ids):
    if not admin:
        return None
    text, error = await admin_get(session, admin, "/decisions?limit=100000")
    if error:
        return error
    try:
        doc = json.loads(text)
        records = doc if isinstance(doc, list) else doc.get("decisions", [])
    except ValueError:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    out = []
    for d in records:
        if d.get("id") not in ids:
            continue
        w = (d.get("decision") or {}).get("window")
        out.append({"id": d["id"], "arrival_ms": d.get("arrival_ms"),
                    "decided_ms": d.get("decided_ms"), "endpoints": d.get("endpoints"),
                    "window": [w["opened_ms"], w["sealed_ms"], w["batch_size"]] if w else None})
    return {"records": out, "matched": len(out), "asked": len(ids),
            "plan": await fetch_burst_plan(session, admin)}


PLAN_FIELDS = ("burst", "burstStart", "latestWindow", "previousBurst", "previousBurstSizes",
               "unequalBurstSizes", "groupsRemembered", "groups")


async def fetch_burst_plan(session, admin):
    """The burst producer's plan after the step (its state's `plan`): the step measured
    against its bounds as the plan counted it (`burst`), the step's first window
    (`burstStart`: what each replica carried then and what the plan put on it) and its last
    (`latestWindow`), the burst before the step (`previousBurst`, which the step's progress
    was measured against) and the sizes it went by, and the groups it remembers with their
    parts per replica (`groups`), which tell a split the plan chose from one made after it."""
    text, error = await admin_get(session, admin, "/plugins/state")
    if error:
        return error
    for state in json.loads(text).values():
        if isinstance(state, dict) and isinstance(state.get("plan"), dict):
            return {field: state["plan"].get(field) for field in PLAN_FIELDS}
    return None


async def run(args):
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(8), "little")
    rng = random.Random(seed)
    vocab = make_vocab(rng)
    metric_urls = [u.rstrip("/") + "/metrics" for u in args.replica_metrics.split(",")]
    names = args.replica_names.split(",") if args.replica_names else [
        "r%d" % i for i in range(len(metric_urls))]
    shapes = [int(s) for s in args.shapes.replace(",", " ").split()]
    result = {"target": args.target, "round": args.round, "url": args.url, "seed": seed,
              "replicas": names, "steps": args.steps, "max_tokens": args.max_tokens,
              "shapes": []}
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=120)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as metrics_session:
        sender = Sender(args.url, args.model, args.max_tokens, args.client)
        result["client"] = args.client
        try:
            # Warm-up: open the connections a full burst needs, with bodies of a burst's size
            # (one 2,048-token prompt for all, 1 output token; not measured).
            warm_prompt = words_text(rng, vocab, 2048 * BYTES_PER_TOKEN)
            warm_body = sender.body(warm_prompt, max_tokens=1)
            wrecs = await asyncio.gather(*(sender.send("warm-%d" % i, -1, warm_prompt,
                                                       body=warm_body)
                                           for i in range(args.warmup)))
            bad = [r for r in wrecs if r.get("status") != 200]
            result["warmup"] = {"requests": len(wrecs), "errors": len(bad),
                                "first_error": bad[0].get("error") if bad else None}
            for sid in shapes:
                shape = SHAPES[sid]
                sres = {"shape": sid, "name": shape["name"], "kind": shape["kind"],
                        "spread_ms": shape["spread_ms"], "steps": []}
                for step in range(args.steps):
                    before = await wait_idle(metrics_session, metric_urls)
                    tag = "%s-r%d-sh%d-st%d-%x" % (args.target, args.round, sid, step,
                                                   rng.getrandbits(24))
                    t_start = sender.now_ms()
                    recs, info = await STEP_FNS[shape["kind"]](sender, rng, vocab, shape, tag,
                                                               args)
                    t_end = sender.now_ms()
                    after = await wait_idle(metrics_session, metric_urls)
                    delta = [{k: a[k] - b[k] for k in ("queries", "hits", "requests",
                                                         "prompt_tokens")}
                             for a, b in zip(after, before)]
                    for r in recs:
                        r.pop("text", None)
                    decisions = await fetch_decisions(metrics_session, args.admin,
                                                      {r["id"] for r in recs})
                    sres["steps"].append({"step": step, "tag": tag, "duration_ms": t_end - t_start,
                                          **info, "replicas": delta, "requests": recs,
                                          "router": decisions})
                    done = sum(1 for r in recs if r.get("status") == 200)
                    print("  %-10s shape %d step %d: %d/%d ok, %.2f s, prefill %d (ideal %d)"
                          % (args.target, sid, step, done, len(recs), (t_end - t_start) / 1000,
                             sum(d["queries"] - d["hits"] for d in delta), info["ideal_tokens"]),
                          file=sys.stderr, flush=True)
                result["shapes"].append(sres)
        finally:
            await sender.close()
    with open(args.out, "w") as f:
        json.dump(result, f)


# --- report ---------------------------------------------------------------------------------

def pct(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize(run_doc, sres):
    steps = sres["steps"]
    nrep = len(run_doc["replicas"])
    prefill = sum(d["queries"] - d["hits"] for s in steps for d in s["replicas"])
    queries = sum(d["queries"] for s in steps for d in s["replicas"])
    hits = sum(d["hits"] for s in steps for d in s["replicas"])
    ideal = sum(s["ideal_tokens"] for s in steps)
    recs = [r for s in steps for r in s["requests"]]
    sent_tokens = sum(r["prompt_tokens_sent"] for r in recs)
    ok = [r for r in recs if r.get("status") == 200]
    errors = len(recs) - len(ok)
    lat = [r["end_ms"] - r["start_ms"] for r in ok]
    per_step_req = [[d["requests"] for d in s["replicas"]] for s in steps]
    req_min = min(min(x) for x in per_step_req)
    req_max = max(max(x) for x in per_step_req)
    known = all(r.get("replica") for r in ok)
    placements = bound = None
    if known and ok:
        placements = sum(step_placements(s) for s in steps)
        bound = sum(s["groups"] + nrep - 1 for s in steps)
    # Arrival spread of the step's first wave (all requests of a burst; turn 0 of multi-turn).
    client_spread, router_spread, windows = [], [], []
    for s in steps:
        first = [r for r in s["requests"] if r.get("turn", 0) == 0 and r.get("sent_ms")]
        if first:
            client_spread.append(max(r["sent_ms"] for r in first) -
                                 min(r["start_ms"] for r in first))
        rt = s.get("router") or {}
        recsr = rt.get("records") or []
        first_ids = {r["id"] for r in first}
        arr = [d["arrival_ms"] for d in recsr if d["id"] in first_ids and
               d.get("arrival_ms") is not None]
        if arr:
            router_spread.append(max(arr) - min(arr))
        if recsr:
            ws = {tuple(d["window"]) for d in recsr if d.get("window")}
            windows.append(len(ws))
    return {
        "round": run_doc["round"], "target": run_doc["target"], "shape": sres["shape"],
        "name": sres["name"], "requests": len(recs), "errors": errors,
        "prefill_tokens": prefill, "ideal_tokens": ideal,
        "prefill_over_ideal": prefill / ideal if ideal else float("nan"),
        "prompt_tokens_sent": sent_tokens,
        "hit_rate": hits / queries if queries else float("nan"),
        "ideal_hit_rate": 1 - ideal / sent_tokens if sent_tokens else float("nan"),
        "requests_per_replica_min": req_min, "requests_per_replica_max": req_max,
        "placements": placements, "placement_bound": bound,
        "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
        "step_s_mean": statistics.mean(s["duration_ms"] for s in steps) / 1000,
        "client_send_spread_ms": client_spread, "router_arrival_spread_ms": router_spread,
        "windows_per_step": windows,
    }


def fmt_int(n):
    return "{:,}".format(int(round(n)))


def report(args):
    runs = []
    for path in args.files:
        with open(path) as f:
            doc = json.load(f)
        # A run's own file, or the results file of a whole bench (re-reported).
        runs.extend(doc["runs"] if "runs" in doc else [doc])
    rows = [summarize(r, s) for r in runs for s in r["shapes"]]
    rows.sort(key=lambda x: (x["round"], x["shape"], x["target"] != "switchyard", x["target"]))
    print("| round | shape | target | prefill tok | ideal tok | prefill/ideal | hit rate (ideal) "
          "| req/replica min–max | placements / P+R−1 | p50 ms | p99 ms | step s | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        pl = ("%d / %d" % (x["placements"], x["placement_bound"])
              if x["placements"] is not None else "n/a")
        print("| %d | %d %s | %s | %s | %s | %.2f | %.1f%% (%.1f%%) | %d–%d | %s | %.0f | %.0f "
              "| %.2f | %d/%d |" % (
                  x["round"], x["shape"], x["name"], x["target"], fmt_int(x["prefill_tokens"]),
                  fmt_int(x["ideal_tokens"]), x["prefill_over_ideal"], 100 * x["hit_rate"],
                  100 * x["ideal_hit_rate"], x["requests_per_replica_min"],
                  x["requests_per_replica_max"], pl, x["p50_ms"], x["p99_ms"],
                  x["step_s_mean"], x["errors"], x["requests"]))
    print()
    print("Arrival spread of each step's first wave (ms; one figure per step): client = first "
          "send started to last body written; router = switchyard's arrival_ms (decision "
          "records), with the number of burst windows the step's requests were decided in.")
    print()
    print("| round | shape | target | client spread ms | router spread ms | windows |")
    print("|---|---|---|---|---|---|")
    for x in rows:
        f = lambda v: ", ".join("%.1f" % t for t in v) if v else "–"  # noqa: E731
        print("| %d | %d | %s | %s | %s | %s |" % (
            x["round"], x["shape"], x["target"], f(x["client_send_spread_ms"]),
            f(x["router_arrival_spread_ms"]),
            ", ".join(str(w) for w in x["windows_per_step"]) or "–"))
    goals = goal_rows(runs)
    if goals:
        print()
        print("Against the goal, over the whole run: every step of a burst shape within P + R − 1 "
              "placements with every replica within 10% of its share (or 2 requests), no "
              "errors, and p99 over all its requests at most sglang's; multi-turn and shared "
              "prefix at least sglang's hit rate, both measured against the best their own "
              "fresh prompts allow. Rounds: those whose own p99 (or hit rate) was on the "
              "wrong side.")
        print()
        print("| shape | steps within bounds | errors | switchyard | sglang | rounds | met |")
        print("|---|---|---|---|---|---|---|")
        for g in goals:
            print("| %d %s | %s | %d | %s | %s | %s | %s |" % (
                g["shape"], g["name"], g["within"], g["errors"], g["ours"], g["theirs"],
                g["rounds_behind"], "yes" if g["met"] else "**no**"))
    agreement = plan_agreement(runs)
    if agreement:
        print()
        print("The plan's own count of each burst step (`burst` in the burst producer's state) "
              "against the client's: placements equal in %d of %d steps, the same verdict on "
              "both bounds in %d." % agreement)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": rows, "goals": goals, "runs": runs}, f)


def step_placements(step):
    """The distinct (group, replica) pairs of a step's answered requests."""
    return len({(r["group"], r["replica"]) for r in step["requests"] if r.get("status") == 200})


def plan_agreement(runs):
    """How many of switchyard's burst steps the plan counted as the client did: (placements
    equal, steps, verdict on the bounds equal); None when no step has the plan's count."""
    steps = placements = verdicts = 0
    for run in runs:
        if run["target"] != "switchyard":
            continue
        nrep = len(run["replicas"])
        for sres in run["shapes"]:
            if sres["kind"] != "burst":
                continue
            for st in sres["steps"]:
                plan = (st.get("router") or {}).get("plan")
                burst = plan.get("burst") if isinstance(plan, dict) else None
                if not burst:
                    continue
                steps += 1
                placements += burst["placements"] == step_placements(st)
                verdicts += burst["withinBounds"] == step_within_bounds(st, nrep)
    return (placements, steps, verdicts) if steps else None


def step_within_bounds(step, nrep):
    """Whether a step kept P + R − 1 placements and every replica within 10% of its share (or
    two requests)."""
    ok = [r for r in step["requests"] if r.get("status") == 200]
    if not ok or not all(r.get("replica") for r in ok):
        return False
    placements = step_placements(step)
    share = len(step["requests"]) / nrep
    off = max(0.1 * share, 2)
    even = all(abs(d["requests"] - share) <= off for d in step["replicas"])
    return placements <= step["groups"] + nrep - 1 and even


def goal_rows(runs):
    """The goal of the bench per shape, over every round of both targets, when both ran."""
    by = {}
    for run in runs:
        for sres in run["shapes"]:
            by.setdefault(sres["shape"], {}).setdefault(run["target"], []).append((run, sres))
    goals = []
    for shape in sorted(by):
        targets = by[shape]
        if "switchyard" not in targets or "sglang" not in targets:
            continue
        ours, theirs = targets["switchyard"], targets["sglang"]
        name, kind = ours[0][1]["name"], ours[0][1]["kind"]
        oks = lambda pairs: [r for _, s in pairs for st in s["steps"]  # noqa: E731
                             for r in st["requests"] if r.get("status") == 200]
        errors = sum(len(st["requests"]) for _, s in ours for st in s["steps"]) - len(oks(ours))
        by_round = {run["round"]: summarize(run, s) for run, s in theirs}
        if kind == "burst":
            steps = [(len(run["replicas"]), st) for run, s in ours for st in s["steps"]]
            within = sum(step_within_bounds(st, nrep) for nrep, st in steps)
            p99 = lambda pairs: pct([r["end_ms"] - r["start_ms"] for r in oks(pairs)], 99)  # noqa: E731
            mine, other = p99(ours), p99(theirs)
            behind = [run["round"] for run, s in ours
                      if summarize(run, s)["p99_ms"] > by_round[run["round"]]["p99_ms"]]
            met = within == len(steps) and errors == 0 and mine <= other
            row = {"within": "%d of %d" % (within, len(steps)), "ours": "p99 %.0f ms" % mine,
                   "theirs": "p99 %.0f ms" % other}
        else:
            # Each target gets fresh prompts, so each has its own best reachable hit rate:
            # the rates are compared by how far each falls short of its own, counted in
            # tokens prefilled beyond the ideal (exact, where rates would round).
            def hit_rates(pairs):
                tally = lambda key: sum(d[key] for _, s in pairs  # noqa: E731
                                        for st in s["steps"] for d in st["replicas"])
                ideal = sum(st["ideal_tokens"] for _, s in pairs for st in s["steps"])
                queries, hits = tally("queries"), tally("hits")
                return hits / queries, 1 - ideal / queries, (queries - hits - ideal) / queries

            def short(x):
                return (x["prefill_tokens"] - x["ideal_tokens"]) / x["prompt_tokens_sent"]
            (mine, mine_ideal, mine_short) = hit_rates(ours)
            (other, other_ideal, other_short) = hit_rates(theirs)
            behind = [run["round"] for run, s in ours
                      if short(summarize(run, s)) > short(by_round[run["round"]])]
            met = errors == 0 and mine_short <= other_short
            row = {"within": "–",
                   "ours": "hit rate %.1f%% (ideal %.1f%%)" % (100 * mine, 100 * mine_ideal),
                   "theirs": "hit rate %.1f%% (ideal %.1f%%)" % (100 * other, 100 * other_ideal)}
        row.update({"shape": shape, "name": name, "errors": errors, "met": met,
                    "rounds_behind": ", ".join(str(r) for r in behind) or "none"})
        goals.append(row)
    return goals


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--target", required=True)
    r.add_argument("--round", type=int, default=1)
    r.add_argument("--url", required=True, help="the router's /v1/completions URL")
    r.add_argument("--replica-metrics", required=True,
                   help="comma-separated base URLs of the replicas (for /metrics)")
    r.add_argument("--replica-names", default="")
    r.add_argument("--admin", default="", help="switchyard's admin API base URL, if any")
    r.add_argument("--shapes", default="1 2 3 4 5 6 7 8 9")
    r.add_argument("--steps", type=int, default=2)
    r.add_argument("--model", default="mock-model")
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--min-tokens", type=int, default=1024, help="shortest prompt (tokens)")
    r.add_argument("--max-prompt-tokens", type=int, default=3072, help="longest prompt (tokens)")
    r.add_argument("--warmup", type=int, default=512, help="warm-up requests (connections)")
    r.add_argument("--timeout", type=float, default=300,
                   help="seconds for a metrics or admin read")
    r.add_argument("--client", choices=["raw", "aiohttp"], default="raw",
                   help="how requests are sent to the router (README.md, 'Arrivals')")
    r.add_argument("--seed", type=int, default=None, help="default: fresh random")
    r.add_argument("--out", required=True)
    q = sub.add_parser("report")
    q.add_argument("files", nargs="+")
    q.add_argument("--json", default="")
    args = p.parse_args()
    if args.cmd == "run":
        asyncio.run(run(args))
    else:
        report(args)


if __name__ == "__main__":
    main()
