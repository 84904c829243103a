"""``sloserve up``: the whole live stack on this machine, one process per service.

Redis at ``--redis-url``/``$REDIS_URL`` or an embedded one; perf-model; N
executor+scheduler pairs; the gateway (127.0.0.1:50051). Prints the
addresses and whether API keys are required, then supervises
(``supervisor.py``): a service whose process dies or that stops answering its
health check is restarted alone, with backoff (its scheduler state is in
Redis). It exits only on Ctrl-C or SIGTERM, shutting everything down.

It fails fast (``preflight.py``): a bad model, GPU, weights path, port or Redis URL is
one line naming the flag and exit 2, before anything starts; a service that
exits at start ends ``up`` with exit 1 and the last lines of that service's log.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from sloserve.deployment import Deployment
from sloserve.policies.flags import add_policy_flags
from sloserve.policies.flags import config_from_args as policy_config_from_args
from sloserve.services import admission_flags, deployment_flags
from sloserve.services.argtypes import number, redis_url
from sloserve.services.auth import API_KEYS_ENV, load_api_keys
from sloserve.services.preflight import check_up
from sloserve.services.stack import Stack, StackConfig, StartFailed, start_budget
from sloserve.services.supervisor import Policy, Supervisor
from sloserve.services.tls import TLS_CA_ENV, ServerTLS, check_bind
from sloserve.tenancy import KeyLimits

UNHEALTHY_S = 10.0
UNHEALTHY_REAL_S = 60.0
# the Deployment's flags here (tensor parallelism is simulated)
UP_FIELDS = ("policy", "instances", "hp_instances", "model", "gpu", "num_blocks",
             "prefix_caching", "prefix_routing", "overlap", "refit_interval", "ttft_slo",
             "tbt_slo", "seed", "noise_cv")


AT_LEAST_0, AT_LEAST_0F = number(int, 0, strict=False), number(float, 0, strict=False)
AT_LEAST_1 = number(int, 1, strict=False)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("up", help="start the live stack (gRPC services + Redis)")
    deployment_flags.add_flags(p, UP_FIELDS, zero_is_none=True)
    p.add_argument("--backend", default="sim", choices=("sim", "torch", "vllm"))
    p.add_argument("--weights", default=None,
                   help="torch: local checkpoint directory; vllm: a Hugging Face directory")
    p.add_argument("--host", default="127.0.0.1",
                   help="the gateway's address (the other services always bind 127.0.0.1)")
    p.add_argument("--port", type=int, default=50051, help="gateway port")
    p.add_argument("--tls-cert", default=None,
                   help="serve the gateway's gRPC and HTTPS ports with this PEM certificate "
                        "chain (with --tls-key; docs/deploy.md, TLS)")
    p.add_argument("--tls-key", default=None, help="the private key of --tls-cert (PEM)")
    p.add_argument("--tls-ca", default=None,
                   help=f"the CA that signed --tls-cert, for up's health checks of the gateway "
                        f"(default ${TLS_CA_ENV})")
    p.add_argument("--tls-internal-dir", default=None,
                   help="mutual TLS between the services: ca.pem and <service>.pem + "
                        "<service>-key.pem (<service>: gateway, scheduler, executor, "
                        "perfmodel, or a stack name such as scheduler-lp0; up: up.pem, "
                        "else gateway.pem)")
    p.add_argument("--insecure", action="store_true",
                   help="serve plaintext on a non-loopback --host (refused otherwise)")
    p.add_argument("--frontends", type=number(int, 1, strict=False), default=1, metavar="N",
                   help="frontend processes sharing the gateway's gRPC and HTTP ports "
                        "(SO_REUSEPORT); N > 1 adds a router holding the one controller "
                        "(docs/architecture.md, issue 33)")
    p.add_argument("--http-port", type=int, default=8000,
                   help="the gateway's OpenAI-compatible HTTP API (0: off)")
    p.add_argument("--tool-call-parser", default="", metavar="NAME",
                   help="vLLM's tool parser for tool_choice auto, as vllm serve's flag "
                        "(SmolLM2: hermes; default: none, auto is refused)")
    p.add_argument("--stream-interval", type=AT_LEAST_1, default=1, metavar="N",
                   help="vLLM's stream_interval: after its first token, a stream's tokens leave "
                        "every N tokens (and at its end) in one message, and each scheduler "
                        "sends a frontend its tokens every N iterations (a first or last token "
                        "at once); each keeps its time (default 1, vLLM's)")
    p.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error"),
                   help="every service's log level (default $SLOSERVE_LOG_LEVEL, else info)")
    p.add_argument("--redis-url", default=None, type=redis_url,
                   help="redis://, rediss:// or redis+sentinel://HOST:PORT[,HOST:PORT...]"
                   "/MASTER_NAME/DB; default $REDIS_URL, else embedded")
    p.add_argument("--prefix", default="", help="Redis key prefix (default sloserve:<random>)")
    p.add_argument("--dtype", default=None,
                   help="torch/vllm executors: float32 | bfloat16 | float16 (default: backend's)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="vllm executors: run the model eagerly (default: compiled, as stock "
                        "vllm serve; eager starts faster, its steps are slower)")
    p.add_argument("--log-dir", default=None, help="service logs (default: a temp dir)")
    p.add_argument("--api-key-file", default=None,
                   help=f"gateway API keys, one per line (also ${API_KEYS_ENV}); "
                        "none configured: auth off")
    p.add_argument("--max-inflight-per-key", type=AT_LEAST_0,
                   default=0, metavar="N",
                   help="gateway: requests one API key may have in flight (0: no bound)")
    p.add_argument("--key-token-rate", type=AT_LEAST_0F,
                   default=0.0, metavar="TOKENS_PER_S",
                   help="gateway: each API key's token bucket over prompt + max_tokens (0: off)")
    p.add_argument("--key-token-burst", type=AT_LEAST_0F,
                   default=0.0, metavar="TOKENS",
                   help="gateway: the bucket's depth (0: 10 s of the rate)")
    p.add_argument("--unhealthy-after", type=float, default=None,
                   help="restart a live service whose health check fails this long, s "
                        f"(default {UNHEALTHY_S:.0f}; torch/vllm {UNHEALTHY_REAL_S:.0f}: their "
                        "executors compute on the event loop, a long batch delays the answer)")
    admission_flags.add_flags(p)
    add_policy_flags(p)


def config_from_args(args: argparse.Namespace) -> StackConfig:
    """The Deployment from the same generated flags as ``sloserve simulate`` (policy knobs
    included) + the processes that run it."""
    dep = deployment_flags.deployment_from_args(
        args, Deployment(), policy_config=policy_config_from_args(args.policy or "sarathi",
                                                                  args))
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="sloserve-"))
    cfg = StackConfig(
        **deployment_flags.field_values(dep, admission=admission_flags.limits_from_args(args)),
        backend=args.backend, weights=args.weights,
        host=args.host, gateway_port=args.port, redis_url=args.redis_url, prefix=args.prefix,
        log_dir=log_dir, dtype=args.dtype, enforce_eager=args.enforce_eager,
        api_key_file=args.api_key_file,
        key_limits=KeyLimits(args.max_inflight_per_key, args.key_token_rate,
                             args.key_token_burst),
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
        tls_internal_dir=args.tls_internal_dir,
        http_port=args.http_port, metrics=True, log_level=args.log_level,
        tool_call_parser=args.tool_call_parser,
        frontends=args.frontends,
        stream_interval=args.stream_interval,
    )
    cfg.validate()
    return cfg


def _masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***`` (any scheme, also a
    sentinel URL's list of hosts)."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if not (sep and at and colon and password):
        return url
    return f"{scheme}://{user}:***@{hosts}{slash}{path}"


def slo_defaults(ttft: float | None, tbt: float | None) -> str:
    """The SLO defaults line ``up`` prints (issue 35): what a request without its own gets,
    and that they are never a reason to shed it."""
    given = ", ".join(f"{k} {v:g} s" for k, v in (("TTFT", ttft), ("TBT", tbt)) if v)
    if not given:
        return "defaults none (--ttft-slo/--tbt-slo 0): requests carry their own"
    return (f"defaults {given} (--ttft-slo/--tbt-slo) for requests without their own; "
            "never a reason to shed them")


def run(args: argparse.Namespace) -> int:
    if args.unhealthy_after is not None and not args.unhealthy_after > 0:
        raise ValueError(f"--unhealthy-after: must be > 0, got {args.unhealthy_after}")
    keys = load_api_keys(args.api_key_file)  # a bad file: one line, nothing started
    tls = ServerTLS.from_args(args.tls_cert, args.tls_key)  # so are bad certificate files
    check_bind(args.host, tls=tls is not None, insecure=args.insecure)
    d = Deployment()  # the flags left unset: its defaults
    check_up(args.backend, args.model or d.model, args.gpu or d.gpu, args.weights,  # 1 line,
             args.redis_url,  # exit 2
             port=args.port, http_port=args.http_port, host=args.host, dtype=args.dtype,
             executors=args.instances or d.instances)
    cfg = config_from_args(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack = Stack(cfg)
    start_s = start_budget(cfg.backend)
    unhealthy_s = args.unhealthy_after or (UNHEALTHY_S if cfg.backend == "sim"
                                           else UNHEALTHY_REAL_S)
    supervisor: Supervisor | None = None
    try:
        print(f"starting   {cfg.backend} backend, {cfg.model} on {cfg.gpu}, policy "
              f"{cfg.policy}; logs {cfg.log_dir}", flush=True)
        try:
            stack.start(progress=lambda line: print(line, flush=True))
        except StartFailed as exc:  # its own words, not a traceback through ours
            print(f"sloserve up: error: {exc}", file=sys.stderr)
            for line in exc.tail:
                print(f"  | {line}", file=sys.stderr)
            return 1
        print(f"redis      {_masked(stack.redis_url)}{' (embedded)' if stack.embedded else ''}"
              f"  prefix {stack.prefix}")
        for name, svc in stack.services.items():
            print(f"{name:<16} {svc.address}  metrics http://{svc.metrics}/metrics")
        if stack.http:
            print(f"openai api       {stack.http}/v1  (and {stack.http}/metrics)")
        inner = f"mutual TLS ({cfg.tls_internal_dir})" if cfg.tls_internal_dir else "plaintext"
        print(f"tls        public {f'on ({cfg.tls_cert})' if cfg.tls_cert else 'off'}; "
              f"internal plane {inner}")
        print(f"logs       {cfg.log_dir}")
        print(f"slo        {slo_defaults(cfg.ttft_slo, cfg.tbt_slo)}")
        print(f"auth       API keys required ({len(keys)} configured)" if keys else
              f"auth       off: no API keys (${API_KEYS_ENV} or --api-key-file), "
              "every client is served")
        print(f"gateway ready on {stack.gateway} (Ctrl-C to stop)", flush=True)
        supervisor = Supervisor(stack, Policy(unhealthy_s=unhealthy_s, start_s=start_s)).start()
        while not stop.wait(1.0):
            pass
    finally:
        if supervisor is not None:
            supervisor.stop()
        stack.stop()
        print("stopped", flush=True)
    return 0
