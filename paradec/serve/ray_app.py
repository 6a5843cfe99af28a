"""``paradec serve --replicas N``: N engine replicas behind Ray Serve's HTTP proxy, with the same
OpenAI routes. Each replica is one process with its own model, KV cache and continuous-batching
worker; Ray Serve spreads requests over them. ``--ray-address`` joins an existing cluster
(``ray start --head`` on one node, ``ray start --address HEAD:6379`` on the others); without it
a local Ray instance is started that talks over loopback only.
"""

from __future__ import annotations

import os
import signal
import time


def deployment(load_options: dict, model_name: str, replicas: int, replica_cpus: float, **app_options):
    """The Ray Serve application: a deployment whose ASGI app is built on each replica (the
    model is loaded there, not pickled from the driver)."""
    from ray import serve

    def build():
        from paradec.engine import load
        from paradec.serve import build_app

        app = build_app(load(**load_options), model_name, **app_options)
        app.state.worker.start()  # whether or not the proxy runs the app's lifespan
        return app

    replica = serve.deployment(serve.ingress(build)(), name="paradec")
    return replica.options(num_replicas=replicas, ray_actor_options={"num_cpus": replica_cpus}).bind()


def start(
    load_options: dict,
    model_name: str,
    replicas: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    ray_address: str | None = None,
    replica_cpus: float | None = None,
    temp_dir: str | None = None,
    **app_options,
) -> None:
    """Start Ray (or join ``ray_address``) and deploy; returns once the replicas serve."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    if ray_address:
        ray.init(address=ray_address)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(
            _node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=temp_dir, object_store_memory=100 * 2**20
        )
    cpus = (
        replica_cpus
        if replica_cpus is not None
        else max(0.1, min(1.0, ray.cluster_resources().get("CPU", 1) / (replicas + 1)))
    )
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(load_options, model_name, replicas, cpus, **app_options), name="paradec", route_prefix="/")


def stop() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def run(load_options: dict, model_name: str, replicas: int, **options) -> None:
    """``start``, then serve until SIGINT/SIGTERM; Serve and Ray are shut down on the way out
    (a killed driver would leave Ray's processes behind)."""

    def _term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        start(load_options, model_name, replicas, **options)
        print(f"paradec: {replicas} replicas serving {model_name} on Ray Serve", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stop()
