"""Every benchmark scenario by name, for ``bench/run.py``: the ones of
``scenarios.py`` and the ones in modules of their own, which take the
shared pieces (``Report``, ``target``, ...) from ``scenarios.py``."""

from __future__ import annotations

from collections.abc import Callable

import cluster_bench
import first_request
import floor_bench
import hits
import http2_bench
import mix_bench
import observe_bench
import scaling_bench
import scenarios
import sites_bench
import tunnel

SCENARIOS: dict[str, Callable[[scenarios.Bench], scenarios.Report]] = {
    "proxy": scenarios.scenario_proxy,
    "subs": scenarios.scenario_subs,
    "subs-synthetic": scenarios.scenario_subs_synthetic,
    "first": first_request.scenario_first_request,
    "stream": scenarios.scenario_stream,
    "slowclient": scenarios.scenario_slowclient,
    "cache": scenarios.scenario_cache,
    "workers": scenarios.scenario_workers,
    "urlmap": scenarios.scenario_urlmap,
    "adversarial": scenarios.scenario_adversarial,
    "compress": scenarios.scenario_compress,
    "tunnel": tunnel.scenario_tunnel,
    "compress-hits": hits.scenario_compressed_hits,
    "http2": http2_bench.scenario_http2,
    "cluster": cluster_bench.scenario_cluster,
    "sites": sites_bench.scenario_sites,
    "mix": mix_bench.scenario_mix,
    "scaling": scaling_bench.scenario_scaling,
    "floor": floor_bench.scenario_floor,
    "observe": observe_bench.scenario_observe,
    "transducer": scenarios.script_scenario("bench_transducer.py"),
    "urlmap-index": scenarios.script_scenario("bench_urlmap.py", ("--sizes", "100,10000")),
    "cache-store": scenarios.script_scenario("bench_cache_store.py", ("--rounds", "1")),
}
