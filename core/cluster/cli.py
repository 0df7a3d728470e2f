"""``qwen-serve ray [server flags] [--replicas N] [--cpus-per-replica C] [--address ADDR]
[--router affinity|round-robin|default]``: the OpenAI server on Ray Serve.

It connects to a running cluster (``--address``, e.g. what ``ray start --head`` printed, or
``auto``) or starts a local one sized for the replicas, deploys the application
(qwen_serve.cluster.deploy), prints the URL and serves until SIGINT/SIGTERM; then it deletes
its application and, for a local cluster, stops the processes it started. Flag errors are one
line and exit code 2, before Ray starts.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import threading
from typing import Sequence

from ..config import EngineConfig
from ..errors import QwenServeError
from ..server import cli as server_cli
from .spec import ROUTERS, ClusterSpec, cluster_spec

LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # only small messages travel through it


def build_parser() -> argparse.ArgumentParser:
    p = server_cli.build_parser()
    p.prog = "qwen-serve ray"
    p.description = "Serve a Qwen3-family model from N engine replicas on Ray Serve, one OpenAI endpoint."
    g = p.add_argument_group("Ray Serve")
    g.add_argument("--replicas", type=int, default=2, help="engine replicas (default: 2)")
    g.add_argument("--cpus-per-replica", type=float, default=1.0,
                   help="Ray CPUs reserved for each engine replica, fractions allowed (default: 1)")
    g.add_argument("--threads-per-replica", type=int, default=None,
                   help="torch threads of each replica (default: its whole CPUs, at least 1)")
    g.add_argument("--address", default=None,
                   help="Ray cluster to join (host:port from `ray start --head`, or auto); default: start a local one")
    g.add_argument("--router", default="affinity", choices=ROUTERS,
                   help="request routing: affinity (prefix-cache aware), round-robin, or default (Ray's power of two "
                        "choices)")
    g.add_argument("--imbalance-threshold", type=int, default=None,
                   help="affinity yields to the least-loaded replica when requests in flight differ by more "
                        "(default: --max-batch)")
    g.add_argument("--app-name", default="qwen-serve", help="Ray Serve application name")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        spec = check(args)
        return run(spec, args.address)
    except (QwenServeError, ValueError) as exc:
        print(f"qwen-serve ray: error: {exc}", file=sys.stderr)
        return 2


def check(args: argparse.Namespace) -> ClusterSpec:
    """Every name and number, before anything starts (a typo fails in milliseconds)."""
    from ..chat.format import check_parser_names
    from ..checkpoints.checkpoint import load_checkpoint
    from ..checkpoints.default_model import default_model_path
    from ..registry import load_registry

    if args.prompt is not None:
        raise QwenServeError("--prompt answers in process; run it without the ray command")
    check_parser_names(args.reasoning_parser, args.tool_call_parser)
    options = server_cli.engine_options(args)
    serving = server_cli.serve_settings(args, EngineConfig(**options))  # a bad number raises ValueError
    if serving.queue_timeout_s is not None:
        raise QwenServeError("--queue-timeout is not supported by the ray command yet")
    # admission counts the whole cluster's batch slots
    server = dataclasses.replace(serving.options, max_batch=serving.options.max_batch * max(1, args.replicas))
    spec = cluster_spec(args, options, server)
    registry = load_registry()
    registry.kv_cache_factory(spec.model.kv_cache)
    registry.backend(spec.model.backend)
    load_checkpoint(spec.model.model if spec.model.model is not None else default_model_path())  # no weights read
    try:
        import ray.serve  # noqa: F401
    except ImportError as exc:
        raise QwenServeError(f"Ray Serve is not installed ({exc.name}): pip install 'qwen-serve[ray]'") from exc
    return spec


def first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def this_node_resource() -> str:
    """Ray's ``node:<ip>`` resource of the node this process runs on."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    return next(name for name in node["Resources"] if name.startswith("node:") and not name.startswith("node:__"))


def run(spec: ClusterSpec, address: str | None) -> int:
    import ray
    from ray import serve

    from .deploy import build_app

    local = address is None
    needed = math.ceil(spec.replicas * spec.cpus_per_replica)
    sizes = dict(num_cpus=max(os.cpu_count() or 1, needed), object_store_memory=LOCAL_OBJECT_STORE_BYTES)
    try:
        ray.init(address=address, include_dashboard=False, configure_logging=False, log_to_driver=True,
                 **(sizes if local else {}))
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise QwenServeError(f"cannot {'start a local Ray cluster' if local else 'join ' + address}: "
                             f"{first_line(exc)}") from exc
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve.start(proxy_location="Disabled")
        try:
            serve.run(build_app(spec, this_node_resource()), name=spec.app_name, route_prefix=None)
        except Exception as exc:  # a replica failed to start (its log is above): one line, exit code 2
            raise QwenServeError(f"deploying {spec.app_name!r} failed: {first_line(exc)}") from exc
        host = f"[{spec.host}]" if ":" in spec.host else spec.host
        url = f"http://{host}:{spec.port}"
        print(f"serving {spec.replicas} replicas ({spec.router} routing) on {url} (OpenAI API at {url}/v1, "
              f"cluster figures at {url}/metrics/cluster)", file=sys.stderr, flush=True)
        while not stop.wait(timeout=1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        try:
            if local:
                serve.shutdown()
            else:
                serve.delete(spec.app_name)
        finally:
            ray.shutdown()
    return 0
