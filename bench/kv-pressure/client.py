#!/usr/bin/env python3
"""Load client of the KV-pressure bench: many tenants, each with a long prefix of its own.

`run` sends `--requests` completions as a Poisson process of `--rps` to the routers of `--url`
(comma-separated; request i goes to router i mod n, as a load balancer deals them): each picks
a tenant uniformly at random and is that tenant's prefix followed by a question of its own,
sent as token ids (so a router with the engines' tokenizer semantics can match it exactly),
streamed, with a length of answer drawn per request. The workload is a function of `--seed`
alone: every pipeline of one run gets the same requests at the same offsets. It records per
request the time to the first token and to the last, and before and after the run the
replicas' prefix-cache counters and the routers' prediction counters (summed), into `--out`
(JSON).

`report` turns such files into one table (stdout).
"""

import argparse
import asyncio
import json
import random
import sys
import time

import aiohttp


def workload(args):
    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(1000, 100000) for _ in range(args.prefix_tokens)]
                for _ in range(args.tenants)]
    at = 0.0
    requests = []
    for i in range(args.requests):
        tenant = rng.randrange(args.tenants)
        question = [rng.randrange(1000, 100000)
                    for _ in range(rng.randint(args.question_min, args.question_max))]
        requests.append({
            "id": "kvp-%d" % i,
            "tenant": tenant,
            "offset_s": at,
            "prompt": prefixes[tenant] + question,
            "max_tokens": rng.randint(args.output_min, args.output_max),
        })
        at += rng.expovariate(args.rps)
    return requests


def counters(text, names):
    """Sums of the named counters on a Prometheus page, per name and label set."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name in names:
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                pass
    return out


async def scrape(session, urls, names):
    pages = {}
    for url in urls:
        async with session.get(url) as r:
            pages[url] = counters(await r.text(), names)
    return pages


REPLICA_COUNTERS = {"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"}
ROUTER_COUNTERS = {"switchyard_prefix_predicted_tokens_total",
                   "switchyard_prefix_cached_tokens_total",
                   "switchyard_prefix_correct_tokens_total",
                   "switchyard_prefix_checked_requests_total"}


async def send(session, url, model, req, t0):
    body = {"model": model, "prompt": req["prompt"], "max_tokens": req["max_tokens"],
            "stream": True, "stream_options": {"include_usage": True}}
    rec = {"id": req["id"], "tenant": req["tenant"], "offset_s": req["offset_s"],
           "prompt_tokens": len(req["prompt"])}
    start = time.perf_counter()
    rec["late_s"] = start - t0 - req["offset_s"]
    try:
        async with session.post(url, json=body, headers={"x-request-id": req["id"]}) as r:
            rec["status"] = r.status
            rec["replica"] = r.headers.get("x-mock-replica")
            async for line in r.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                doc = json.loads(data)
                if "ttft_s" not in rec and doc.get("choices"):
                    rec["ttft_s"] = time.perf_counter() - start
                usage = doc.get("usage")
                if usage:
                    rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens")
    except Exception as e:  # noqa: BLE001
        rec["error"] = repr(e)
    rec["e2e_s"] = time.perf_counter() - start
    return rec


async def run(args):
    requests = workload(args)
    replica_metrics = [u.rstrip("/") + "/metrics" for u in args.replica_metrics.split(",")]
    urls = args.url.split(",")
    router_metrics = args.router_metrics.split(",")
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        before = await scrape(session, replica_metrics, REPLICA_COUNTERS)
        router_before = await scrape(session, router_metrics, ROUTER_COUNTERS)
        t0 = time.perf_counter()

        async def timed(i, req):
            delay = t0 + req["offset_s"] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            return await send(session, urls[i % len(urls)], args.model, req, t0)

        records = await asyncio.gather(*(timed(i, r) for i, r in enumerate(requests)))
        duration = time.perf_counter() - t0
        after = await scrape(session, replica_metrics, REPLICA_COUNTERS)
        router_after = await scrape(session, router_metrics, ROUTER_COUNTERS)
    router = {}
    for url in router_metrics:
        for k, v in router_after[url].items():
            router[k] = router.get(k, 0) + v - router_before[url].get(k, 0)
    result = {"pipeline": args.pipeline, "producer": args.producer, "seed": args.seed,
              "routers": len(urls), "duration_s": duration,
              "records": records,
              "replicas": {u: {k: after[u].get(k, 0) - v for k, v in before[u].items()}
                           | {k: v for k, v in after[u].items() if k not in before[u]}
                           for u in replica_metrics},
              "router": router}
    with open(args.out, "w") as f:
        json.dump(result, f)
    done = sum(1 for r in records if r.get("status") == 200 and "error" not in r)
    print("  %-22s %d/%d ok in %.1f s" % (args.pipeline, done, len(records), duration),
          file=sys.stderr)


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(p / 100.0 * (len(values) - 1)))))
    return values[k]


def report(files):
    print("| pipeline | hit rate | TTFT p50 / p90 / p99 ms | end-to-end p50 / p99 s | "
          "predicted / cached / correct tokens (scorer's producer) | precision / recall | "
          "requests per replica | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for path in files:
        with open(path) as f:
            doc = json.load(f)
        ok = [r for r in doc["records"] if r.get("status") == 200 and "error" not in r]
        errors = len(doc["records"]) - len(ok)
        queries = sum(v for m in doc["replicas"].values() for k, v in m.items()
                      if k.startswith("vllm:prefix_cache_queries_total"))
        hits = sum(v for m in doc["replicas"].values() for k, v in m.items()
                   if k.startswith("vllm:prefix_cache_hits_total"))
        ttft = [r["ttft_s"] * 1000 for r in ok if "ttft_s" in r]
        e2e = [r["e2e_s"] for r in ok]
        per = {}
        for r in ok:
            per[r.get("replica")] = per.get(r.get("replica"), 0) + 1
        # The prediction counters of the producer the prefix scorer reads.
        producer = doc.get("producer", "")
        sums = {}
        for key, value in doc["router"].items():
            name = key.split("{", 1)[0]
            if 'producer="%s"' % producer in key:
                sums[name] = sums.get(name, 0) + value
        predicted = sums.get("switchyard_prefix_predicted_tokens_total", 0)
        cached = sums.get("switchyard_prefix_cached_tokens_total", 0)
        correct = sums.get("switchyard_prefix_correct_tokens_total", 0)
        precision = correct / predicted if predicted else float("nan")
        recall = correct / cached if cached else float("nan")
        print("| %s | %.1f%% | %.0f / %.0f / %.0f | %.2f / %.2f | %s / %s / %s (%s) | "
              "%.1f%% / %.1f%% | %d–%d | %d/%d |" % (
                  doc["pipeline"] + (", %d routers" % doc["routers"]
                                     if doc.get("routers", 1) > 1 else ""),
                  100.0 * hits / queries if queries else float("nan"),
                  pct(ttft, 50), pct(ttft, 90), pct(ttft, 99), pct(e2e, 50), pct(e2e, 99),
                  format(int(predicted), ","), format(int(cached), ","),
                  format(int(correct), ","), producer or "–",
                  100 * precision, 100 * recall,
                  min(per.values()) if per else 0, max(per.values()) if per else 0,
                  errors, len(doc["records"])))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--pipeline", required=True)
    r.add_argument("--url", required=True, help="the routers' completions URLs, comma-separated")
    r.add_argument("--router-metrics", required=True,
                   help="the routers' metrics URLs, comma-separated")
    r.add_argument("--replica-metrics", required=True)
    r.add_argument("--model", default="mock-model")
    r.add_argument("--producer", default="",
                   help="the producer whose predictions the table shows")
    r.add_argument("--out", required=True)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--tenants", type=int, default=120)
    r.add_argument("--prefix-tokens", type=int, default=2000)
    r.add_argument("--question-min", type=int, default=200)
    r.add_argument("--question-max", type=int, default=400)
    r.add_argument("--output-min", type=int, default=300)
    r.add_argument("--output-max", type=int, default=600)
    r.add_argument("--requests", type=int, default=600)
    r.add_argument("--rps", type=float, default=8.0)
    p = sub.add_parser("report")
    p.add_argument("files", nargs="+")
    args = parser.parse_args()
    if args.command == "run":
        asyncio.run(run(args))
    else:
        report(args.files)


if __name__ == "__main__":
    main()
