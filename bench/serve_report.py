"""The text report of `k25 bench serve`: what a run, a document QA run, a concurrency probe or a
sweep measured, as the lines the command prints (`--json` prints the report itself)."""

from bench.serve_stats import holds


def report_lines(report: dict) -> list[str]:
    head = f"model {report['model']} at {report['url']}, prompts {report['prompt_tokens'][0]}-{report['prompt_tokens'][1]} " \
           f"tokens, max_tokens {report['max_tokens'][0]}-{report['max_tokens'][1]}, seed {report['seed']}"
    if report["mode"] == "sweep":
        return [head, *_sweep_lines(report)]
    if report["mode"] == "stored-documents":
        return _stored_document_lines(report)
    if report["mode"] == "qps":
        what = f"Poisson arrivals at {report['qps']:g} QPS for {report['duration_s']:g} s"
    elif report["mode"] == "documents":
        what = (f"document QA: {report['documents']} documents of {report['document_tokens']} tokens, {report['questions']} "
                f"questions each (the prompt lengths above are the questions'), Poisson arrivals at {report['qps']:g} QPS")
    else:
        what = (f"{report['streams']} streams opened at once: {report['completed']} completed without error; "
                f"at most {report['peak_open']} open and {report['peak_streaming']} receiving tokens at one moment")
    return [head, what, *_summary_lines(report)]


def _ms(value: float | None) -> str:
    return f"{value:9.1f}" if value is not None else f"{'-':>9}"


def _summary_lines(s: dict) -> list[str]:
    lines = [
        f"requests      {s['requests']} sent, {s['completed']} completed, {s['failed']} failed ({s['errors_503']} of them 503)",
        f"throughput    {s['requests_per_s']:.2f} req/s, {s['output_tokens_per_s']:.1f} output tok/s "
        f"({s['output_tokens']} tokens in {s['wall_s']:.2f} s)",
        f"latency (ms)  {'p50':>9}{'p95':>9}{'p99':>9}{'mean':>9}{'max':>9}",
    ]
    share = s["cached_share"]
    lines.append(f"prefix cache  {share:.1%} of prompt tokens reported cached" if share is not None
                 else "prefix cache  the server reported no cached tokens (prompt_tokens_details)")
    if s.get("cached_share_by_tier"):
        lines.append("  by KV tier  " + ", ".join(f"{tier} {share:.1%}" for tier, share in s["cached_share_by_tier"].items()))
    if s.get("valid_share") is not None:
        lines.append(f"valid         {s['valid_share']:.1%} of the structured answers validate")
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "inter-token"), ("e2e_ms", "end-to-end"), ("send_lag_ms", "send lag")):
        stats = s[key]
        lines.append(f"  {name:12s}" + "".join(_ms(stats[k]) for k in ("p50", "p95", "p99", "mean", "max")))
    for kind, count in s["errors"].items():
        lines.append(f"error {kind:>8} x{count}: {s['error_examples'][kind]}")
    if s["cpu_ms_per_request"]:
        lines.append("CPU per request  " + ", ".join(f"{name} {_cpu_ms(ms)}" for name, ms in s["cpu_ms_per_request"].items()))
    return lines


def _cpu_ms(ms: float | None) -> str:
    return f"{ms:.1f} ms" if ms is not None else "-"


def _sweep_lines(report: dict) -> list[str]:
    limit = report["ttft_limit_ms"]
    watched = list(report["levels"][0]["cpu_ms_per_request"]) if report["levels"] else []
    lines = [f"sweep: Poisson arrivals for {report['duration_s']:g} s per level; held = no failure and p99 TTFT < {limit:g} ms"
             + (f"; CPU ms per completed request of {', '.join(watched)}" if watched else ""),
             f"{'QPS':>8}{'req/s':>9}{'TTFT p50':>10}{'p99 (ms)':>10}{'ITL p99':>9}{'failed':>8}{'503':>6}  held"
             + "".join(f"{name[:10]:>11}" for name in watched)]
    for level in report["levels"]:
        ttft = level["ttft_ms"]
        lines.append(f"{level['qps']:8g}{level['requests_per_s']:9.2f}{_ms(ttft['p50']):>10}{_ms(ttft['p99']):>10}"
                     f"{_ms(level['itl_ms']['p99'])}{level['failed']:8d}{level['errors_503']:6d}  "
                     f"{'yes' if holds(level, limit) else 'no ':4}"
                     + "".join(f"{_cpu_ms(ms):>11}" for ms in level["cpu_ms_per_request"].values()))
    best = report["highest_qps_held"]
    lines.append(f"highest QPS held at p99 TTFT < {limit:g} ms: " + (f"{best:g}" if best is not None else "none of these levels"))
    return lines


def _stored_document_lines(r: dict) -> list[str]:
    passages = r["passages_read"]
    warmed = " (warmed)" if r["warm"] else ""
    read = f", passages read {r['read']}" if r.get("read") else ""
    lines = [
        f"model {r['model']} at {r['url']}, seed {r['seed']}: {len(r['documents'])} stored documents{warmed}, "
        f"{r['questions']} questions each by id{read}, Poisson arrivals at {r['qps']:g} QPS",
        f"uploads       {r['upload_s']:.1f} s for all {len(r['documents'])}, one after another",
        f"questions     {r['requests']} asked, {r['completed']} answered, {r['failed']} failed",
        "passages read " + (f"{passages['mean']:.1f} per question ({passages['min']}-{passages['max']})"
                            if passages["mean"] is not None else "-"),
        "prefix cache  " + (f"{r['cached_share']:.1%} of prompt tokens cached; {r['questions_with_cache_hits']} of "
                            f"{r['completed']} questions found some" if r["cached_share"] is not None else "-"),
        f"latency (ms)  {'p50':>9}{'p95':>9}{'p99':>9}{'mean':>9}{'max':>9}",
    ]
    for key, name in (("latency_ms", "question"), ("first_question_ms", "first"), ("later_questions_ms", "later")):
        lines.append(f"  {name:12s}" + "".join(_ms(r[key][k]) for k in ("p50", "p95", "p99", "mean", "max")))
    if r["later_to_first_p50"] is not None:
        lines.append(f"later questions' p50 is {r['later_to_first_p50']:.2f}x the first questions'")
    for kind, count in r["errors"].items():
        lines.append(f"error {kind:>8} x{count}: {r['error_examples'][kind]}")
    return lines
